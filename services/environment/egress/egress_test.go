package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// guard bounds how long a test waits for something that should happen; it
// only turns a hang into a failure.
const guard = 20 * time.Second

// fakeResolver answers from a fixed map and records the names asked for.
type fakeResolver struct {
	mu    sync.Mutex
	m     map[string][]netip.Addr
	calls []string
}

func newResolver(m map[string]string) *fakeResolver {
	r := &fakeResolver{m: map[string][]netip.Addr{}}
	for host, addrs := range m {
		for _, a := range strings.Split(addrs, ",") {
			r.m[host] = append(r.m[host], netip.MustParseAddr(a))
		}
	}
	return r
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, host)
	if a, ok := r.m[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, Server: fakeDNSServer, IsNotFound: true}
}

// fakeDNSServer is the resolver address fakeResolver's errors carry, as
// the system resolver's do; clients must never see it.
const fakeDNSServer = "10.53.53.53:53"

func (r *fakeResolver) lookups() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testCert returns a self-signed certificate for the test host names and
// 127.0.0.1, and a pool trusting it.
func testCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "egress test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		DNSNames:              []string{"api.test", "bearer.test", "allowed.test", "unpinned.test"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(parsed)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// startTLS starts an HTTPS test server presenting cert.
func startTLS(t *testing.T, cert tls.Certificate, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// running is a proxy serving on a Unix socket.
type running struct {
	p      *Proxy
	sock   string
	served chan error
	logs   *syncBuffer
}

// startProxy serves a proxy for cfg (logging at Debug into a buffer unless
// cfg.Log is set) and closes it when the test ends. setup runs on the
// proxy before it serves.
func startProxy(t *testing.T, cfg Config, setup ...func(*Proxy)) *running {
	t.Helper()
	dir, err := os.MkdirTemp("", "eg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := &running{sock: filepath.Join(dir, "p.sock"), served: make(chan error, 1), logs: &syncBuffer{}}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r.p, err = New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for _, f := range setup {
		f(r.p)
	}
	l, err := ListenUnix(r.sock)
	if err != nil {
		t.Fatalf("ListenUnix: %v", err)
	}
	go func() { r.served <- r.p.Serve(l) }()
	t.Cleanup(func() {
		r.p.Close()
		select {
		case err := <-r.served:
			if err != nil {
				t.Errorf("Serve returned %v, want nil", err)
			}
		case <-time.After(guard):
			t.Error("Serve did not return after Close")
		}
	})
	return r
}

// client returns an HTTP client whose connections go to the proxy socket.
// proxied sends absolute-form requests (and CONNECT for https); otherwise
// plain requests go in origin form, as curl --unix-socket sends them.
func (r *running) client(t *testing.T, proxied bool, roots *x509.CertPool) *http.Client {
	t.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", r.sock)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}
	if proxied {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "egress.invalid"})
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: guard}
}

// raw sends a raw request on a new connection and returns the response and
// its body.
func (r *running) raw(t *testing.T, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("unix", r.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(guard))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(req, "\r\n")
	method, _, _ := strings.Cut(line, " ")
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading response to %.100q: %v", line, err)
	}
	// A server refusing a request may reset the connection after its
	// response; the body read so far is what counts.
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// connect opens a tunnel through the proxy and returns the connection and
// its reader, failing the test unless the proxy answers 200.
func (r *running) connect(t *testing.T, hostport string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", r.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(guard))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("CONNECT %s: %d %s", hostport, resp.StatusCode, body)
	}
	return c, br
}

// seen is what the echo upstream reports about the request it received.
type seen struct {
	Host      string
	URI       string
	TLS       bool
	APIKey    []string
	Auth      []string
	ProxyAuth []string
	Custom    []string
	Body      string
}

// echoHandler reports the request it received as JSON; /sse streams two
// events, the second only after next is closed.
func echoHandler(next <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/sse" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
			fmt.Fprint(w, "data: two\n\n")
			return
		}
		body, _ := io.ReadAll(r.Body)
		json.NewEncoder(w).Encode(seen{
			Host:      r.Host,
			URI:       r.URL.RequestURI(),
			TLS:       r.TLS != nil,
			APIKey:    r.Header.Values("X-Api-Key"),
			Auth:      r.Header.Values("Authorization"),
			ProxyAuth: r.Header.Values("Proxy-Authorization"),
			Custom:    r.Header.Values("X-Custom"),
			Body:      string(body),
		})
	})
}

// do sends req with c and decodes the echo upstream's report.
func do(t *testing.T, c *http.Client, req *http.Request) seen {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: status %d: %s", req.Method, req.URL, resp.StatusCode, body)
	}
	var s seen
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("decoding %q: %v", body, err)
	}
	return s
}

const (
	apiKey      = "sk-secret-api-key-1234"
	bearerToken = "tok-secret-bearer-5678"
	bogus       = "bogus-client-value-9999"
)

func TestCredentialInjection(t *testing.T) {
	cert, pool := testCert(t)
	next := make(chan struct{})
	up := startTLS(t, cert, echoHandler(next))
	upAddr := up.Listener.Addr().String()
	res := newResolver(map[string]string{"unpinned.test": "10.0.0.5"})
	r := startProxy(t, Config{
		Credentials: []Credential{
			{Host: "api.test", Header: "x-api-key", Value: apiKey},
			{Host: "Bearer.Test", Value: bearerToken},
			{Host: "unpinned.test", Value: bearerToken},
		},
		StaticHosts: map[string]string{"api.test": upAddr, "bearer.test": upAddr},
		TLS:         &tls.Config{RootCAs: pool},
		Resolver:    res,
		// The policy denies everything: credentialed hosts need no rule.
	})

	for _, proxied := range []bool{true, false} {
		name := "origin-form"
		if proxied {
			name = "absolute-form"
		}
		t.Run(name, func(t *testing.T) {
			c := r.client(t, proxied, nil)

			req, _ := http.NewRequest(http.MethodPost, "http://api.test/v1/x?q=1", strings.NewReader("hello body"))
			req.Header.Set("X-Api-Key", bogus)
			req.Header.Set("Proxy-Authorization", "Basic "+bogus)
			req.Header.Set("X-Custom", "kept")
			s := do(t, c, req)
			want := seen{Host: "api.test", URI: "/v1/x?q=1", TLS: true, APIKey: []string{apiKey}, Custom: []string{"kept"}, Body: "hello body"}
			if fmt.Sprint(s) != fmt.Sprint(want) {
				t.Errorf("upstream saw %+v, want %+v", s, want)
			}

			req, _ = http.NewRequest(http.MethodGet, "http://bearer.test:8080/v1/y", nil)
			req.Header.Set("Authorization", "Bearer "+bogus)
			s = do(t, c, req)
			if len(s.Auth) != 1 || s.Auth[0] != "Bearer "+bearerToken {
				t.Errorf("Authorization upstream = %q, want one %q", s.Auth, "Bearer "+bearerToken)
			}
			if s.Host != "bearer.test" || s.URI != "/v1/y" {
				t.Errorf("upstream saw host %q uri %q, want bearer.test /v1/y", s.Host, s.URI)
			}
		})
	}

	t.Run("sse streams", func(t *testing.T) {
		c := r.client(t, true, nil)
		resp, err := c.Get("http://api.test/sse")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		// The upstream holds the second event until next is closed, so
		// reading the first one proves the proxy does not buffer.
		if line, err := br.ReadString('\n'); err != nil || line != "data: one\n" {
			t.Fatalf("first line = %q, %v; want %q", line, err, "data: one\n")
		}
		close(next)
		rest, err := io.ReadAll(br)
		if err != nil {
			t.Fatal(err)
		}
		if string(rest) != "\ndata: two\n\n" {
			t.Errorf("rest of stream = %q", rest)
		}
	})

	t.Run("unpinned credentialed host is address-checked", func(t *testing.T) {
		resp, body := r.raw(t, "GET /v1/x HTTP/1.1\r\nHost: unpinned.test\r\n\r\n")
		if resp.StatusCode != http.StatusForbidden || body != "egress denied: unpinned.test resolves to a private address\n" {
			t.Errorf("got %d %q, want 403 naming the kind of address, not the address", resp.StatusCode, body)
		}
	})

	t.Run("https absolute form refused", func(t *testing.T) {
		resp, _ := r.raw(t, "GET https://api.test/v1/x HTTP/1.1\r\nHost: api.test\r\n\r\n")
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("status %d, want 400", resp.StatusCode)
		}
	})

	t.Run("CONNECT to a credentialed host follows the policy", func(t *testing.T) {
		resp, body := r.raw(t, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "send plain HTTP to http://api.test/") {
			t.Errorf("got %d %q, want 403 with a hint", resp.StatusCode, body)
		}
	})

	logs := r.logs.String()
	for _, secret := range []string{apiKey, bearerToken, bogus} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain %q:\n%s", secret, logs)
		}
	}
	if !strings.Contains(logs, "egress denied") {
		t.Errorf("logs lack the denial:\n%s", logs)
	}
}

func TestCredentialUpstreamCertificateVerified(t *testing.T) {
	cert, _ := testCert(t)
	up := httptest.NewUnstartedServer(echoHandler(nil))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	up.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	up.StartTLS()
	t.Cleanup(up.Close)
	r := startProxy(t, Config{
		Credentials: []Credential{{Host: "api.test", Value: apiKey}},
		StaticHosts: map[string]string{"api.test": up.Listener.Addr().String()},
		// No TLS config: system roots, which do not trust the test cert.
	})
	resp, body := r.raw(t, "GET /v1/x HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "certificate") {
		t.Errorf("got %d %q, want 502 about the certificate", resp.StatusCode, body)
	}
}

func TestConnectAllowedEndToEnd(t *testing.T) {
	cert, pool := testCert(t)
	up := startTLS(t, cert, echoHandler(nil))
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	res := newResolver(map[string]string{"allowed.test": "127.0.0.1"})
	r := startProxy(t, Config{
		Policy: Policy{Rules: []Rule{
			{Host: "allowed.test", Allow: true},
			{Prefix: netip.MustParsePrefix("127.0.0.1/32"), Port: 0, Allow: true},
		}},
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver:     res,
	})
	c := r.client(t, true, pool)
	for _, u := range []string{
		"https://allowed.test:" + port + "/hello",
		"https://127.0.0.1:" + port + "/hello", // CIDR rule, IP literal
	} {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Header.Set("X-Custom", "through")
		s := do(t, c, req)
		if !s.TLS || s.URI != "/hello" || len(s.Custom) != 1 || s.Custom[0] != "through" {
			t.Errorf("%s: upstream saw %+v", u, s)
		}
	}
	if st := r.p.Stats(); st.Allowed != 2 || st.Denied != 0 {
		t.Errorf("stats = %+v, want 2 allowed, 0 denied", st)
	}
}

func TestPlainForward(t *testing.T) {
	up := httptest.NewServer(echoHandler(nil))
	t.Cleanup(up.Close)
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	r := startProxy(t, Config{
		Policy:       Policy{Rules: []Rule{{Host: "web.test", Allow: true}}},
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Resolver:     newResolver(map[string]string{"web.test": "127.0.0.1"}),
	})
	for _, proxied := range []bool{true, false} {
		c := r.client(t, proxied, nil)
		req, _ := http.NewRequest(http.MethodPut, "http://web.test:"+port+"/p?q=1", strings.NewReader("data"))
		req.Header.Set("Connection", "X-Custom") // X-Custom is hop-by-hop here
		req.Header.Set("X-Custom", "dropped")
		req.Header.Set("Proxy-Authorization", "Basic "+bogus)
		s := do(t, c, req)
		want := seen{Host: "web.test:" + port, URI: "/p?q=1", Body: "data"}
		if fmt.Sprint(s) != fmt.Sprint(want) {
			t.Errorf("proxied=%v: upstream saw %+v, want %+v", proxied, s, want)
		}
	}
}

func TestPolicyDenialsOverHTTP(t *testing.T) {
	res := newResolver(nil)
	r := startProxy(t, Config{
		Policy: Policy{Rules: []Rule{
			{Host: "x.test", Allow: false},
			{Host: "x.test", Allow: true},
			{Host: "ok.test", Allow: true},
		}},
		Resolver: res,
	})
	tests := []struct {
		name, req, reason string
	}{
		{"CONNECT default deny", "CONNECT unlisted.test:443 HTTP/1.1\r\nHost: unlisted.test:443\r\n\r\n",
			"unlisted.test:443 is not allowed by the egress policy (no rule matches; default deny)"},
		{"plain default deny", "GET http://unlisted.test/a HTTP/1.1\r\nHost: unlisted.test\r\n\r\n",
			"unlisted.test:80 is not allowed by the egress policy (no rule matches; default deny)"},
		{"deny rule before allow rule", "CONNECT x.test:443 HTTP/1.1\r\nHost: x.test:443\r\n\r\n",
			"x.test:443 is denied by rule 1 (deny x.test)"},
		{"origin form", "GET /a HTTP/1.1\r\nHost: X.Test.\r\n\r\n",
			"x.test:80 is denied by rule 1 (deny x.test)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := r.raw(t, tc.req)
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("status %d, want 403", resp.StatusCode)
			}
			if want := "egress denied: " + tc.reason + "\n"; body != want {
				t.Errorf("body %q, want %q", body, want)
			}
			if got := resp.Header.Get(DeniedHeader); got != tc.reason {
				t.Errorf("%s = %q, want %q", DeniedHeader, got, tc.reason)
			}
		})
	}
	if got := res.lookups(); len(got) != 0 {
		t.Errorf("names denied by host rules were resolved: %q", got)
	}
	// Stats and logs name the client's own choice of name only by its
	// hash, and names from the policy in full.
	st := r.p.Stats()
	want := []string{
		"<h:", ":443 is not allowed by the egress policy (no rule matches; default deny)",
		"<h:", ":80 is not allowed by the egress policy (no rule matches; default deny)",
		"x.test:443 is denied by rule 1 (deny x.test)", "",
		"x.test:80 is denied by rule 1 (deny x.test)", "",
	}
	if st.Denied != int64(len(tests)) || len(st.Denials) != len(tests) {
		t.Fatalf("stats = %+v", st)
	}
	for i, d := range st.Denials {
		if !strings.HasPrefix(d, want[2*i]) || !strings.HasSuffix(d, want[2*i+1]) {
			t.Errorf("Denials[%d] = %q, want %q...%q", i, d, want[2*i], want[2*i+1])
		}
	}
	logs := r.logs.String()
	if strings.Contains(logs, "unlisted") || !strings.Contains(logs, "egress denied") || !strings.Contains(logs, "deny x.test") {
		t.Errorf("denial logs name the client's host, or lack the denials:\n%s", logs)
	}
}

func TestDecide(t *testing.T) {
	res := newResolver(map[string]string{
		"pub.test":       "93.184.216.34",
		"mixed.test":     "93.184.216.34,127.0.0.1",
		"example.com":    "8.8.8.8",
		"notexample.com": "8.8.8.8",
		"exact.org":      "8.8.8.8",
	})
	p, err := New(Config{
		Policy: Policy{Rules: []Rule{
			{Host: "bad.example.com", Allow: false},
			{Host: "*.example.com", Allow: true},
			{Host: "exact.org", Port: 443, Allow: true},
			{Prefix: netip.MustParsePrefix("93.184.216.0/24"), Allow: true},
			{Prefix: netip.MustParsePrefix("2001:db8::/32"), Port: 8443, Allow: true},
		}},
		Resolver: res,
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		hostport string
		allow    bool
	}{
		{"a.example.com:443", true},
		{"a.b.example.com:80", true},
		{"A.Example.COM.:443", true},
		{"example.com:443", false}, // wildcard excludes the apex
		{"notexample.com:443", false},
		{"bad.example.com:443", false}, // deny before the wildcard allow
		{"BAD.example.com.:443", false},
		{"exact.org:443", true},
		{"exact.org:80", false}, // port-specific rule
		{"93.184.216.34:443", true},
		{"93.184.217.1:443", false},
		{"[::ffff:93.184.216.34]:443", true}, // mapped literal matches the IPv4 prefix
		{"[2001:db8::1]:8443", true},
		{"[2001:db8::1]:443", false},
		{"pub.test:443", false},   // a Prefix rule never allows a name alone
		{"mixed.test:443", false}, // nor is a name resolved for it
	}
	for _, tc := range tests {
		t.Run(tc.hostport, func(t *testing.T) {
			tg, err := p.parseTarget(tc.hostport, 0)
			if err != nil {
				t.Fatal(err)
			}
			deny, err := p.decide(t.Context(), tg)
			if err != nil {
				t.Fatal(err)
			}
			if (deny == nil) != tc.allow {
				t.Errorf("decide(%s) = %+v, want allow=%v", tc.hostport, deny, tc.allow)
			}
		})
	}
	if got := res.lookups(); len(got) != 0 {
		t.Errorf("names resolved to decide: %q", got)
	}

	// Under a default-allow policy, names are resolved to meet the Prefix
	// rules in order.
	p, err = New(Config{
		Policy: Policy{Rules: []Rule{
			{Prefix: netip.MustParsePrefix("93.184.216.0/24"), Allow: false},
		}, DefaultAllow: true},
		Resolver: res,
	})
	if err != nil {
		t.Fatal(err)
	}
	for host, allow := range map[string]bool{"pub.test": false, "mixed.test": true, "example.com": true} {
		tg, _ := p.parseTarget(host+":443", 0)
		if deny, err := p.decide(t.Context(), tg); err != nil || (deny == nil) != allow {
			t.Errorf("default allow: decide(%s) = %+v, %v; want allow=%v", host, deny, err, allow)
		}
	}
	tg, _ := p.parseTarget("nxdomain.test:443", 0)
	var re *errResolve
	if _, err := p.decide(t.Context(), tg); !errors.As(err, &re) {
		t.Errorf("a name that does not resolve, reaching a prefix rule: %v, want a resolution error", err)
	}
}

func TestAddressChecksOverHTTP(t *testing.T) {
	local := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("loopback upstream reached: %s %s", r.Method, r.URL)
	}))
	t.Cleanup(local.Close)
	_, port, _ := net.SplitHostPort(local.Listener.Addr().String())
	r := startProxy(t, Config{
		Policy: Policy{
			Rules:        []Rule{{Host: "metadata.test", Allow: true}, {Prefix: netip.MustParsePrefix("0.0.0.0/0"), Allow: true}},
			DefaultAllow: true,
		},
		Resolver: newResolver(map[string]string{
			"metadata.test": "169.254.169.254",
			"internal.test": "10.0.0.5",
			"mixed.test":    "93.184.216.34,127.0.0.1",
			"doc.test":      "198.51.100.20",
		}),
	})
	tests := []struct{ hostport, reason string }{
		{"metadata.test:80", "metadata.test resolves to a link-local/cloud-metadata address"},
		{"internal.test:443", "internal.test resolves to a private address"},
		{"mixed.test:443", "mixed.test resolves to a loopback address"},
		{"doc.test:443", "doc.test resolves to a documentation (198.51.100.0/24) address"},
		{"192.0.2.10:443", "192.0.2.10 is a documentation (192.0.2.0/24) address"},
		{"198.51.100.7:80", "198.51.100.7 is a documentation (198.51.100.0/24) address"},
		{"203.0.113.9:443", "203.0.113.9 is a documentation (203.0.113.0/24) address"},
		{"[2001:db8::5]:443", "2001:db8::5 is a documentation (2001:db8::/32) address"},
		{"127.0.0.1:" + port, "127.0.0.1 is a loopback address"},
		{"[::ffff:127.0.0.1]:" + port, "127.0.0.1 is a loopback address"},
		{"169.254.169.254:80", "169.254.169.254 is a link-local/cloud-metadata address"},
		{"[::1]:" + port, "::1 is a loopback address"},
	}
	for _, tc := range tests {
		for _, req := range []string{
			"CONNECT " + tc.hostport + " HTTP/1.1\r\nHost: " + tc.hostport + "\r\n\r\n",
			"GET http://" + tc.hostport + "/ HTTP/1.1\r\nHost: " + tc.hostport + "\r\n\r\n",
			"GET / HTTP/1.1\r\nHost: " + tc.hostport + "\r\n\r\n",
		} {
			resp, body := r.raw(t, req)
			if resp.StatusCode != http.StatusForbidden || body != "egress denied: "+tc.reason+"\n" {
				t.Errorf("%q: got %d %q, want 403 %q", req, resp.StatusCode, body, tc.reason)
			}
		}
	}
}

func TestCheckAddr(t *testing.T) {
	tests := []struct {
		addr  string
		allow string // comma-separated AllowPrivate
		want  string // substring of the reason; "" means allowed
	}{
		{"93.184.216.34", "", ""},
		{"2606:4700::1111", "", ""},
		{"127.0.0.1", "", "loopback"},
		{"127.255.0.9", "", "loopback"},
		{"::1", "", "loopback"},
		{"::ffff:127.0.0.1", "", "127.0.0.1 is a loopback"},
		{"0.0.0.0", "", "unspecified"},
		{"::", "", "unspecified"},
		{"10.1.2.3", "", "private"},
		{"172.16.0.1", "", "private"},
		{"172.31.255.255", "", "private"},
		{"172.32.0.1", "", ""},
		{"192.168.1.1", "", "private"},
		{"fd12::1", "", "private"},
		{"169.254.1.1", "", "link-local"},
		{"fe80::1", "", "link-local"},
		{"100.64.0.1", "", "carrier-grade NAT"},
		{"224.0.0.1", "", "multicast"},
		{"ff02::1", "", "multicast"},
		{"255.255.255.255", "", "broadcast"},
		{"192.0.0.8", "", "192.0.0.0/24"},
		{"198.19.0.1", "", "benchmarking"},
		{"169.254.169.254", "", "169.254.169.254 is a link-local/cloud-metadata address"},
		{"fd00:ec2::254", "", "cloud-metadata"},
		{"100.100.100.200", "", "cloud-metadata"},
		{"64:ff9b::7f00:1", "", "64:ff9b::7f00:1 is a NAT64 address embedding a loopback address"},
		{"64:ff9b::5db8:d822", "", ""},
		{"2002:a00:1::1", "", "6to4 address embedding a private address"},
		{"192.0.2.1", "", "documentation (192.0.2.0/24)"},
		{"198.51.100.255", "", "documentation (198.51.100.0/24)"},
		{"203.0.113.0", "", "documentation (203.0.113.0/24)"},
		{"2001:db8:1::1", "", "documentation (2001:db8::/32)"},
		{"64:ff9b::c000:201", "", "NAT64 address embedding a documentation"},
		{"192.0.3.1", "", ""},
		{"203.0.114.1", "", ""},
		{"203.0.113.9", "203.0.113.0/24", ""},
		// This host's own addresses (here 93.184.216.99 and 10.9.9.9):
		// refused; a range does not open them, the single address does.
		{"93.184.216.99", "", "93.184.216.99 is a local address of this host"},
		{"::ffff:93.184.216.99", "", "local address of this host"},
		{"64:ff9b::5db8:d863", "", "NAT64 address embedding a local address of this host"},
		{"10.9.9.9", "10.0.0.0/8", "local address of this host"},
		{"10.9.9.10", "10.0.0.0/8", ""},
		{"10.9.9.9", "10.9.9.9/32", ""},
		{"93.184.216.99", "0.0.0.0/0", "local address of this host"},
		{"93.184.216.99", "93.184.216.99/32", ""},
		{"10.1.2.3", "10.0.0.0/8", ""},
		{"::ffff:10.1.2.3", "::ffff:10.0.0.0/104", ""},
		{"192.168.1.1", "10.0.0.0/8", "private"},
		{"169.254.1.1", "169.254.0.0/16", ""},
		{"169.254.169.254", "169.254.0.0/16", "cloud-metadata"}, // a range never exempts metadata
		{"169.254.169.254", "169.254.169.254/32", ""},
		{"100.100.100.200", "100.64.0.0/10", "cloud-metadata"},
	}
	host := map[netip.Addr]bool{netip.MustParseAddr("93.184.216.99"): true, netip.MustParseAddr("10.9.9.9"): true}
	for _, tc := range tests {
		var allow []netip.Prefix
		if tc.allow != "" {
			for _, s := range strings.Split(tc.allow, ",") {
				allow = append(allow, normPrefix(netip.MustParsePrefix(s)))
			}
		}
		got := checkAddr(netip.MustParseAddr(tc.addr), allow, host)
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("checkAddr(%s, allow %q) = %q, want %q", tc.addr, tc.allow, got, tc.want)
		}
	}
}

// echoListener accepts TCP connections on loopback and echoes them; each
// connection's end is reported on the returned channel.
func echoListener(t *testing.T) (string, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ended := make(chan struct{}, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				ended <- struct{}{}
			}()
		}
	}()
	return l.Addr().String(), ended
}

// ping writes msg through the tunnel and expects it echoed.
func ping(t *testing.T, c net.Conn, br *bufio.Reader, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
		t.Fatalf("echo = %q, %v; want %q", got, err, msg)
	}
}

// expectClosed reads from the tunnel and fails unless the proxy closed it.
func expectClosed(t *testing.T, br *bufio.Reader, ended <-chan struct{}) {
	t.Helper()
	_, err := br.ReadByte()
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("read after teardown: %v, want EOF or a connection error", err)
	}
	select {
	case <-ended:
	case <-time.After(guard):
		t.Fatal("upstream side of the tunnel still open")
	}
}

func TestCloseTearsDownTunnel(t *testing.T) {
	addr, ended := echoListener(t)
	_, port, _ := net.SplitHostPort(addr)
	r := startProxy(t, Config{
		Policy:       Policy{DefaultAllow: true},
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver:     newResolver(map[string]string{"echo.test": "127.0.0.1"}),
	})
	// The first bytes travel in the same write as the CONNECT head.
	c, err := net.Dial("unix", r.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(guard))
	fmt.Fprintf(c, "CONNECT echo.test:%s HTTP/1.1\r\nHost: echo.test:%s\r\n\r\nearly", port, port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	early := make([]byte, 5)
	if _, err := io.ReadFull(br, early); err != nil || string(early) != "early" {
		t.Fatalf("early bytes echoed as %q, %v", early, err)
	}
	ping(t, c, br, "ping")

	if err := r.p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	expectClosed(t, br, ended)
	select {
	case err := <-r.served:
		if err != nil {
			t.Errorf("Serve returned %v, want nil", err)
		}
		r.served <- nil // for the cleanup
	case <-time.After(guard):
		t.Fatal("Serve did not return after Close")
	}
	if err := r.p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Stat(r.sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket file after Close: %v, want it removed", err)
	}
}

func TestIdleTunnelClosed(t *testing.T) {
	addr, ended := echoListener(t)
	r := startProxy(t, Config{
		Policy:       Policy{DefaultAllow: true},
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		IdleTimeout:  50 * time.Millisecond,
	})
	c, br := r.connect(t, addr)
	ping(t, c, br, "ping")
	expectClosed(t, br, ended) // nothing moves, so the proxy ends the tunnel
}

func TestMalformedRequests(t *testing.T) {
	r := startProxy(t, Config{
		Policy:      Policy{DefaultAllow: true},
		Credentials: []Credential{{Host: "api.test", Value: apiKey}},
	})
	huge := strings.Repeat("a", 70<<10)
	tests := []struct {
		name, req string
		status    int
	}{
		{"garbage", "GARBAGE\r\n\r\n", http.StatusBadRequest},
		{"space in URL", "GET http://bad host/ HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest},
		{"CONNECT without port", "CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n", http.StatusBadRequest},
		{"CONNECT bad port", "CONNECT example.com:0 HTTP/1.1\r\nHost: example.com:0\r\n\r\n", http.StatusBadRequest},
		{"CONNECT empty host", "CONNECT :443 HTTP/1.1\r\nHost: :443\r\n\r\n", http.StatusBadRequest},
		{"CONNECT zone", "CONNECT [fe80::1%25eth0]:443 HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest},
		{"CONNECT path", "CONNECT /x HTTP/1.1\r\nHost: example.com:443\r\n\r\n", http.StatusBadRequest},
		{"bad host name", "GET / HTTP/1.1\r\nHost: exa$mple.com\r\n\r\n", http.StatusBadRequest},
		{"empty label", "GET / HTTP/1.1\r\nHost: a..b\r\n\r\n", http.StatusBadRequest},
		{"numeric host", "GET / HTTP/1.1\r\nHost: 127.1\r\n\r\n", http.StatusBadRequest},
		{"bracketed name", "GET / HTTP/1.1\r\nHost: [example.com]:80\r\n\r\n", http.StatusBadRequest},
		{"unbracketed IPv6", "GET / HTTP/1.1\r\nHost: ::1\r\n\r\n", http.StatusBadRequest},
		{"port out of range", "GET http://example.com:99999/ HTTP/1.1\r\nHost: example.com:99999\r\n\r\n", http.StatusBadRequest},
		{"https absolute", "GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", http.StatusBadRequest},
		{"no host", "GET / HTTP/1.0\r\n\r\n", http.StatusBadRequest},
		{"opaque URL", "GET http:example.com HTTP/1.1\r\nHost: \r\n\r\n", http.StatusBadRequest},
		{"huge header", "GET / HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: " + apiKey + "\r\nX-Big: " + huge + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := r.raw(t, tc.req)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d (%q), want %d", resp.StatusCode, body, tc.status)
			}
		})
	}
	// Still serving.
	resp, _ := r.raw(t, "CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("after malformed requests: status %d, want 403", resp.StatusCode)
	}
	logs := r.logs.String()
	if strings.Contains(logs, apiKey) || strings.Contains(logs, "panic") {
		t.Errorf("logs contain the credential or a panic:\n%s", logs)
	}
}

func TestDenialsRing(t *testing.T) {
	r := startProxy(t, Config{})
	for i := range 40 {
		r.raw(t, fmt.Sprintf("CONNECT 93.184.216.34:%d HTTP/1.1\r\nHost: 93.184.216.34:%d\r\n\r\n", 1000+i, 1000+i))
	}
	st := r.p.Stats()
	if st.Denied != 40 || st.Allowed != 0 || len(st.Denials) != maxDenials {
		t.Fatalf("stats: denied %d allowed %d, %d reasons; want 40, 0, %d", st.Denied, st.Allowed, len(st.Denials), maxDenials)
	}
	if !strings.HasPrefix(st.Denials[0], "93.184.216.34:1008 ") || !strings.HasPrefix(st.Denials[maxDenials-1], "93.184.216.34:1039 ") {
		t.Errorf("reasons run from %q to %q, want ports 1008 to 1039", st.Denials[0], st.Denials[maxDenials-1])
	}
}

func TestListenUnix(t *testing.T) {
	dir, err := os.MkdirTemp("", "eg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")

	// A stale socket: its listener is gone but the file stays.
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	l, err := ListenUnix(sock)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o666 {
		t.Errorf("socket mode %v, want a socket with 0666", fi.Mode())
	}
	if _, err := ListenUnix(sock); err == nil {
		t.Error("ListenUnix over a socket in use succeeded")
	}
	l.Close()

	file := filepath.Join(dir, "plain")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(file); err == nil {
		t.Error("ListenUnix over a regular file succeeded")
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep" {
		t.Errorf("regular file after ListenUnix: %q, %v", b, err)
	}
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"credential without host", Config{Credentials: []Credential{{Value: "v"}}}},
		{"credential without value", Config{Credentials: []Credential{{Host: "a.test"}}}},
		{"credential value with newline", Config{Credentials: []Credential{{Host: "a.test", Value: "v\r\nX: y"}}}},
		{"credential bad header", Config{Credentials: []Credential{{Host: "a.test", Header: "X Key", Value: "v"}}}},
		{"credential framing header", Config{Credentials: []Credential{{Host: "a.test", Header: "host", Value: "v"}}}},
		{"credential wildcard host", Config{Credentials: []Credential{{Host: "*.a.test", Value: "v"}}}},
		{"credential duplicate host", Config{Credentials: []Credential{{Host: "a.test", Value: "v"}, {Host: "A.test", Value: "w"}}}},
		{"rule with host and prefix", Config{Policy: Policy{Rules: []Rule{{Host: "a.test", Prefix: netip.MustParsePrefix("10.0.0.0/8")}}}}},
		{"empty rule", Config{Policy: Policy{Rules: []Rule{{Allow: true}}}}},
		{"bad wildcard", Config{Policy: Policy{Rules: []Rule{{Host: "a.*.test"}}}}},
		{"bare star", Config{Policy: Policy{Rules: []Rule{{Host: "*"}}}}},
		{"rule port out of range", Config{Policy: Policy{Rules: []Rule{{Host: "a.test", Port: 70000}}}}},
		{"static without port", Config{StaticHosts: map[string]string{"a.test": "127.0.0.1"}}},
		{"static bad key", Config{StaticHosts: map[string]string{"a b": "127.0.0.1:1"}}},
		{"invalid AllowPrivate", Config{AllowPrivate: []netip.Prefix{{}}}},
		{"negative timeout", Config{DialTimeout: -time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil {
				t.Error("New succeeded, want an error")
			}
		})
	}
	p, err := New(Config{
		Policy:      Policy{Rules: []Rule{{Host: "*.Example.com", Port: 443, Allow: true}, {Prefix: netip.MustParsePrefix("::ffff:10.0.0.0/104")}}},
		Credentials: []Credential{{Host: "API.test", Header: "x-api-key", Value: "v"}},
		StaticHosts: map[string]string{"API.test": "[::1]:8443"},
	})
	if err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if got := fmt.Sprint(p.policy.Rules); got != "[allow *.example.com:443 deny 10.0.0.0/8]" {
		t.Errorf("normalized rules = %s", got)
	}
	if c, ok := p.creds["api.test"]; !ok || c.header != "X-Api-Key" || c.value != "v" {
		t.Errorf("normalized credential = %+v", c)
	}
	if p.static["api.test"] != "[::1]:8443" {
		t.Errorf("static hosts = %v", p.static)
	}
}
