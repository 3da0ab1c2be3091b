package environment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/interceptor/errmap"
	"github.com/secbear/neuron/pkg/scope"
)

// bridgeLimits bound what one invocation can hold open on its state
// bridge, so that an invocation that opens thousands of connections
// costs the service at most MaxConns descriptors and MaxConns *
// MaxStreams calls in flight, and never the other invocations theirs.
type bridgeLimits struct {
	// MaxConns is the most connections open at once. One past it is
	// closed as soon as it is accepted: never queued.
	MaxConns int
	// MaxStreams is the most concurrent calls on one connection.
	MaxStreams uint32
	// Handshake is how long a new connection has to send the HTTP/2
	// preface before it is closed.
	Handshake time.Duration
	// Idle closes a connection with no call in flight for this long.
	Idle time.Duration
	// Ping is how often a quiet connection is pinged, and PingTimeout
	// how long the server waits for the answer before closing it.
	Ping, PingTimeout time.Duration
	// CallTimeout bounds each call forwarded to the state service.
	CallTimeout time.Duration
	// MaxRecvBytes caps a request message (scope, key, query: small).
	MaxRecvBytes int
}

// defaultBridgeLimits are the limits of every invocation's state bridge.
// The operator itself uses one connection and one call at a time.
func defaultBridgeLimits() bridgeLimits {
	return bridgeLimits{
		MaxConns:     16,
		MaxStreams:   16,
		Handshake:    5 * time.Second,
		Idle:         time.Minute,
		Ping:         30 * time.Second,
		PingTimeout:  10 * time.Second,
		CallTimeout:  30 * time.Second,
		MaxRecvBytes: 64 << 10,
	}
}

// readableScopes are the scopes one invocation may read through its
// bridge: its input's session, and its dispatch's workflow and agent,
// plus the global and custom scopes its config's memory_scopes name (set
// by the orchestrator from the agent's definition, which a dispatch can
// only narrow; the memory tools read them). Everything else (other
// sessions, workflows and agents, scopes not named) belongs to other
// tenants or to the orchestrator.
type readableScopes []*typesv1.Scope

// invocationScopes returns the scopes in may read. Ids that are not
// valid scope ids give no scope.
func invocationScopes(in *operatorv1.OperatorInput) readableScopes {
	var out readableScopes
	add := func(s *typesv1.Scope) {
		if scope.Validate(s) == nil {
			out = append(out, s)
		}
	}
	if in.SessionId != nil {
		add(scope.Session(in.GetSessionId()))
	}
	if w := in.GetDispatch().GetWorkflowId(); w != "" {
		add(scope.Workflow(w))
		if a := in.GetDispatch().GetAgentId(); a != "" {
			add(scope.Agent(w, a))
		}
	}
	for _, name := range in.GetConfig().GetMemoryScopes() {
		switch {
		case name == "global":
			add(scope.Global())
		case strings.HasPrefix(name, "custom:"):
			add(scope.Custom(strings.TrimPrefix(name, "custom:")))
		}
	}
	return out
}

// check returns nil when s is one of r, else PERMISSION_DENIED naming the
// scope refused and the scopes r allows.
func (r readableScopes) check(s *typesv1.Scope) error {
	for _, ok := range r {
		if scope.Equal(ok, s) {
			return nil
		}
	}
	what := "scope " + clip(scope.String(s))
	if s == nil || s.GetKind() == nil {
		what = "a request with no scope"
	}
	return fmt.Errorf("%s is not readable by this invocation; %s: %w", what, r, errs.PermissionDenied)
}

// String says what r allows, for error messages.
func (r readableScopes) String() string {
	if len(r) == 0 {
		return "it may read no scope (its input names no session and its dispatch no workflow)"
	}
	names := make([]string, len(r))
	for i, s := range r {
		names[i] = scope.String(s)
	}
	return "it may read only " + strings.Join(names, ", ") + " (its input's session, its dispatch's workflow and agent, and the scopes its memory_scopes name)"
}

// clip shortens an attacker-chosen string for an error message.
func clip(s string) string {
	const limit = 200
	if len(s) <= limit {
		return s
	}
	return strings.ToValidUTF8(s[:limit], "") + "..."
}

// stateReader is the StateService an invocation sees: Read, List and
// Search of the invocation's own scopes go to the real state service;
// other scopes are PERMISSION_DENIED; Write and Delete are refused, so
// the read/write asymmetry (operators declare effects, the orchestrator
// writes) holds inside the sandbox whatever the operator runs.
type stateReader struct {
	statev1.UnimplementedStateServiceServer
	client  statev1.StateServiceClient
	scopes  readableScopes
	timeout time.Duration
}

func (r stateReader) forward(ctx context.Context, s *typesv1.Scope) (context.Context, context.CancelFunc, error) {
	if err := r.scopes.check(s); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	return ctx, cancel, nil
}

func (r stateReader) Read(ctx context.Context, req *statev1.ReadRequest) (*statev1.ReadResponse, error) {
	ctx, cancel, err := r.forward(ctx, req.GetScope())
	if err != nil {
		return nil, err
	}
	defer cancel()
	resp, err := r.client.Read(ctx, req)
	return resp, errs.FromGRPC(err)
}

func (r stateReader) List(ctx context.Context, req *statev1.ListRequest) (*statev1.ListResponse, error) {
	ctx, cancel, err := r.forward(ctx, req.GetScope())
	if err != nil {
		return nil, err
	}
	defer cancel()
	resp, err := r.client.List(ctx, req)
	return resp, errs.FromGRPC(err)
}

// Search names exactly one scope (SearchRequest.scope), so checking it
// keeps results from any other scope out.
func (r stateReader) Search(ctx context.Context, req *statev1.SearchRequest) (*statev1.SearchResponse, error) {
	ctx, cancel, err := r.forward(ctx, req.GetScope())
	if err != nil {
		return nil, err
	}
	defer cancel()
	resp, err := r.client.Search(ctx, req)
	return resp, errs.FromGRPC(err)
}

func (stateReader) Write(context.Context, *statev1.WriteRequest) (*statev1.WriteResponse, error) {
	return nil, fmt.Errorf("an invocation has read-only access to state; declare a write_memory effect instead: %w", errs.PermissionDenied)
}

func (stateReader) Delete(context.Context, *statev1.DeleteRequest) (*statev1.DeleteResponse, error) {
	return nil, fmt.Errorf("an invocation has read-only access to state; declare a delete_memory effect instead: %w", errs.PermissionDenied)
}

// capListener accepts at most cap(slots) connections at once. A
// connection past the cap is closed as soon as it is accepted, so an
// invocation that opens thousands neither holds the service's file
// descriptors nor waits in a queue.
type capListener struct {
	net.Listener
	slots   chan struct{}
	refused atomic.Int64
	log     *slog.Logger
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
		default:
			c.Close()
			if l.refused.Add(1) == 1 {
				l.log.Warn("state bridge: closing connections over the cap", "max_connections", cap(l.slots))
			}
		}
	}
}

// slotConn gives its slot back when closed.
type slotConn struct {
	net.Conn
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// serveStateBridge serves, on a Unix socket at path, a StateService for
// one invocation: reads of scopes go to client, other scopes and every
// write are refused, and lim bounds the connections and calls.
func serveStateBridge(path string, client statev1.StateServiceClient, scopes readableScopes, lim bridgeLimits, log *slog.Logger) (func(), error) {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("state bridge: %w", err)
	}
	// The sandboxed operator may run as another uid.
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("state bridge: %w", err)
	}
	capped := &capListener{Listener: l, slots: make(chan struct{}, max(lim.MaxConns, 1)), log: log}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(errmap.UnaryServerInterceptor(errmap.WithLogger(log))),
		grpc.MaxConcurrentStreams(max(lim.MaxStreams, 1)),
		grpc.MaxRecvMsgSize(lim.MaxRecvBytes),
		grpc.ConnectionTimeout(lim.Handshake),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: lim.Idle, Time: lim.Ping, Timeout: lim.PingTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	statev1.RegisterStateServiceServer(srv, stateReader{client: client, scopes: scopes, timeout: lim.CallTimeout})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(capped); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			log.Warn("state bridge stopped", "error", err.Error())
		}
	}()
	return func() {
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			srv.Stop()
		}
		<-done
		_ = os.Remove(path)
		if n := capped.refused.Load(); n > 0 {
			log.Warn("state bridge: connections closed over the cap", "refused", n, "max_connections", cap(capped.slots))
		}
	}, nil
}
