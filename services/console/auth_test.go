package console_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/console"
	orchserve "github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/state"
)

// The tokens of the auth policy the services run with: admin may call
// everything, reader only the read methods (the console's read-only
// operator).
const (
	adminToken  = "admin-token-0123456789"
	readerToken = "reader-token-0123456789"
)

const policy = `{"principals": [
  {"name": "admin", "tokens": ["` + adminToken + `"], "allow": ["*"]},
  {"name": "reader", "tokens": ["` + readerToken + `"], "allow": [
    "/layer0.orchestrator.v1.OrchestratorService/ListWorkflows",
    "/layer0.orchestrator.v1.OrchestratorService/GetWorkflow",
    "/layer0.orchestrator.v1.OrchestratorService/WatchWorkflow",
    "/layer0.orchestrator.v1.OrchestratorService/GetTranscript",
    "/layer0.orchestrator.v1.OrchestratorService/ListApprovals",
    "/layer0.agent.v1.AgentService/ListAgents",
    "/layer0.agent.v1.AgentService/GetAgent",
    "/layer0.state.v1.StateService/*"]}
]}`

// authedConsole starts a State service (dev), an orchestrator behind the
// auth policy, and a console (not dev) over them; it returns the
// console's URL.
func authedConsole(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.json")
	agents := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(policyFile, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(agents, []byte("defaults: {operator: 127.0.0.1:1}\nagents: [{id: assistant}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stateAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: harness.Quiet(), Listener: lis, Backend: state.BackendMemory})
	})
	orchAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return orchserve.Run(ctx, orchserve.Config{
			Server: grpcserver.Config{Name: "orchestrator", Plaintext: true, AuthPolicy: policyFile, ShutdownTimeout: 2 * time.Second},
			Log:    harness.Quiet(), Listener: lis, Agents: agents,
			State:   grpcclient.Config{Target: stateAddr, Dev: true},
			Backend: orchserve.BackendBolt, DataDir: filepath.Join(dir, "journal"), LockTimeout: time.Second,
		})
	})
	occ, err := grpcclient.Dial(grpcclient.Config{Target: orchAddr, Plaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { occ.Close() })
	scc, err := grpcclient.Dial(grpcclient.Config{Target: stateAddr, Plaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { scc.Close() })
	srv := console.New(console.Options{PlaintextTokens: true, Log: harness.Quiet()},
		orchestratorv1.NewOrchestratorServiceClient(occ), agentv1.NewAgentServiceClient(occ), statev1.NewStateServiceClient(scc))
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	return hs.URL
}

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: time.Minute}

// login posts token to /login from the console's own page and returns
// the session cookie (nil when none was set) and the answer.
func login(t *testing.T, base, token string) (*http.Cookie, *http.Response) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Value != "" {
			return c, resp
		}
	}
	return nil, resp
}

// me is /api/me of a session.
type meBody struct {
	Dev  bool            `json:"dev"`
	CSRF string          `json:"csrf"`
	Can  map[string]bool `json:"can"`
}

// call makes an API request with the session cookie and returns the
// status and the decoded error code ("" for a success).
func call(t *testing.T, base, method, path string, cookie *http.Cookie, hdr map[string]string, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	if cookie != nil {
		req.Header.Set("Cookie", cookie.Name+"="+cookie.Value)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]any{}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func getMe(t *testing.T, base string, cookie *http.Cookie) meBody {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/api/me", nil)
	req.Header.Set("Cookie", cookie.Name+"="+cookie.Value)
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/api/me: %s", resp.Status)
	}
	var m meBody
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestAuthAttacks: the console's guards, each attacked. A request
// without a session, with a wrong CSRF token, from another site, or with
// a token lacking a permission, is refused.
func TestAuthAttacks(t *testing.T) {
	base := authedConsole(t)

	t.Run("no cookie", func(t *testing.T) {
		if code, body := call(t, base, http.MethodGet, "/api/workflows", nil, nil, ""); code != http.StatusUnauthorized || body["code"] != "UNAUTHENTICATED" {
			t.Fatalf("GET /api/workflows without a session: %d %v, want 401 UNAUTHENTICATED", code, body)
		}
		resp, err := noRedirect.Get(base + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
			t.Fatalf("GET / without a session: %s to %q, want 303 to /login", resp.Status, resp.Header.Get("Location"))
		}
		if code, _ := call(t, base, http.MethodGet, "/api/workflows", &http.Cookie{Name: "__Host-neuron-console", Value: "forged"}, nil, ""); code != http.StatusUnauthorized {
			t.Fatalf("a forged session id: %d, want 401", code)
		}
	})

	t.Run("unknown token", func(t *testing.T) {
		c, resp := login(t, base, "not-a-token-of-the-policy")
		if c != nil || !strings.Contains(resp.Header.Get("Location"), "error=token") {
			t.Fatalf("login with an unknown token: cookie %v, redirect %q; want none and /login?error=token", c, resp.Header.Get("Location"))
		}
	})

	admin, resp := login(t, base, adminToken)
	if admin == nil {
		t.Fatalf("the admin login set no cookie (redirect %q)", resp.Header.Get("Location"))
	}
	t.Run("cookie attributes", func(t *testing.T) {
		if !admin.Secure || !admin.HttpOnly || admin.SameSite != http.SameSiteStrictMode || admin.Path != "/" || admin.Name != "__Host-neuron-console" {
			t.Fatalf("session cookie %+v: want __Host-, Secure, HttpOnly, SameSite=Strict, Path=/", admin)
		}
		if strings.Contains(admin.Value, adminToken) {
			t.Fatal("the cookie carries the token")
		}
	})
	me := getMe(t, base, admin)
	if me.CSRF == "" || me.Dev || !me.Can["DecideApprovals"] || !me.Can["ListWorkflows"] {
		t.Fatalf("admin /api/me: %+v", me)
	}
	sameSite := map[string]string{"Origin": base, "Sec-Fetch-Site": "same-origin"}
	with := func(extra map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range sameSite {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	const cancel = "/api/workflows/nope/cancel"

	t.Run("csrf", func(t *testing.T) {
		for name, hdr := range map[string]map[string]string{
			"missing": sameSite,
			"wrong":   with(map[string]string{"X-CSRF-Token": me.CSRF + "x"}),
			"other":   with(map[string]string{"X-CSRF-Token": strings.Repeat("A", len(me.CSRF))}),
		} {
			if code, body := call(t, base, http.MethodPost, cancel, admin, hdr, `{}`); code != http.StatusForbidden || body["code"] != "CSRF" {
				t.Errorf("%s CSRF token: %d %v, want 403 CSRF", name, code, body)
			}
		}
		// The right token reaches the orchestrator, which knows no such
		// workflow.
		if code, body := call(t, base, http.MethodPost, cancel, admin, with(map[string]string{"X-CSRF-Token": me.CSRF}), `{}`); code != http.StatusNotFound || body["code"] != "NOT_FOUND" {
			t.Fatalf("the right CSRF token: %d %v, want 404 NOT_FOUND from the orchestrator", code, body)
		}
	})

	t.Run("cross-site post", func(t *testing.T) {
		for name, hdr := range map[string]map[string]string{
			"origin":         with(map[string]string{"X-CSRF-Token": me.CSRF, "Origin": "https://evil.example"}),
			"sec-fetch-site": with(map[string]string{"X-CSRF-Token": me.CSRF, "Sec-Fetch-Site": "cross-site"}),
			"same-site":      with(map[string]string{"X-CSRF-Token": me.CSRF, "Origin": "http://other.localhost", "Sec-Fetch-Site": "same-site"}),
		} {
			if code, body := call(t, base, http.MethodPost, cancel, admin, hdr, `{}`); code != http.StatusForbidden || body["code"] != "CROSS_ORIGIN" {
				t.Errorf("%s: %d %v, want 403 CROSS_ORIGIN", name, code, body)
			}
		}
		// A login forced by another site (login CSRF) is refused too.
		req, _ := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader("token="+adminToken))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "https://evil.example")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
			t.Fatalf("cross-site login: %s with cookies %v, want 403 and none", resp.Status, resp.Cookies())
		}
	})

	t.Run("reader cannot approve", func(t *testing.T) {
		reader, _ := login(t, base, readerToken)
		if reader == nil {
			t.Fatal("the reader login set no cookie")
		}
		rme := getMe(t, base, reader)
		if rme.Can["DecideApprovals"] || rme.Can["CancelWorkflow"] || rme.Can["CreateAgent"] || !rme.Can["ListWorkflows"] || !rme.Can["ListApprovals"] {
			t.Fatalf("reader /api/me can: %v; want reads only", rme.Can)
		}
		body := `{"decisions": [{"toolUseId": "call_1", "approved": true}]}`
		code, out := call(t, base, http.MethodPost, "/api/workflows/nope/decide", reader, with(map[string]string{"X-CSRF-Token": rme.CSRF}), body)
		if code != http.StatusForbidden || out["code"] != "PERMISSION_DENIED" {
			t.Fatalf("reader decide: %d %v, want 403 PERMISSION_DENIED from the orchestrator", code, out)
		}
		// The admin's identical request reaches the workflow lookup.
		code, out = call(t, base, http.MethodPost, "/api/workflows/nope/decide", admin, with(map[string]string{"X-CSRF-Token": me.CSRF}), body)
		if code != http.StatusNotFound {
			t.Fatalf("admin decide: %d %v, want 404", code, out)
		}
		// A session's CSRF token is its own.
		if code, out := call(t, base, http.MethodPost, "/api/workflows/nope/decide", reader, with(map[string]string{"X-CSRF-Token": me.CSRF}), body); code != http.StatusForbidden || out["code"] != "CSRF" {
			t.Fatalf("reader with the admin's CSRF token: %d %v, want 403 CSRF", code, out)
		}
	})

	t.Run("logout", func(t *testing.T) {
		c, _ := login(t, base, adminToken)
		m := getMe(t, base, c)
		if code, _ := call(t, base, http.MethodPost, "/logout", c, with(map[string]string{"X-CSRF-Token": m.CSRF}), `{}`); code != http.StatusOK {
			t.Fatalf("logout: %d", code)
		}
		if code, _ := call(t, base, http.MethodGet, "/api/workflows", c, nil, ""); code != http.StatusUnauthorized {
			t.Fatalf("after logout: %d, want 401", code)
		}
	})
}

// TestDevHostCheck: the dev console (no login) answers only loopback Host
// names, so a page whose DNS name was rebound to 127.0.0.1 can read
// nothing; and its POSTs still need the CSRF token.
func TestDevHostCheck(t *testing.T) {
	srv := console.New(console.Options{Dev: true, Log: harness.Quiet()}, nil, nil, nil)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	for host, want := range map[string]int{"evil.example": http.StatusMisdirectedRequest, "evil.example:80": http.StatusMisdirectedRequest,
		"localhost": http.StatusOK, "127.0.0.1:7080": http.StatusOK, "[::1]:7080": http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, hs.URL+"/static/app.js", nil)
		req.Host = host
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %s, want %d", host, resp.Status, want)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, hs.URL+"/healthz", nil)
	req.Host = "10.0.0.7:7080" // the kubelet's probe, by pod IP
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz by pod IP: %s, want 200", resp.Status)
	}
	code, body := call(t, hs.URL, http.MethodPost, "/api/workflows/x/cancel", nil, map[string]string{"Origin": hs.URL}, `{}`)
	if code != http.StatusForbidden || body["code"] != "CSRF" {
		t.Fatalf("dev POST without the CSRF token: %d %v, want 403 CSRF", code, body)
	}
}
