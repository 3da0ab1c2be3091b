package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/a2agrpc"
	"github.com/a2aproject/a2a-go/a2apb"
	"github.com/a2aproject/a2a-go/a2asrv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/interceptor/auth"
)

// Defaults.
const (
	DefaultAddr     = "127.0.0.1:7076"
	DefaultHTTPAddr = "127.0.0.1:7077"
)

// The methods an auth policy names to allow the HTTP endpoints (as it
// names gRPC methods): "/neuron.gateway.HTTP/*" allows them all. The A2A
// gRPC transport is "/a2a.v1.A2AService/*".
const (
	MethodHTTPA2A  = "/neuron.gateway.HTTP/A2A"
	MethodHTTPMCP  = "/neuron.gateway.HTTP/MCP"
	MethodHTTPChat = "/neuron.gateway.HTTP/Chat"
)

// Config is the gateway's configuration.
type Config struct {
	// Server is the gRPC server (A2A's gRPC transport, health,
	// reflection).
	Server grpcserver.Config
	// HTTPAddr is the HTTP listen address (A2A JSON-RPC and agent cards,
	// MCP, the chat event stream).
	HTTPAddr string
	// Listener and HTTPListener, when set, are used instead of listening
	// on Server.Addr and HTTPAddr (tests).
	Listener, HTTPListener net.Listener
	// PublicURL is the HTTP base URL clients reach the gateway at, for
	// agent cards; empty: http://<the HTTP listen address>.
	PublicURL string
	// PublicGRPCAddr is the gRPC address put in agent cards; empty: the
	// gRPC listen address.
	PublicGRPCAddr string
	// Orchestrator is how to reach the orchestrator (and its
	// AgentService).
	Orchestrator grpcclient.Config
	// State, when its Target is set, serves the state_search MCP tool.
	State grpcclient.Config
	// Agents is where the agents come from: "orchestrator" (its
	// AgentService) or a registry file.
	Agents string
	// DefaultAgent answers A2A gRPC messages that name no agent, and
	// /.well-known/agent-card.json.
	DefaultAgent string
	// LaneDepth is how many messages may wait per session (0: 16).
	LaneDepth int
	// LaneLease is how long a replica's hold on a durable lane lasts
	// unless renewed: a live replica takes over the lanes of one that
	// died after it (0: DefaultLaneLease).
	LaneLease time.Duration
	// Channels are the chat channels (Slack, Telegram) and their route
	// table (channel.go).
	Channels ChannelsConfig
	// ScheduleCheck is how often due schedule ticks are looked for (0:
	// DefaultScheduleCheck).
	ScheduleCheck time.Duration
	// Clock, when set, is the schedules' clock instead of time.Now
	// (tests).
	Clock func() time.Time
	// Log is the logger.
	Log *slog.Logger
	// Ready, when set, is called with the gRPC and HTTP addresses once
	// both serve.
	Ready func(grpcAddr, httpAddr string)
}

// Run serves the gateway until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Server.Name == "" {
		cfg.Server.Name = "gateway"
	}
	if cfg.Orchestrator.Target == "" {
		return errors.New("--orchestrator-addr is required: the orchestrator the gateway sends messages to")
	}
	var policy *auth.Policy
	var opts []grpcserver.Option
	if !cfg.Server.Dev {
		if cfg.Server.AuthPolicy == "" {
			return fmt.Errorf("security is on: set --auth-policy (a principals file), or --dev for local development")
		}
		p, err := auth.LoadPolicy(cfg.Server.AuthPolicy)
		if err != nil {
			return err
		}
		policy = p
		opts = append(opts, grpcserver.WithPolicy(p))
	}
	srv, err := grpcserver.New(cfg.Server, log, opts...)
	if err != nil {
		return err
	}
	orchCfg := cfg.Orchestrator
	orchCfg.Dev, orchCfg.WaitForReady = orchCfg.Dev || cfg.Server.Dev, true
	cc, err := grpcclient.Dial(orchCfg)
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	defer cc.Close()
	var agents *Agents
	switch cfg.Agents {
	case "", AgentsFromOrchestrator:
		agents = OrchestratorAgents(agentv1.NewAgentServiceClient(cc))
	default:
		if agents, err = FileAgents(cfg.Agents); err != nil {
			return err
		}
	}
	var state statev1.StateServiceClient
	if cfg.State.Target != "" {
		stCfg := cfg.State
		stCfg.Dev = stCfg.Dev || cfg.Server.Dev
		sc, err := grpcclient.Dial(stCfg)
		if err != nil {
			return fmt.Errorf("state: %w", err)
		}
		defer sc.Close()
		state = statev1.NewStateServiceClient(sc)
	}

	lis := cfg.Listener
	if lis == nil {
		if lis, err = srv.Listen(); err != nil {
			return err
		}
	}
	hlis := cfg.HTTPListener
	if hlis == nil {
		addr := cfg.HTTPAddr
		if addr == "" {
			addr = DefaultHTTPAddr
		}
		if hlis, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("listen on %s (--http-addr): %w", addr, err)
		}
	}
	defer hlis.Close()
	public := strings.TrimSuffix(cfg.PublicURL, "/")
	if public == "" {
		public = "http://" + hlis.Addr().String()
		if !cfg.Server.Dev && cfg.Server.TLSCert != "" {
			public = "https://" + hlis.Addr().String()
		}
	}
	grpcAddr := cfg.PublicGRPCAddr
	if grpcAddr == "" {
		grpcAddr = lis.Addr().String()
	}

	runCtx, stopJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer stopJobs()
	g := New(runCtx, orchestratorv1.NewOrchestratorServiceClient(cc), agents, cfg.LaneDepth, log)
	if state != nil { // lanes, schedules and push configs live in the State service
		g.durable = newDurableLanes(g, newKV(state), cfg.LaneDepth, cfg.LaneLease) // resumed once the chat channels are on
		g.sched = &Scheduler{g: g, kv: newKV(state), now: cfg.Clock}
		if g.sched.now == nil {
			g.sched.now = time.Now
		}
		go g.sched.run(runCtx, cfg.ScheduleCheck)
		g.push = newPusher(g, newKV(state))
		go g.push.resume(runCtx)
	}
	// The A2A gRPC transport, behind the server's auth like any service.
	a2apb.RegisterA2AServiceServer(srv, a2agrpc.NewHandler(&A2AHandler{G: g, DefaultAgent: cfg.DefaultAgent}))

	h := &httpServer{g: g, policy: policy, public: public, grpcAddr: grpcAddr, defaultAgent: cfg.DefaultAgent, log: log, state: state}
	if h.channels, err = newChannels(ctx, g, cfg.Channels, cfg.DefaultAgent, log); err != nil {
		return err
	}
	if h.channels != nil {
		go h.channels.sweepLoop(runCtx)
	}
	if g.durable != nil { // after the channels: a resumed chat message's answer is posted
		go g.durable.resumeUntil(runCtx)
		go g.durable.rescanLoop(runCtx)
	}
	hs := &http.Server{Handler: h.routes(), ReadHeaderTimeout: 10 * time.Second}
	herr := make(chan error, 1)
	tlsOn := !cfg.Server.Dev && cfg.Server.TLSCert != ""
	go func() {
		if tlsOn { // the HTTP endpoints carry bearer tokens: HTTPS with the gRPC server's certificate
			herr <- hs.ServeTLS(hlis, cfg.Server.TLSCert, cfg.Server.TLSKey)
			return
		}
		herr <- hs.Serve(hlis)
	}()
	log.Info("HTTP SERVING", "addr", hlis.Addr().String(), "public_url", public, "tls", tlsOn)
	if cfg.Ready != nil {
		cfg.Ready(lis.Addr().String(), hlis.Addr().String())
	}
	gerr := srv.Serve(ctx, lis)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if err := <-herr; err != nil && !errors.Is(err, http.ErrServerClosed) && gerr == nil {
		gerr = err
	}
	return gerr
}

// httpServer serves the gateway's HTTP endpoints.
type httpServer struct {
	g            *Gateway
	policy       *auth.Policy // nil: dev mode, no authentication
	public       string
	grpcAddr     string
	defaultAgent string
	log          *slog.Logger
	state        statev1.StateServiceClient
	channels     *Channels // nil: no chat channel is on
}

func (h *httpServer) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /a2a", h.listCards)
	mux.HandleFunc("GET /a2a/{agent}/.well-known/agent-card.json", h.card)
	mux.HandleFunc("GET /.well-known/agent-card.json", h.card)
	mux.Handle("POST /a2a/{agent}", h.authed(MethodHTTPA2A, http.HandlerFunc(h.a2a)))
	mux.Handle("/mcp", h.authed(MethodHTTPMCP, h.mcpHandler()))
	mux.Handle("POST /v1/chat", h.authed(MethodHTTPChat, http.HandlerFunc(h.chat)))
	if h.channels != nil {
		h.channels.mount(mux, h.authed)
	}
	h.mountSchedules(mux)
	return mux
}

// card serves an agent's A2A card.
func (h *httpServer) card(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("agent")
	if name == "" {
		name = h.defaultAgent
	}
	if name == "" {
		httpError(w, fmt.Errorf("no default agent (the gateway's --default-agent): read /a2a for every agent's card, or /a2a/<agent>/.well-known/agent-card.json: %w", errs.NotFound))
		return
	}
	info, err := h.g.agents.Get(r.Context(), name)
	if err != nil {
		httpError(w, err)
		return
	}
	card := AgentCard(info, h.public+"/a2a/"+name, h.grpcAddr, h.policy != nil)
	card.Capabilities.PushNotifications = h.g.push != nil
	writeJSON(w, card)
}

// listCards serves every agent's card.
func (h *httpServer) listCards(w http.ResponseWriter, r *http.Request) {
	list, err := h.g.agents.List(r.Context())
	if err != nil {
		httpError(w, err)
		return
	}
	cards := make([]any, 0, len(list))
	for _, a := range list {
		card := AgentCard(a, h.public+"/a2a/"+a.Name, h.grpcAddr, h.policy != nil)
		card.Capabilities.PushNotifications = h.g.push != nil
		cards = append(cards, card)
	}
	writeJSON(w, map[string]any{"agents": cards})
}

// a2a serves A2A JSON-RPC for the agent in the path.
func (h *httpServer) a2a(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("agent")
	if err := h.g.agents.Check(r.Context(), name); err != nil {
		httpError(w, err)
		return
	}
	jsonrpcDeleteFix(a2asrv.NewJSONRPCHandler(&A2AHandler{G: h.g, Agent: name})).ServeHTTP(w, r)
}

// authed lets a request through when its bearer token names a principal
// of the policy allowed method (the same policy file as the gRPC
// server's); in dev mode every request.
func (h *httpServer) authed(method string, next http.Handler) http.Handler {
	if h.policy == nil {
		return next
	}
	check := auth.UnaryServerInterceptor(h.policy)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		md := metadata.MD{}
		if v := r.Header.Get("Authorization"); v != "" {
			md.Set("authorization", v)
		}
		ctx := metadata.NewIncomingContext(r.Context(), md)
		ctx = grpc.NewContextWithServerTransportStream(ctx, methodStream(method))
		_, err := check(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) { return nil, nil })
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="neuron gateway"`)
			httpError(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// methodStream is the gRPC method an HTTP request stands for, so that
// the auth interceptor reads it as grpc.Method.
type methodStream string

func (m methodStream) Method() string             { return string(m) }
func (methodStream) SetHeader(metadata.MD) error  { return nil }
func (methodStream) SendHeader(metadata.MD) error { return nil }
func (methodStream) SetTrailer(metadata.MD) error { return nil }
func (m methodStream) String() string             { return string(m) }

// httpError writes err as JSON with the HTTP status of its kind: 429 for
// a full lane, 401 and 403 for auth, 404, 400, 503, else 500.
func httpError(w http.ResponseWriter, err error) {
	st := errs.ToStatus(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus(st.Code()))
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": st.Code().String(), "message": st.Message()}})
}

func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499
	case codes.Unimplemented:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
