package console

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
)

// web is the front end: plain HTML, CSS and JavaScript modules, served as
// they are (no bundler, no build step, nothing from a CDN).
//
//go:embed web
var web embed.FS

// Options are the knobs of New.
type Options struct {
	// Dev serves without a login (see Config.Dev).
	Dev bool
	// Log receives the console's logs.
	Log *slog.Logger
	// SessionTTL and MaxSessions bound the sessions (Config).
	SessionTTL  time.Duration
	MaxSessions int
	// PlaintextTokens lets session tokens travel to the services without
	// TLS (the services were dialled in dev or plaintext mode).
	PlaintextTokens bool
	// TracesURL is the trace store's query API (Jaeger's, e.g.
	// http://127.0.0.1:16686) the trace viewer reads; empty: no viewer.
	TracesURL string
	// TracesService is the orchestrator's service name in the traces
	// (empty: DefaultTracesService).
	TracesService string
}

// Server is the console's HTTP handler: the embedded pages and a JSON
// and server-sent-events API over the services' gRPC clients.
type Server struct {
	opts   Options
	log    *slog.Logger
	orch   orchestratorv1.OrchestratorServiceClient
	agents agentv1.AgentServiceClient
	state  statev1.StateServiceClient

	sessions *sessions
	// dev is the one session of dev mode (its token is the dial's own).
	dev     *session
	devOnce sync.Once
	mux     *http.ServeMux
	assets  http.Handler
	// traceClient queries the trace store (TracesURL).
	traceClient *http.Client

	// closed ends the live streams when the server stops.
	closed    chan struct{}
	closeOnce sync.Once
}

// New returns the console's handler over the given clients.
func New(o Options, orch orchestratorv1.OrchestratorServiceClient, agents agentv1.AgentServiceClient, state statev1.StateServiceClient) *Server {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: o, log: log, orch: orch, agents: agents, state: state,
		sessions: newSessions(o.SessionTTL, o.MaxSessions), mux: http.NewServeMux(), closed: make(chan struct{}),
		traceClient: &http.Client{Timeout: traceTimeout}}
	if o.Dev {
		s.dev = &session{id: "dev", csrf: randomToken(), expires: time.Now().Add(100 * 365 * 24 * time.Hour)}
	}
	sub, err := fs.Sub(web, "web")
	if err != nil {
		panic(err) // the embedded tree always has web/
	}
	s.assets = http.FileServerFS(sub)
	s.routes()
	return s
}

// Close ends the live streams.
func (s *Server) Close() { s.closeOnce.Do(func() { close(s.closed) }) }

// routes registers every path. Handlers of /api/ get the session from
// authed; pages and assets are public (they hold no data).
func (s *Server) routes() {
	m := s.mux
	m.HandleFunc("GET /login", s.loginPage)
	m.HandleFunc("POST /login", s.login)
	m.HandleFunc("POST /logout", s.authed(s.logout))
	m.Handle("GET /static/", http.StripPrefix("/static/", s.assets))
	m.HandleFunc("GET /{$}", s.index)

	m.HandleFunc("GET /api/me", s.authed(s.me))
	m.HandleFunc("GET /api/workflows", s.authed(s.listWorkflows))
	m.HandleFunc("GET /api/workflows/live", s.authed(s.liveWorkflows))
	m.HandleFunc("POST /api/workflows", s.authed(s.startWorkflow))
	m.HandleFunc("GET /api/workflows/{id}", s.authed(s.getWorkflow))
	m.HandleFunc("GET /api/workflows/{id}/transcript", s.authed(s.transcript))
	m.HandleFunc("GET /api/workflows/{id}/trace", s.authed(s.workflowTrace))
	m.HandleFunc("GET /api/workflows/{id}/watch", s.authed(s.watchWorkflow))
	m.HandleFunc("POST /api/workflows/{id}/cancel", s.authed(s.cancelWorkflow))
	m.HandleFunc("POST /api/workflows/{id}/signal", s.authed(s.signalWorkflow))
	m.HandleFunc("POST /api/workflows/{id}/decide", s.authed(s.decide))
	m.HandleFunc("POST /api/workflows/{id}/limits", s.authed(s.updateLimits))
	m.HandleFunc("GET /api/approvals", s.authed(s.listApprovals))
	m.HandleFunc("GET /api/agents", s.authed(s.listAgents))
	m.HandleFunc("GET /api/agents/{name}", s.authed(s.getAgent))
	m.HandleFunc("POST /api/agents", s.authed(s.saveAgent))
	m.HandleFunc("GET /api/state/list", s.authed(s.stateList))
	m.HandleFunc("GET /api/state/read", s.authed(s.stateRead))
	m.HandleFunc("GET /api/state/search", s.authed(s.stateSearch))
}

// ServeHTTP implements http.Handler: the security headers on every
// answer, the Host check of dev mode, then the routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: with no-referrer a form post
	// carries "Origin: null", which sameOrigin refuses.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.URL.Path == "/healthz" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		// The kubelet's probe, by pod IP: before the Host check, and
		// nothing but "ok" (the services have health checks of their own).
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
		return
	}
	if s.opts.Dev && !loopbackHost(r.Host) {
		// Dev mode acts without a login: answer only names of this
		// machine, so a page whose DNS name was rebound to 127.0.0.1
		// cannot read or change anything.
		writeError(w, http.StatusMisdirectedRequest, "MISDIRECTED", "the dev console answers only localhost, 127.0.0.1 or [::1]: open it by one of those names")
		return
	}
	s.mux.ServeHTTP(w, r)
}

// loopbackHost reports whether a Host header names this machine.
func loopbackHost(host string) bool {
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		h = host
	}
	h = strings.Trim(h, "[]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// sessionOf is the request's session, or nil.
func (s *Server) sessionOf(r *http.Request) *session {
	if s.dev != nil {
		return s.dev
	}
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	return s.sessions.get(c.Value)
}

// sameOrigin reports whether a state-changing request came from the
// console's own pages: a cross-site (or same-site, other-origin) fetch or
// form post is refused whatever cookie it carries.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return false
		}
	}
	return true
}

// authed wraps an API handler: a session is required (401 without), and
// a state-changing method needs a same-origin request carrying the
// session's CSRF token in X-CSRF-Token (403 without).
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		sess := s.sessionOf(r)
		if sess == nil {
			writeError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "log in first: open /login")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if !sameOrigin(r) {
				writeError(w, http.StatusForbidden, "CROSS_ORIGIN", "refused: the request did not come from the console's own pages")
				return
			}
			if !sess.checkCSRF(r.Header.Get("X-CSRF-Token")) {
				writeError(w, http.StatusForbidden, "CSRF", "refused: missing or wrong X-CSRF-Token (reload the page)")
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
		}
		h(w, r, sess)
	}
}

// maxBodyBytes bounds a request body.
const maxBodyBytes = 4 << 20

// callOpts are the call options of a session's calls: its bearer token
// (none in dev mode, where the connection carries the dial's own).
func (s *Server) callOpts(sess *session) []grpc.CallOption {
	if sess.token == "" {
		return nil
	}
	return []grpc.CallOption{grpc.PerRPCCredentials(grpcclient.Bearer{Token: sess.token, AllowPlaintext: s.opts.PlaintextTokens})}
}

// index serves the single page; without a session, the login page.
func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	if s.sessionOf(r) == nil {
		http.Redirect(w, r, "/login", http.StatusSeeOther)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.ServeFileFS(w, r, web, "web/index.html")
}

// loginPage serves the login form (dev mode has none: it goes home).
func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.dev != nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.ServeFileFS(w, r, web, "web/login.html")
}

// login checks a token against the services and starts a session. The
// form posts token=...; a failure goes back to /login?error=CODE.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.dev != nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	fail := func(code string) { http.Redirect(w, r, "/login?error="+code, http.StatusSeeOther) }
	if !sameOrigin(r) {
		// A login forced by another site would log the victim in as
		// the attacker.
		writeError(w, http.StatusForbidden, "CROSS_ORIGIN", "refused: the login did not come from the console's own page")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		fail("form")
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("token"))
	if token == "" || strings.ContainsAny(token, "\r\n") {
		fail("empty")
		return
	}
	probe := &session{token: token}
	res := s.probeAll(r.Context(), s.callOpts(probe))
	switch {
	case res.unauthenticated:
		// A service that does not authenticate (dev) accepts any token:
		// one that does and refuses it decides.
		s.log.Warn("login refused: a service does not know the token", "remote", r.RemoteAddr)
		fail("token")
		return
	case !res.known:
		fail("unavailable")
		return
	}
	sess := s.sessions.create(token, res.can)
	http.SetCookie(w, s.sessions.cookie(sess))
	s.log.Info("login", "remote", r.RemoteAddr)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// logout ends the session.
func (s *Server) logout(w http.ResponseWriter, r *http.Request, sess *session) {
	if s.dev != nil {
		writeJSON(w, map[string]any{"dev": true})
		return
	}
	s.sessions.drop(sess.id)
	http.SetCookie(w, s.sessions.cookie(nil))
	writeJSON(w, map[string]any{"loggedOut": true})
}

// me is what the pages need first: dev mode, the CSRF token, and what
// the principal may call.
func (s *Server) me(w http.ResponseWriter, r *http.Request, sess *session) {
	if s.dev != nil {
		s.devOnce.Do(func() {
			res := s.probeAll(context.WithoutCancel(r.Context()), nil)
			for k, v := range res.can {
				sess.setCan(k, v)
			}
		})
	}
	writeJSON(w, map[string]any{"dev": s.dev != nil, "csrf": sess.csrf, "can": sess.caps(), "traces": s.opts.TracesURL != ""})
}

// writeJSON writes v as a JSON answer.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
