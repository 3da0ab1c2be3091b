package egress

import (
	"net"
	"net/http"
	"net/url"
	"testing"
)

// TestProxyToken: a proxy with a Token answers 407 to requests without
// it or with another, plain and CONNECT alike, before any policy
// decision; with it, the request reaches the policy (here: denied, 403
// with the denial header). An HTTP client given the proxy URL
// http://neuron:TOKEN@host:port (what the kubernetes backend gives the
// operator) sends the right header.
func TestProxyToken(t *testing.T) {
	const token = "tok-0123456789abcdef"
	p, err := New(Config{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Serve(l) }()
	defer p.Close()
	do := func(user *url.Userinfo, target string) *http.Response {
		t.Helper()
		tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: l.Addr().String(), User: user})}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get(target)
		if err != nil {
			// A CONNECT refused by the proxy is an error of the client
			// carrying no response; the status is in its text.
			t.Logf("GET %s: %v", target, err)
			return nil
		}
		resp.Body.Close()
		return resp
	}
	for _, user := range []*url.Userinfo{nil, url.UserPassword(ProxyUser, "wrong-token-0123456"), url.UserPassword("other", token)} {
		if r := do(user, "http://example.com/"); r == nil || r.StatusCode != http.StatusProxyAuthRequired || r.Header.Get(DeniedHeader) != "" {
			t.Errorf("plain request with %v: %v, want 407 before the policy", user, r)
		}
	}
	if st := p.Stats(); st.Denied != 3 {
		t.Errorf("denied %d, want 3", st.Denied)
	}
	if r := do(url.UserPassword(ProxyUser, token), "http://example.com/"); r == nil || r.StatusCode != http.StatusForbidden || r.Header.Get(DeniedHeader) == "" {
		t.Errorf("plain request with the token: %v, want the policy's 403", r)
	}
	// CONNECT: without the token the tunnel is refused (407), with it
	// the policy decides.
	if r := do(nil, "https://example.com/"); r != nil {
		t.Errorf("CONNECT without the token: %v, want it refused", r.Status)
	}
}
