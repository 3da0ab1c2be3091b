package egress

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/secbear/neuron/services/environment/scrub"
)

// The tests in this file hold the three guarantees of "isolation that
// holds": no name reaches the resolver unless the policy could allow it by
// name; this host's own addresses (and the documentation ranges, see
// TestAddressChecksOverHTTP and TestCheckAddr) are refused; and nothing
// the client chose reaches the logs as it is, secrets least of all.

// requests returns the three ways a client names hostport: CONNECT, an
// absolute-form and an origin-form plain request.
func requests(hostport string) []string {
	return []string{
		"CONNECT " + hostport + " HTTP/1.1\r\nHost: " + hostport + "\r\n\r\n",
		"GET http://" + hostport + "/x HTTP/1.1\r\nHost: " + hostport + "\r\n\r\n",
		"GET /x HTTP/1.1\r\nHost: " + hostport + "\r\n\r\n",
	}
}

func TestNamesResolvedOnlyWhenAllowedByName(t *testing.T) {
	cidr := func(s string, allow bool) Rule { return Rule{Prefix: netip.MustParsePrefix(s), Allow: allow} }
	name := func(s string, port uint32, allow bool) Rule { return Rule{Host: s, Port: port, Allow: allow} }
	tests := []struct {
		name     string
		policy   Policy
		hostport string
		lookup   bool   // the name must be resolved (else it must not)
		reason   string // substring of the 403 reason
	}{
		// Refused unresolved.
		{"default deny", Policy{}, "s3cr3t.attacker.test:443", false,
			"s3cr3t.attacker.test:443 is not allowed by the egress policy (no rule matches; default deny)"},
		{"only CIDR allow rules", Policy{Rules: []Rule{cidr("93.184.216.0/24", true)}}, "s3cr3t.attacker.test:443", false,
			"names are not resolved to be matched against address rules: use an IP literal, or allow the name"},
		{"CIDR rules allowing everything", Policy{Rules: []Rule{cidr("0.0.0.0/0", true), cidr("::/0", true)}}, "s3cr3t.attacker.test:80", false,
			"use an IP literal, or allow the name"},
		{"name deny rule under default allow", Policy{Rules: []Rule{name("*.attacker.test", 0, false)}, DefaultAllow: true}, "s3cr3t.attacker.test:443", false,
			"is denied by rule 1 (deny *.attacker.test)"},
		{"name deny after a CIDR allow", Policy{Rules: []Rule{cidr("0.0.0.0/0", true), name("*.attacker.test", 0, false)}, DefaultAllow: true}, "s3cr3t.attacker.test:443", false,
			"is denied by rule 2 (deny *.attacker.test)"},
		{"exact deny before a wildcard allow", Policy{Rules: []Rule{name("bad.example.test", 0, false), name("*.example.test", 0, true)}}, "bad.example.test:443", false,
			"is denied by rule 1 (deny bad.example.test)"},
		{"wildcard excludes its apex", Policy{Rules: []Rule{name("*.example.test", 0, true)}}, "example.test:443", false, "default deny"},
		{"wildcard suffix is label-aligned", Policy{Rules: []Rule{name("*.example.test", 0, true)}}, "s3cr3texample.test:443", false, "default deny"},
		{"wildcard domain as a subdomain of another", Policy{Rules: []Rule{name("*.example.test", 0, true)}}, "a.example.test.attacker.test:443", false, "default deny"},
		{"name allowed on another port", Policy{Rules: []Rule{name("api.example.test", 443, true)}}, "api.example.test:80", false, "default deny"},
		{"CIDR deny, default deny", Policy{Rules: []Rule{cidr("10.0.0.0/8", false)}}, "s3cr3t.attacker.test:443", false, "default deny"},

		// Resolved: the policy allows the name by name. The fake resolver
		// answers a private address, so each is then refused by the
		// address checks, after the lookup.
		{"wildcard allow", Policy{Rules: []Rule{name("*.example.test", 0, true)}}, "a.example.test:443", true,
			"a.example.test resolves to a private address"},
		{"exact allow on its port", Policy{Rules: []Rule{name("api.example.test", 443, true)}}, "api.example.test:443", true,
			"api.example.test resolves to a private address"},
		{"default allow", Policy{DefaultAllow: true}, "any.test:443", true, "any.test resolves to a private address"},
		{"default allow beside CIDR allow rules", Policy{Rules: []Rule{cidr("93.184.216.0/24", true)}, DefaultAllow: true}, "any.test:443", true,
			"any.test resolves to a private address"},
		{"CIDR deny before a name allow", Policy{Rules: []Rule{cidr("10.0.0.0/8", false), name("*.example.test", 0, true)}}, "a.example.test:443", true,
			"a.example.test:443 is denied by rule 1 (deny 10.0.0.0/8)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host, _, _ := net.SplitHostPort(tc.hostport)
			res := newResolver(map[string]string{host: "10.0.0.5"})
			r := startProxy(t, Config{Policy: tc.policy, Resolver: res})
			for _, req := range requests(tc.hostport) {
				resp, body := r.raw(t, req)
				if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, tc.reason) {
					t.Errorf("%.40q: got %d %q, want 403 with %q", req, resp.StatusCode, body, tc.reason)
				}
				if strings.Contains(body, "10.0.0.5") || strings.Contains(body, fakeDNSServer) {
					t.Errorf("%.40q: the reply reveals resolution details: %q", req, body)
				}
			}
			got := res.lookups()
			switch {
			case !tc.lookup && len(got) != 0:
				t.Errorf("looked up %q; a name the policy cannot allow by name must not reach the resolver", got)
			case tc.lookup && (len(got) != 3 || got[0] != host):
				t.Errorf("looked up %q, want %s once per request", got, host)
			}
		})
	}
}

// The resolver is behind a second lock: a name decide did not clear is
// never looked up, whoever asks.
func TestResolveRefusesUnclearedNames(t *testing.T) {
	res := newResolver(map[string]string{"x.test": "93.184.216.34"})
	p, err := New(Config{Policy: Policy{DefaultAllow: true}, Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	tg, _ := p.parseTarget("x.test:443", 0)
	if _, err := p.resolve(t.Context(), tg); !errors.Is(err, errNoLookup) {
		t.Errorf("resolve before decide: %v, want errNoLookup", err)
	}
	if ref, err := p.check(t.Context(), tg); ref != nil || !errors.Is(err, errNoLookup) {
		t.Errorf("check before decide: %+v, %v; want errNoLookup", ref, err)
	}
	if got := res.lookups(); len(got) != 0 {
		t.Errorf("looked up %q", got)
	}
	if ref, err := p.decide(t.Context(), tg); ref != nil || err != nil || !tg.lookup {
		t.Fatalf("decide under default allow: %+v, %v, cleared %v", ref, err, tg.lookup)
	}
	if addrs, err := p.resolve(t.Context(), tg); err != nil || len(addrs) != 1 {
		t.Errorf("resolve after decide cleared it: %v, %v", addrs, err)
	}
}

func TestResolutionAndDialErrorsHideDetails(t *testing.T) {
	closed := freeLoopbackPort(t)
	r := startProxy(t, Config{
		Policy:       Policy{Rules: []Rule{{Host: "*.example.test", Allow: true}}},
		Resolver:     newResolver(map[string]string{"closed.example.test": "127.0.0.1"}),
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
	})
	for _, req := range requests("nx.example.test:443") {
		resp, body := r.raw(t, req)
		if resp.StatusCode != http.StatusBadGateway || body != "egress: cannot resolve nx.example.test\n" {
			t.Errorf("%.40q: got %d %q, want 502 naming only the host", req, resp.StatusCode, body)
		}
	}
	for i, req := range requests("closed.example.test:" + closed) {
		resp, body := r.raw(t, req)
		want := "egress: cannot connect to closed.example.test:" + closed + ": connection refused\n"
		if i > 0 {
			want = "egress: upstream closed.example.test:" + closed + " failed: connection refused\n"
		}
		if resp.StatusCode != http.StatusBadGateway || body != want {
			t.Errorf("%.40q: got %d %q, want 502 %q", req, resp.StatusCode, body, want)
		}
	}
	logs := r.logs.String()
	// The administrator gets the resolver's verdict and address; the
	// client-chosen labels stay out.
	if !strings.Contains(logs, "dns: no such host (server "+fakeDNSServer+")") || strings.Contains(logs, "nx.example.test") {
		t.Errorf("resolution failures not logged as the resolver's verdict without the name:\n%s", logs)
	}
}

// freeLoopbackPort returns a loopback TCP port nothing listens on.
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	return port
}

// ownAddr returns an address assigned to one of this host's non-loopback
// interfaces that a listener can bind (IPv4 first; no link-local IPv6,
// which needs a zone), and the interface's network. It skips the test when
// there is none.
func ownAddr(t *testing.T) (netip.Addr, netip.Prefix) {
	t.Helper()
	list, err := net.InterfaceAddrs()
	if err != nil {
		t.Skipf("cannot list this host's addresses: %v", err)
	}
	var v6 []*net.IPNet
	for _, a := range list {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		ip = ip.Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() {
			continue
		}
		if ip.Is4() {
			ones, _ := n.Mask.Size()
			return ip, netip.PrefixFrom(ip, ones).Masked()
		}
		v6 = append(v6, n)
	}
	if len(v6) > 0 {
		ip, _ := netip.AddrFromSlice(v6[0].IP)
		ones, _ := v6[0].Mask.Size()
		return ip, netip.PrefixFrom(ip, ones).Masked()
	}
	t.Skip("this host has no non-loopback address to test against")
	return netip.Addr{}, netip.Prefix{}
}

// ownServer is an HTTP server on one of this host's own addresses that
// counts the connections it accepts and the requests it serves.
type ownServer struct {
	addr     netip.Addr
	network  netip.Prefix
	port     string
	conns    atomic.Int32
	requests atomic.Int32
}

func startOwnServer(t *testing.T) *ownServer {
	t.Helper()
	a, network := ownAddr(t)
	l, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
	if err != nil {
		t.Skipf("cannot listen on this host's address %s: %v", a, err)
	}
	s := &ownServer{addr: a, network: network}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		io.WriteString(w, "host service reached")
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	_, s.port, _ = net.SplitHostPort(l.Addr().String())
	return s
}

// hostport renders the server's address as a client writes it.
func (s *ownServer) hostport() string { return net.JoinHostPort(s.addr.String(), s.port) }

func TestHostAddressesRefused(t *testing.T) {
	own := startOwnServer(t)
	res := newResolver(map[string]string{"self.test": own.addr.String()})
	for _, tc := range []struct {
		name  string
		allow []netip.Prefix
	}{
		{"no exemptions", nil},
		// The administrator opened the whole network the host sits in
		// (and so every range check for it): the host itself stays shut.
		{"its network opened", []netip.Prefix{own.network}},
		{"everything opened", []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startProxy(t, Config{Policy: Policy{DefaultAllow: true}, Resolver: res, AllowPrivate: tc.allow})
			for _, hp := range []string{own.hostport(), "self.test:" + own.port} {
				for _, req := range requests(hp) {
					resp, body := r.raw(t, req)
					if resp.StatusCode != http.StatusForbidden {
						t.Errorf("%.50q: got %d %q, want 403", req, resp.StatusCode, body)
					}
					if tc.allow != nil && !strings.Contains(body, "local address of this host") {
						t.Errorf("%.50q: reason %q, want it to name this host's address", req, body)
					}
				}
			}
		})
	}
	// Refused before connecting: the host service saw nothing at all.
	if n := own.conns.Load(); n != 0 {
		t.Errorf("the host service accepted %d connections through the proxy", n)
	}

	// The administrator's deliberate openings still work: the single
	// address, or a pinned host.
	t.Run("single address opened", func(t *testing.T) {
		r := startProxy(t, Config{Policy: Policy{DefaultAllow: true}, Resolver: res,
			AllowPrivate: []netip.Prefix{netip.PrefixFrom(own.addr, own.addr.BitLen())}})
		resp, body := r.raw(t, "GET http://self.test:"+own.port+"/ HTTP/1.1\r\nHost: self.test\r\n\r\n")
		if resp.StatusCode != http.StatusOK || body != "host service reached" {
			t.Errorf("got %d %q, want the host service", resp.StatusCode, body)
		}
	})
	t.Run("pinned host", func(t *testing.T) {
		r := startProxy(t, Config{
			Policy:      Policy{Rules: []Rule{{Host: "gateway.internal", Allow: true}}},
			StaticHosts: map[string]string{"gateway.internal": own.hostport()},
		})
		resp, body := r.raw(t, "GET http://gateway.internal/ HTTP/1.1\r\nHost: gateway.internal\r\n\r\n")
		if resp.StatusCode != http.StatusOK || body != "host service reached" {
			t.Errorf("got %d %q, want the host service", resp.StatusCode, body)
		}
	})
}

// A host address the cached reading does not hold yet (added within the
// last hostAddrTTL) is still refused: the connection reached this host, so
// it is closed before a byte is sent.
func TestHostAddressRefusedAfterConnecting(t *testing.T) {
	own := startOwnServer(t)
	blind := func(p *Proxy) {
		p.hosts.read = func() ([]netip.Addr, error) { return nil, nil }
	}
	r := startProxy(t, Config{
		Policy:       Policy{DefaultAllow: true},
		Resolver:     newResolver(map[string]string{"self.test": own.addr.String()}),
		AllowPrivate: []netip.Prefix{own.network, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
	}, blind)
	for _, tc := range []struct{ hostport, reason string }{
		{own.hostport(), own.addr.String() + " is a local address of this host"},
		{"self.test:" + own.port, "self.test resolves to a local address of this host"},
	} {
		for _, req := range requests(tc.hostport) {
			resp, body := r.raw(t, req)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, tc.reason) {
				t.Errorf("%.50q: got %d %q, want 403 with %q", req, resp.StatusCode, body, tc.reason)
			}
		}
	}
	if n := own.requests.Load(); n != 0 {
		t.Errorf("the host service served %d requests through the proxy", n)
	}
}

func TestHostAddrsCache(t *testing.T) {
	a, b := netip.MustParseAddr("93.184.216.1"), netip.MustParseAddr("2606:4700::1")
	var mu sync.Mutex
	cur, calls := []netip.Addr{a}, 0
	h := &hostAddrs{read: func() ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return cur, nil
	}}
	if set, err := h.get(); err != nil || !set[a] || len(set) != 1 {
		t.Fatalf("first reading = %v, %v", set, err)
	}
	mu.Lock()
	cur = []netip.Addr{b}
	mu.Unlock()
	if set, _ := h.get(); !set[a] || calls != 1 {
		t.Errorf("a reading within the TTL read again (%d calls) or changed: %v", calls, set)
	}
	h.at = h.at.Add(-hostAddrTTL) // the TTL passes
	if set, _ := h.get(); !set[b] || set[a] || calls != 2 {
		t.Errorf("after the TTL: %v after %d calls, want only %s after 2", set, calls, b)
	}

	// The real reading holds no loopback address (the loopback ranges
	// govern those) and at least what ownAddr finds.
	addrs, err := interfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range addrs {
		if x.IsLoopback() || x.Is4In6() {
			t.Errorf("interfaceAddrs returned %s", x)
		}
	}
}

// When the host's addresses cannot be read, nothing is dialled.
func TestHostAddrsUnreadableFailsClosed(t *testing.T) {
	r := startProxy(t, Config{Policy: Policy{DefaultAllow: true}}, func(p *Proxy) {
		p.hosts.read = func() ([]netip.Addr, error) { return nil, errors.New("netlink: permission denied") }
	})
	for _, req := range requests("93.184.216.34:443") {
		resp, body := r.raw(t, req)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "cannot list this host's own addresses") {
			t.Errorf("%.40q: got %d %q, want 403", req, resp.StatusCode, body)
		}
	}
}

// assertClean fails when text holds secret in any form the scrubber knows
// (the value, its lower case, their encodings) or any of extra verbatim.
func assertClean(t *testing.T, what, text string, secret string, extra ...string) {
	t.Helper()
	s := scrub.New([]string{secret, strings.ToLower(secret)}, scrub.WithoutPatterns())
	if got := s.String(text); got != text {
		t.Errorf("%s hold the secret in a form the scrubber knows:\n%s", what, text)
	}
	for _, x := range extra {
		if strings.Contains(text, x) {
			t.Errorf("%s hold %q:\n%s", what, x, text)
		}
	}
}

// The sandbox holds an injected value and makes it a host name, under
// every kind of decision the proxy logs: denied by default, by a rule,
// unresolvable, refused by the address checks, dial failed.
func TestSecretHostNamesNeverLogged(t *testing.T) {
	const secret = "Sk-Live-4fQ9zR2mXc7VbN1pLt8Ke3"
	lower := strings.ToLower(secret)
	hexLabel := hex.EncodeToString([]byte(secret))
	closed := freeLoopbackPort(t)
	res := newResolver(map[string]string{
		lower + ".private.test": "10.0.0.5",
		lower + ".closed.test":  "127.0.0.1",
	})
	for _, tc := range []struct {
		name     string
		policy   Policy
		hostport string
	}{
		{"default deny", Policy{}, secret + ".attacker.test:443"},
		{"CIDR-only allow", Policy{Rules: []Rule{{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Allow: true}}}, secret + ".attacker.test:443"},
		{"deny rule", Policy{Rules: []Rule{{Host: "*.attacker.test"}}, DefaultAllow: true}, secret + ".attacker.test:443"},
		{"hex encoded", Policy{}, hexLabel + ".attacker.test:443"},
		{"unresolvable", Policy{DefaultAllow: true}, secret + ".nx.test:443"},
		{"private address", Policy{DefaultAllow: true}, secret + ".private.test:443"},
		{"dial fails", Policy{Rules: []Rule{{Host: "*.closed.test", Allow: true}}}, secret + ".closed.test:" + closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startProxy(t, Config{Policy: tc.policy, Resolver: res, Secrets: []string{secret},
				AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
			for _, req := range requests(tc.hostport) {
				r.raw(t, req)
			}
			logs := r.logs.String() + strings.Join(r.p.Stats().Denials, "\n")
			if !strings.Contains(logs, "<h:") {
				t.Errorf("the requests were not logged in their hashed form:\n%s", logs)
			}
			assertClean(t, "logs", logs, secret, hexLabel[:16])
		})
	}
}

// Names the client chose reach neither the logs nor Stats as they are,
// even when they hold nothing the scrubber knows: only their hash, and
// the suffix of the rule that decided them.
func TestClientNamesLoggedAsHashes(t *testing.T) {
	const label = "exfil-7c1d2e9a"
	r := startProxy(t, Config{
		Policy: Policy{Rules: []Rule{
			{Host: "*.blocked.test", Allow: false},
			{Host: "*.allowed.test", Allow: true},
			{Host: "named.test", Allow: false},
		}},
		Resolver: newResolver(map[string]string{label + ".allowed.test": "10.0.0.5"}),
	})
	for _, hp := range []string{label + ".blocked.test:443", label + ".allowed.test:443", label + ".other.test:443", "named.test:443"} {
		for _, req := range requests(hp) {
			resp, body := r.raw(t, req)
			// The client is told in full: it chose the name.
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, strings.TrimSuffix(hp, ":443")) {
				t.Errorf("%.40q: got %d %q", req, resp.StatusCode, body)
			}
		}
	}
	logs := r.logs.String() + strings.Join(r.p.Stats().Denials, "\n")
	assertClean(t, "logs", logs, "unused-secret-value", label, "other.test")
	for _, want := range []string{
		">.blocked.test:443 is denied by rule 1 (deny *.blocked.test)",
		">.allowed.test:443: 10.0.0.5 is a private address",
		"named.test:443 is denied by rule 3 (deny named.test)",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	// One name, one hash, within a proxy; another proxy, another key.
	tg, _ := r.p.parseTarget(label+".other.test:443", 0)
	first := r.p.logDest(tg)
	if strings.Count(logs, first) != 6 {
		t.Errorf("%s appears %d times, want 6 (3 requests, logs and Stats)", first, strings.Count(logs, first))
	}
	other, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if other.logDest(tg) == first {
		t.Error("two proxies hash a name alike: the hash is not keyed")
	}
}

// Every record the proxy logs is scrubbed, whatever carries the secret:
// here an upstream that answers with a broken header echoing the request
// line, so that net/http's error text holds the request's query.
func TestLogRecordsScrubbed(t *testing.T) {
	const secret = "zq7Hk2mVx9PwL4nR8tBy"
	const credValue = "Kx8-credential-value-5521"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nBroken %s\r\n\r\n", strings.TrimSpace(line))
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	logs := &syncBuffer{}
	r := startProxy(t, Config{
		Policy:       Policy{Rules: []Rule{{Host: "echo.test", Allow: true}}},
		Resolver:     newResolver(map[string]string{"echo.test": "127.0.0.1"}),
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Secrets:      []string{secret},
		Credentials:  []Credential{{Host: "api.test", Value: credValue}},
		Log:          slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	resp, _ := r.raw(t, "GET http://echo.test:"+port+"/?q="+secret+"&b="+hex.EncodeToString([]byte(secret))+" HTTP/1.1\r\nHost: echo.test\r\n\r\n")
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502 from the broken upstream", resp.StatusCode)
	}
	// The proxy's logger itself, as every line of the proxy uses it.
	r.p.log.Warn("message "+secret, "attr", secret, "err", errors.New("upstream said "+credValue),
		slog.Group("g", "lower", strings.ToLower(secret)))
	text := logs.String()
	if !strings.Contains(text, "egress upstream failed") || !strings.Contains(text, "malformed MIME header") {
		t.Fatalf("the upstream failure was not logged:\n%s", text)
	}
	assertClean(t, "logs", text, secret, secret[:12], strings.ToLower(secret)[:12])
	assertClean(t, "logs", text, credValue)
	if strings.Count(text, scrub.Redacted) < 5 {
		t.Errorf("want the secret replaced in each place:\n%s", text)
	}
}
