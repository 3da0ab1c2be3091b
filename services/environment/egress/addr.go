package egress

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// addrRange is one range the address checks refuse, with the words that
// finish the sentence "<addr> is a ...".
type addrRange struct {
	prefix netip.Prefix
	what   string
}

// metadataAddrs are the cloud instance-metadata endpoints. They are refused
// even inside an AllowPrivate prefix unless that prefix is the single
// address itself: allowing 169.254.0.0/16 for a link-local service must not
// open the metadata endpoint by accident.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, ...
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
}

// forbiddenRanges are checked in order; the first containing range names
// the reason. More specific ranges come before the ranges containing them.
var forbiddenRanges = []addrRange{
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local/cloud-metadata address"},
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified (0.0.0.0/8) address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT (100.64.0.0/10) address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback address"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignment (192.0.0.0/24) address"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation (192.0.2.0/24) address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking (198.18.0.0/15) address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation (198.51.100.0/24) address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation (203.0.113.0/24) address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast address"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (240.0.0.0/4) address"},

	{netip.MustParsePrefix("::/128"), "unspecified address"},
	{netip.MustParsePrefix("::1/128"), "loopback address"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible IPv6 (::/96) address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64 (64:ff9b:1::/48) address"},
	{netip.MustParsePrefix("100::/64"), "discard-only (100::/64) address"},
	{netip.MustParsePrefix("2001::/32"), "Teredo (2001::/32) address"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation (2001:db8::/32) address"},
	{netip.MustParsePrefix("fc00::/7"), "private (unique local) address"},
	{netip.MustParsePrefix("fe80::/10"), "link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "multicast address"},
}

// hostAddrWhat finishes "<addr> is a ..." for an address of this host.
const hostAddrWhat = "local address of this host (assigned to one of its network interfaces)"

var (
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour   = netip.MustParsePrefix("2002::/16")
)

// checkAddr returns "" when a may be dialled, else the reason it may not,
// as a phrase starting with the address ("10.0.0.5 is a private address").
// allow lists the administrator's exemptions (Config.AllowPrivate); host
// holds this host's own non-loopback addresses (see hostAddrs).
func checkAddr(a netip.Addr, allow []netip.Prefix, host map[netip.Addr]bool) string {
	if what := addrWhat(a, allow, host); what != "" {
		return fmt.Sprintf("%s is a %s", a.Unmap(), what)
	}
	return ""
}

// addrWhat is checkAddr without the address: "" or what kind of forbidden
// address a is ("private address").
func addrWhat(a netip.Addr, allow []netip.Prefix, host map[netip.Addr]bool) string {
	switch {
	case !a.IsValid():
		return "malformed address"
	case a.Zone() != "":
		return "zoned IPv6 address"
	}
	return classify(a.Unmap(), allow, host)
}

// classify returns what kind of forbidden address a (unmapped, no zone) is,
// or "" when it may be dialled.
//
// The cloud-metadata endpoints and this host's own addresses are only
// exempted by an AllowPrivate prefix that is the single address itself:
// opening 10.0.0.0/8 to reach internal services must not open the
// environment service's own host, which usually sits in that range. The
// host's loopback addresses are not in host: the loopback ranges refuse
// them, and an administrator who opens a loopback range has opened this
// host deliberately.
func classify(a netip.Addr, allow []netip.Prefix, host map[netip.Addr]bool) string {
	for _, m := range metadataAddrs {
		if a != m {
			continue
		}
		if exactlyAllowed(a, allow) {
			return ""
		}
		if a.Is4() && a.IsLinkLocalUnicast() {
			return "link-local/cloud-metadata address"
		}
		return "cloud-metadata address"
	}
	if host[a] && !exactlyAllowed(a, allow) {
		return hostAddrWhat
	}
	for _, p := range allow {
		if p.Contains(a) {
			return ""
		}
	}
	for _, r := range forbiddenRanges {
		if r.prefix.Contains(a) {
			return r.what
		}
	}
	// IPv6 forms that embed an IPv4 destination reached through a
	// translator are judged by the embedded address.
	b := a.As16()
	var v4 netip.Addr
	var kind string
	switch {
	case nat64Prefix.Contains(a):
		v4, kind = netip.AddrFrom4([4]byte(b[12:16])), "NAT64"
	case sixToFour.Contains(a):
		v4, kind = netip.AddrFrom4([4]byte(b[2:6])), "6to4"
	default:
		return ""
	}
	if what := classify(v4, allow, host); what != "" {
		return fmt.Sprintf("%s address embedding a %s", kind, what)
	}
	return ""
}

// exactlyAllowed reports whether allow holds a as a single-address prefix.
func exactlyAllowed(a netip.Addr, allow []netip.Prefix) bool {
	for _, p := range allow {
		if p.IsSingleIP() && p.Addr() == a {
			return true
		}
	}
	return false
}

// normPrefix returns p masked, with an IPv4-mapped IPv6 prefix turned into
// its IPv4 form so that it matches unmapped addresses.
func normPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// hostAddrTTL is how long a reading of the host's interface addresses is
// used before it is read again.
//
// Reading them (net.InterfaceAddrs: two netlink dumps on Linux) costs about
// 0.1 ms with a handful of interfaces and grows with their number (a node
// with hundreds of veth pairs), so it is not done for every request. An
// address added to the host is refused at most this long after it
// appears; within that window the check after connecting (dialTarget: a
// connection whose local and remote addresses are equal went to this host)
// still refuses it. Watching netlink for changes would be exact but
// Linux-only and a goroutine per proxy; a second is short enough.
const hostAddrTTL = time.Second

// hostAddrs caches the addresses assigned to this host's network
// interfaces, loopback addresses excepted. Safe for concurrent use.
type hostAddrs struct {
	mu   sync.Mutex
	read func() ([]netip.Addr, error) // interfaceAddrs; tests replace it
	at   time.Time                    // when set and err were read
	set  map[netip.Addr]bool          // never modified once stored
	err  error
}

// get returns the host's addresses, read again when the last reading is
// older than hostAddrTTL. A failed reading is an error for hostAddrTTL
// too: the caller refuses every destination rather than guess.
func (h *hostAddrs) get() (map[netip.Addr]bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.at.IsZero() || time.Since(h.at) >= hostAddrTTL {
		read := h.read
		if read == nil {
			read = interfaceAddrs
		}
		addrs, err := read()
		set := make(map[netip.Addr]bool, len(addrs))
		for _, a := range addrs {
			set[a.Unmap().WithZone("")] = true
		}
		h.set, h.err, h.at = set, err, time.Now()
	}
	return h.set, h.err
}

// interfaceAddrs returns the non-loopback addresses of this host's
// network interfaces.
func interfaceAddrs() ([]netip.Addr, error) {
	list, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing this host's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range list {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if addr, ok := netip.AddrFromSlice(ip); ok && !addr.Unmap().IsLoopback() {
			out = append(out, addr.Unmap())
		}
	}
	return out, nil
}
