package egress

import (
	"fmt"
	"net/netip"
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
	{netip.MustParsePrefix("192.168.0.0/16"), "private address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking (198.18.0.0/15) address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast address"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (240.0.0.0/4) address"},

	{netip.MustParsePrefix("::/128"), "unspecified address"},
	{netip.MustParsePrefix("::1/128"), "loopback address"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible IPv6 (::/96) address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64 (64:ff9b:1::/48) address"},
	{netip.MustParsePrefix("100::/64"), "discard-only (100::/64) address"},
	{netip.MustParsePrefix("2001::/32"), "Teredo (2001::/32) address"},
	{netip.MustParsePrefix("fc00::/7"), "private (unique local) address"},
	{netip.MustParsePrefix("fe80::/10"), "link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "multicast address"},
}

var (
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour   = netip.MustParsePrefix("2002::/16")
)

// checkAddr returns "" when a may be dialled, else the reason it may not,
// as a phrase starting with the address ("10.0.0.5 is a private address").
// allow lists the administrator's exemptions (Config.AllowPrivate).
func checkAddr(a netip.Addr, allow []netip.Prefix) string {
	if !a.IsValid() {
		return "invalid address"
	}
	if a.Zone() != "" {
		return fmt.Sprintf("%s has an IPv6 zone", a)
	}
	a = a.Unmap()
	if what := classify(a, allow); what != "" {
		return fmt.Sprintf("%s is a %s", a, what)
	}
	return ""
}

// classify returns what kind of forbidden address a (unmapped, no zone) is,
// or "" when it may be dialled.
func classify(a netip.Addr, allow []netip.Prefix) string {
	for _, m := range metadataAddrs {
		if a != m {
			continue
		}
		for _, p := range allow {
			if p.IsSingleIP() && p.Addr() == a {
				return ""
			}
		}
		if a.Is4() && a.IsLinkLocalUnicast() {
			return "link-local/cloud-metadata address"
		}
		return "cloud-metadata address"
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
	if what := classify(v4, allow); what != "" {
		return fmt.Sprintf("%s address for %s, a %s", kind, v4, what)
	}
	return ""
}

// normPrefix returns p masked, with an IPv4-mapped IPv6 prefix turned into
// its IPv4 form so that it matches unmapped addresses.
func normPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}
