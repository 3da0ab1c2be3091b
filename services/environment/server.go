package environment

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment/scrub"
	"github.com/secbear/neuron/services/environment/workspace"
)

// ServerConfig configures a Server: the EnvironmentService itself, with
// its backends already built. Run builds one from a Config; tests and
// embedders that bring their own backends may call NewServer directly.
type ServerConfig struct {
	// Backends are the configured backends; names must be unique.
	Backends []Backend
	// Default names the backend for specs that ask for no particular
	// boundary (no isolation, or only network_policy).
	Default string
	// Process names the backend for the process boundary ("" when none).
	Process string
	// Container names the backend for the container boundary, and for
	// gvisor ("" when none).
	Container string
	// Secrets resolves credential names.
	Secrets SecretSource
	// Defaults fills in what a spec leaves unset.
	Defaults Defaults
	// Egress is the administrator's egress settings; nil means egress
	// proxies cannot be started, so a spec that allows any network is
	// refused.
	Egress EgressFactory
	// EgressListen starts an invocation's egress proxy on a TCP listener
	// of the backend's (Invocation.EgressListener); nil: backends get
	// none.
	EgressListen EgressListenFactory
	// State is the state service invocations read their session history
	// from, through a read-only bridge that serves only the invocation's
	// own scopes (its session, its dispatch's workflow and agent); nil
	// when there is none.
	State statev1.StateServiceClient
	// MaxConcurrent is the most invocations this service runs at once;
	// a Run past it is RESOURCE_EXHAUSTED at once, never queued. Zero or
	// less means DefaultMaxConcurrent.
	MaxConcurrent int
	// Progress bounds each RunStream invocation's progress events; zero
	// fields take DefaultProgressLimits.
	Progress ProgressLimits
	// Exec, when set, is the exec-boundary middleware (BOUNDARY_EXEC of
	// layer0.middleware.v1): consulted before and after each Run and
	// RunStream, as a unary interceptor of Run (the unary interceptor
	// of remote.Middleware.ExecServerInterceptors). RunStream goes
	// through it as a Run whose handler streams: a HALT before answers
	// with its MIDDLEWARE_HALT output as the only message, a MODIFY
	// before runs the replacement input, and after the run its verdict
	// applies to the result (the progress already sent is not
	// intercepted, as for the operator's ExecuteStream). Each sandbox
	// Exec goes through it as a Run too (execInput, execOutput). Nil:
	// none.
	Exec grpc.UnaryServerInterceptor
	// Workspaces keeps the workspaces that last (a session's or a
	// workflow's) and serves their files; nil: a spec asking for one is
	// refused, and the workspace RPCs are FAILED_PRECONDITION.
	Workspaces *workspace.Store
	// Log is the service logger.
	Log *slog.Logger
}

// DefaultMaxConcurrent is ServerConfig.MaxConcurrent (and
// Config.MaxConcurrent) when unset.
const DefaultMaxConcurrent = 64

// EgressFactory starts an egress proxy for one invocation on a Unix socket
// at path, enforcing policy. creds are every credential of the invocation:
// the proxy injects the sidecar ones and keeps every value out of its logs.
type EgressFactory func(path string, policy NetworkPolicy, creds []Credential, log *slog.Logger) (stop func(), err error)

// runGrace is how long past an invocation's timeout the server waits for
// its backend to report before giving up on it.
const runGrace = 30 * time.Second

// Server implements EnvironmentService.
type Server struct {
	environmentv1.UnimplementedEnvironmentServiceServer
	cfg      ServerConfig
	backends map[string]Backend
	// running holds one token per invocation in progress; its capacity
	// is cfg.MaxConcurrent.
	running chan struct{}
	// sb are the sandbox sessions (CreateSandbox).
	sb sandboxes
}

// NewServer checks cfg and returns the server.
func NewServer(cfg ServerConfig) (*Server, error) {
	s := &Server{cfg: cfg, backends: map[string]Backend{}}
	for _, b := range cfg.Backends {
		if _, dup := s.backends[b.Name()]; dup {
			return nil, fmt.Errorf("environment: backend %q configured twice", b.Name())
		}
		s.backends[b.Name()] = b
	}
	for role, name := range map[string]string{"default": cfg.Default, "process": cfg.Process, "container": cfg.Container} {
		if name == "" && role != "default" {
			continue
		}
		if _, ok := s.backends[name]; !ok {
			return nil, fmt.Errorf("environment: the %s backend %q is not configured", role, name)
		}
	}
	if s.cfg.Secrets == nil {
		s.cfg.Secrets = DirSecrets{}
	}
	if s.cfg.Log == nil {
		s.cfg.Log = slog.New(slog.DiscardHandler)
	}
	if s.cfg.Defaults.Timeout <= 0 {
		s.cfg.Defaults = DefaultDefaults()
	}
	if s.cfg.MaxConcurrent <= 0 {
		s.cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	s.running = make(chan struct{}, s.cfg.MaxConcurrent)
	return s, nil
}

// choose picks the backend that enforces spec's outermost boundaries.
func (s *Server) choose(spec *environmentv1.EnvironmentSpec) (Backend, error) {
	name, role, why := s.cfg.Default, "default", ""
	for _, k := range Kinds(spec) {
		switch k {
		case KindContainer, KindGvisor:
			name, role, why = s.cfg.Container, "container", "isolation "+k+" needs a container backend: "
		case KindProcess:
			if role == "default" {
				name, role, why = s.cfg.Process, "process", "isolation process needs the process backend: "
			}
		case KindNetworkPolicy:
		default:
			return nil, fmt.Errorf("no backend of this environment service enforces isolation %s (configured: %s): %w", k, s.names(), errs.FailedPrecondition)
		}
	}
	if name == "" {
		return nil, fmt.Errorf("%sthis environment service has no %s backend (configured: %s): %w", why, role, s.names(), errs.FailedPrecondition)
	}
	b := s.backends[name]
	if err := b.Check(spec); err != nil {
		return nil, err
	}
	return b, nil
}

func (s *Server) names() string {
	var out []string
	for _, b := range s.cfg.Backends {
		out = append(out, b.Name())
	}
	return strings.Join(out, ", ")
}

// Run implements EnvironmentService.Run.
func (s *Server) Run(ctx context.Context, req *environmentv1.RunRequest) (*environmentv1.RunResponse, error) {
	return s.intercept(ctx, req, func(ctx context.Context, req *environmentv1.RunRequest) (*environmentv1.RunResponse, error) {
		return s.invoke(ctx, req, nil)
	})
}

// runInfo is what the exec middleware is told of each invocation: a Run.
var runInfo = &grpc.UnaryServerInfo{FullMethod: environmentv1.EnvironmentService_Run_FullMethodName}

// intercept runs run through the exec middleware (ServerConfig.Exec),
// when there is one, as the Run it is.
func (s *Server) intercept(ctx context.Context, req *environmentv1.RunRequest, run func(context.Context, *environmentv1.RunRequest) (*environmentv1.RunResponse, error)) (*environmentv1.RunResponse, error) {
	if s.cfg.Exec == nil {
		return run(ctx, req)
	}
	resp, err := s.cfg.Exec(ctx, req, runInfo, func(ctx context.Context, r any) (any, error) {
		rr, ok := r.(*environmentv1.RunRequest)
		if !ok {
			return nil, fmt.Errorf("the exec middleware passed on a %T, not a RunRequest: %w", r, errs.Internal)
		}
		return run(ctx, rr)
	})
	if err != nil {
		return nil, err
	}
	out, ok := resp.(*environmentv1.RunResponse)
	if !ok || out == nil {
		return nil, fmt.Errorf("the exec middleware answered a %T, not a RunResponse: %w", resp, errs.Internal)
	}
	return out, nil
}

// RunStream implements EnvironmentService.RunStream: Run, with the
// operator's progress events sent as they come (checked, bounded and
// scrubbed by Progress), then the result. The run goes on in another
// goroutine while this one sends; a caller that reads slowly holds the
// events in a bounded queue and then the operator itself, never more
// memory. When the caller goes away the run is canceled.
func (s *Server) RunStream(req *environmentv1.RunStreamRequest, stream environmentv1.EnvironmentService_RunStreamServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	lim := s.cfg.Progress.withDefaults()
	q := newProgressQueue(lim.QueueBytes)
	var (
		resp *environmentv1.RunResponse
		err  error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err = s.intercept(ctx, &environmentv1.RunRequest{Input: req.GetInput(), Spec: req.GetSpec()}, func(ctx context.Context, r *environmentv1.RunRequest) (*environmentv1.RunResponse, error) {
			return s.invoke(ctx, r, q)
		})
	}()
	var sendErr error
	send := func(it queued) {
		if sendErr == nil {
			if sendErr = stream.Send(&environmentv1.RunStreamResponse{Kind: &environmentv1.RunStreamResponse_Progress{Progress: it.ev}}); sendErr != nil {
				cancel() // the caller is gone: stop the run
			}
		}
		q.release(it.size)
	}
	for running := true; running; {
		select {
		case it := <-q.ch:
			send(it)
		case <-done:
			running = false
		}
	}
	// What was queued before the run ended.
	for drained := false; !drained; {
		select {
		case it := <-q.ch:
			send(it)
		default:
			drained = true
		}
	}
	if err != nil {
		return err
	}
	if sendErr != nil {
		return sendErr
	}
	return stream.Send(&environmentv1.RunStreamResponse{Kind: &environmentv1.RunStreamResponse_Result{Result: resp}})
}

// invoke runs one invocation for Run (q nil) or RunStream (q takes the
// progress events).
func (s *Server) invoke(ctx context.Context, req *environmentv1.RunRequest, q *progressQueue) (*environmentv1.RunResponse, error) {
	start := time.Now()
	// One token per invocation, taken before any work: a full service
	// answers at once instead of queueing callers or starting more
	// sandboxes, bridges and proxies than the host can hold.
	select {
	case s.running <- struct{}{}:
		defer func() { <-s.running }()
	default:
		s.cfg.Log.Warn("run refused: concurrent invocation limit reached", "max_concurrent", s.cfg.MaxConcurrent)
		return nil, fmt.Errorf("this environment service is already running its limit of %d concurrent invocations (max-concurrent); retry later: %w", s.cfg.MaxConcurrent, errs.ResourceExhausted)
	}
	inv, backend, err := s.prepare(ctx, req)
	if err != nil {
		return nil, err
	}
	scrubber := inv.scrubber
	if inv.Workspace != nil {
		// Runs of one workspace take turns: each finds what the last
		// one left. The wait is bounded by the run's own timeout, and
		// the run's time starts once it has the workspace.
		wctx, wcancel := context.WithTimeout(ctx, inv.Timeout)
		unlock, err := s.cfg.Workspaces.Lock(wctx, inv.Workspace.Name)
		wcancel()
		if err != nil && ctx.Err() != nil {
			return nil, s.scrubError(scrubber, ctx.Err()) // the caller gave up
		}
		if err != nil {
			return nil, fmt.Errorf("%v; retry once the other run of the workspace has ended: %w", err, errs.Unavailable)
		}
		defer unlock()
	}

	// The backend enforces inv.Timeout itself and reports it; this
	// context is only a safety net against a backend that hangs. A
	// progress event that breaks the rules cancels it too, which stops
	// the sandbox.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	ctx, cancel := context.WithTimeout(ctx, inv.Timeout+runGrace)
	defer cancel()
	if q != nil {
		inv.Progress = newProgress(s.cfg.Progress, scrubber, q, stop, inv.Log)
	}
	inv.Log.Info("run", "backend", backend.Name(), "timeout", inv.Timeout.String(), "credentials", len(inv.Credentials), "stream", q != nil)
	ctx, endTrace := traceRun(ctx, inv, backend.Name())
	res, err := backend.Run(ctx, inv)
	if inv.Progress != nil {
		inv.Progress.finish()
		if perr := inv.Progress.Err(); perr != nil {
			// The run was stopped for its progress: that is why it
			// ended, whatever the backend saw.
			err = perr
		}
	}
	// The operator's spans leave res.Logs here, before it is logged.
	endTrace(res, err)
	if err != nil {
		err = s.scrubError(scrubber, err)
		if res != nil && len(res.Logs) > 0 {
			inv.Log.Warn("operator diagnostics", "stderr", string(scrubber.Bytes(res.Logs)))
		}
		inv.Log.Warn("run failed", "backend", backend.Name(), "code", errs.Code(err).String(), "error", err.Error(), "duration", time.Since(start).String())
		return nil, err
	}
	if n := scrubber.Message(res.Output); n > 0 {
		inv.Log.Warn("secrets scrubbed from the output", "replacements", n)
	}
	if len(res.Logs) > 0 {
		inv.Log.Debug("operator diagnostics", "stderr", string(scrubber.Bytes(res.Logs)))
	}
	inv.Log.Info("run complete", "backend", backend.Name(), "duration", time.Since(start).String(),
		"exit", res.Output.GetExitReason().GetKind().String())
	return &environmentv1.RunResponse{
		Output:   res.Output,
		Backend:  backend.Name(),
		Duration: durationpb.New(time.Since(start)),
		Usage:    res.Usage,
	}, nil
}

// prepare validates the request and resolves it into an invocation.
func (s *Server) prepare(ctx context.Context, req *environmentv1.RunRequest) (*Invocation, Backend, error) {
	spec := req.GetSpec()
	if req.GetInput() == nil || spec == nil {
		return nil, nil, fmt.Errorf("input and spec are required: %w", errs.InvalidArgument)
	}
	timeout, err := s.cfg.Defaults.ParseTimeout(spec)
	if err != nil {
		return nil, nil, err
	}
	limits, err := s.cfg.Defaults.ParseLimits(spec.GetResources())
	if err != nil {
		return nil, nil, err
	}
	network, err := ParseNetwork(spec)
	if err != nil {
		return nil, nil, err
	}
	backend, err := s.choose(spec)
	if err != nil {
		return nil, nil, err
	}
	ws, err := s.workspaceOf(req.GetInput(), spec, backend)
	if err != nil {
		return nil, nil, err
	}
	byRef := false
	if r, ok := backend.(ByReference); ok {
		byRef = r.SecretsByReference()
	}
	var (
		creds    []Credential
		sidecars []Credential
		vars     = map[string]bool{}
		paths    = map[string]bool{}
	)
	for i, ref := range spec.GetCredentials() {
		c := Credential{Name: ref.GetName(), Injection: ref.GetInjection()}
		switch m := c.Injection.GetMethod().(type) {
		case *environmentv1.CredentialInjection_EnvVar:
			v := m.EnvVar.GetVarName()
			if vars[v] {
				return nil, nil, fmt.Errorf("credentials[%d]: environment variable %s is injected twice: %w", i, v, errs.InvalidArgument)
			}
			vars[v] = true
			if why := RefusedEnv(v); why != "" {
				return nil, nil, fmt.Errorf("credentials[%d]: environment variable %q %s; no credential sets it, choose another name: %w", i, v, why, errs.FailedPrecondition)
			}
		case *environmentv1.CredentialInjection_File:
			p := m.File.GetPath()
			if paths[p] {
				return nil, nil, fmt.Errorf("credentials[%d]: file %s is injected twice: %w", i, p, errs.InvalidArgument)
			}
			paths[p] = true
			if why := RefusedFile(path.Clean(p)); why != "" {
				return nil, nil, fmt.Errorf("credentials[%d]: file path %q %s; choose a path such as /run/secrets/NAME: %w", i, p, why, errs.FailedPrecondition)
			}
		case *environmentv1.CredentialInjection_Sidecar:
			if h := m.Sidecar.GetHeader(); h != "" && !validHeader(h) {
				return nil, nil, fmt.Errorf("credentials[%d]: %q is not an HTTP header name: %w", i, h, errs.InvalidArgument)
			}
		}
		// A sidecar credential is injected by the service's own egress
		// proxy, so its value comes from the service's secrets even for
		// a backend that hands the others over by reference.
		if !byRef || c.Injection.GetSidecar() != nil {
			v, err := s.cfg.Secrets.Secret(ctx, c.Name)
			if err != nil {
				return nil, nil, fmt.Errorf("credentials[%d]: %w", i, err)
			}
			c.Value = v
		}
		if c.Injection.GetSidecar() != nil {
			sidecars = append(sidecars, c)
		}
		creds = append(creds, c)
	}
	inputJSON, err := protojson.Marshal(req.GetInput())
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the input: %v: %w", err, errs.Internal)
	}
	id := newID()
	var secrets []string
	for _, c := range creds {
		secrets = append(secrets, c.Value)
	}
	scrubber := scrub.New(secrets)
	inv := &Invocation{
		ID:          id,
		Input:       req.GetInput(),
		InputJSON:   inputJSON,
		Spec:        spec,
		Limits:      limits,
		Timeout:     timeout,
		Network:     network,
		Credentials: creds,
		// Whatever this invocation logs, here or in its backend, bridge
		// and egress proxy, is scrubbed of its injected values: a
		// sandbox can choose a credential as a key or a host name.
		Log:       slog.New(scrub.NewHandler(s.cfg.Log.Handler(), scrubber)).With("invocation", id),
		Workspace: ws,
		scrubber:  scrubber,
	}
	if s.cfg.State != nil {
		// The bridge reads only the scopes this invocation owns: its
		// session and its dispatch's workflow and agent.
		scopes := invocationScopes(req.GetInput())
		inv.State = func(path string) (func(), error) {
			return serveStateBridge(path, s.cfg.State, scopes, defaultBridgeLimits(), inv.Log)
		}
	}
	if !network.AllowsNothing() || len(sidecars) > 0 {
		if s.cfg.Egress == nil {
			return nil, nil, fmt.Errorf("the spec allows network egress, but this environment service runs no egress proxy: %w", errs.FailedPrecondition)
		}
		inv.Egress = func(path string) (func(), error) {
			return s.cfg.Egress(path, network, creds, inv.Log)
		}
		if s.cfg.EgressListen != nil {
			inv.EgressListener = func(l net.Listener, token string) (func(), error) {
				return s.cfg.EgressListen(l, token, network, creds, inv.Log)
			}
		}
	}
	return inv, backend, nil
}

// scrubError rebuilds err's status with a scrubbed message.
func (s *Server) scrubError(sc *scrub.Scrubber, err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("the caller canceled the run; every process of the invocation was stopped: %w", errs.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the deadline passed before the run ended; every process of the invocation was stopped: %w", errs.DeadlineExceeded)
	}
	st := errs.ToStatus(err).Proto()
	st.Message = sc.String(st.GetMessage())
	return errs.FromGRPC(status.FromProto(st).Err())
}

// validHeader reports whether h is an HTTP header field name (a token).
func validHeader(h string) bool {
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)) {
			return false
		}
	}
	return h != ""
}

// newID returns a random invocation id: "inv-" and 16 hex digits.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "inv-" + hex.EncodeToString(b[:])
}
