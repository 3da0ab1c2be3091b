package environment_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/state"
)

// stateService is a state service under test: a client of it, and its
// address.
type stateService struct {
	statev1.StateServiceClient
	addr string
}

// startState serves the state service with its memory backend on
// loopback, started as its binary starts it (state.Run).
func startState(t *testing.T) stateService {
	t.Helper()
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{
			Server:   grpcserver.Config{Name: "state", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:      harness.Quiet(),
			Listener: lis,
			Backend:  state.BackendMemory,
		})
	})
	return stateService{StateServiceClient: statev1.NewStateServiceClient(harness.Dial(t, addr)), addr: addr}
}

// With a state service configured, an invocation that names a session
// runs (the operator reads its history through the read-only bridge);
// inside, the bridge serves reads and refuses writes.
func TestStateBridge(t *testing.T) {
	requireSandbox(t)
	st := startState(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := st.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("s1"), Key: "notes/x", Value: structpb.NewStringValue("visible")}); err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, envOptions{state: st.addr})
	resp, err := e.client.Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{Message: textContent("hello again"), SessionId: proto.String("s1")},
		Spec:  &environmentv1.EnvironmentSpec{},
	})
	if err != nil {
		t.Fatalf("a session invocation through the bridge: %v", err)
	}
	if !strings.Contains(text(resp), "You said: hello again") {
		t.Errorf("output %q", text(resp))
	}
	// Without a state service, the operator refuses a session clearly.
	plain := startEnv(t, envOptions{})
	_, err = plain.client.Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{Message: textContent("hi"), SessionId: proto.String("s1")},
		Spec:  &environmentv1.EnvironmentSpec{},
	})
	if err == nil {
		t.Error("a session invocation without a state service succeeded")
	}
}

// The bridge itself: reads pass through, writes and deletes are
// PERMISSION_DENIED, and nothing reaches the real store.
func TestStateBridgeReadOnly(t *testing.T) {
	st := startState(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := st.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("s1"), Key: "k", Value: structpb.NewStringValue("v")}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shortTemp(t), "state.sock")
	stop, err := environment.ServeStateBridgeForTest(sock, st, &operatorv1.OperatorInput{SessionId: proto.String("s1")})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bridge := statev1.NewStateServiceClient(conn)
	got, err := bridge.Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "k"})
	if err != nil || got.GetValue().GetStringValue() != "v" {
		t.Fatalf("read through the bridge: %v %v", got, err)
	}
	if _, err := bridge.List(ctx, &statev1.ListRequest{Scope: scope.Session("s1")}); err != nil {
		t.Errorf("list: %v", err)
	}
	_, err = bridge.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("s1"), Key: "k", Value: structpb.NewStringValue("overwritten")})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "write_memory") {
		t.Errorf("write through the bridge: %v", err)
	}
	_, err = bridge.Delete(ctx, &statev1.DeleteRequest{Scope: scope.Session("s1"), Key: "k"})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("delete through the bridge: %v", err)
	}
	if got, _ := st.Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "k"}); got.GetValue().GetStringValue() != "v" {
		t.Errorf("the store changed: %v", got)
	}
	// A missing key keeps its code through the bridge.
	if _, err := bridge.Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "missing"}); status.Code(err) != codes.NotFound {
		t.Errorf("missing key: %v", err)
	}
}

// dialBridge serves a bridge for input on a fresh socket and returns a
// client of it.
func dialBridge(t *testing.T, st statev1.StateServiceClient, input *operatorv1.OperatorInput) statev1.StateServiceClient {
	t.Helper()
	sock := filepath.Join(shortTemp(t), "state.sock")
	stop, err := environment.ServeStateBridgeForTest(sock, st, input)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return statev1.NewStateServiceClient(conn)
}

// The bridge reads only the invocation's own scopes: its input's session
// and its dispatch's workflow and agent. Every other scope (another
// session, workflow or agent, the global scope, a custom scope, no scope
// at all) is PERMISSION_DENIED for Read, List and Search alike, with a
// message naming the scope refused and what the invocation may read, and
// nothing of it comes back.
func TestStateBridgeScopes(t *testing.T) {
	st := startState(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	all := []*typesv1.Scope{
		scope.Session("s1"), scope.Session("s2"), scope.Session("wf1"),
		scope.Workflow("wf1"), scope.Workflow("wf2"), scope.Workflow("s1"),
		scope.Agent("wf1", "a1"), scope.Agent("wf1", "a2"), scope.Agent("wf2", "a1"),
		scope.Global(), scope.Custom("s1"), scope.Custom("shared"),
	}
	// Each scope holds a value naming it, so a leak says where from.
	for _, sc := range all {
		v := "secret of " + scope.String(sc)
		if _, err := st.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: "k", Value: structpb.NewStringValue(v)}); err != nil {
			t.Fatal(err)
		}
	}
	full := &operatorv1.OperatorInput{
		SessionId: proto.String("s1"),
		Dispatch:  &operatorv1.DispatchContext{WorkflowId: "wf1", AgentId: "a1", DispatchId: "d1"},
	}
	for _, tc := range []struct {
		name    string
		input   *operatorv1.OperatorInput
		allowed []*typesv1.Scope
		may     string // in every refusal's message
	}{
		{"session and dispatch", full,
			[]*typesv1.Scope{scope.Session("s1"), scope.Workflow("wf1"), scope.Agent("wf1", "a1")},
			`it may read only session:"s1", workflow:"wf1", agent:"wf1"/"a1"`},
		{"session only", &operatorv1.OperatorInput{SessionId: proto.String("s1")},
			[]*typesv1.Scope{scope.Session("s1")}, `it may read only session:"s1"`},
		{"workflow without agent", &operatorv1.OperatorInput{Dispatch: &operatorv1.DispatchContext{WorkflowId: "wf1"}},
			[]*typesv1.Scope{scope.Workflow("wf1")}, `it may read only workflow:"wf1"`},
		{"agent without workflow", &operatorv1.OperatorInput{Dispatch: &operatorv1.DispatchContext{AgentId: "a1"}},
			nil, "it may read no scope"},
		{"stateless", &operatorv1.OperatorInput{}, nil, "it may read no scope"},
		{"memory scopes", &operatorv1.OperatorInput{SessionId: proto.String("s1"), Config: &operatorv1.OperatorConfig{MemoryScopes: []string{"global", "custom:shared", "workflow"}}},
			[]*typesv1.Scope{scope.Session("s1"), scope.Global(), scope.Custom("shared")}, `it may read only session:"s1", global, custom:"shared"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bridge := dialBridge(t, st, tc.input)
			for _, sc := range append(all, nil, &typesv1.Scope{}) {
				allowed := false
				for _, a := range tc.allowed {
					allowed = allowed || scope.Equal(a, sc)
				}
				name := scope.String(sc)
				want := "secret of " + name
				read, rerr := bridge.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "k"})
				list, lerr := bridge.List(ctx, &statev1.ListRequest{Scope: sc})
				search, serr := bridge.Search(ctx, &statev1.SearchRequest{Scope: sc, Query: "secret"})
				if allowed {
					if rerr != nil || read.GetValue().GetStringValue() != want {
						t.Errorf("Read %s: %v, %v; want %q", name, read, rerr, want)
					}
					if lerr != nil || len(list.GetItems()) != 1 || list.GetItems()[0].GetKey() != "k" {
						t.Errorf("List %s: %v, %v", name, list, lerr)
					}
					if serr != nil || len(search.GetResults()) != 1 || search.GetResults()[0].GetKey() != "k" {
						t.Errorf("Search %s: %v, %v", name, search, serr)
					}
					continue
				}
				refused := "scope " + name
				if sc.GetKind() == nil {
					refused = "a request with no scope"
				}
				for op, err := range map[string]error{"Read": rerr, "List": lerr, "Search": serr} {
					if status.Code(err) != codes.PermissionDenied {
						t.Errorf("%s %s: %v, want PermissionDenied", op, name, err)
						continue
					}
					msg := status.Convert(err).Message()
					if !strings.Contains(msg, refused+" is not readable by this invocation") || !strings.Contains(msg, tc.may) {
						t.Errorf("%s %s: message %q does not name %q and %q", op, name, msg, refused, tc.may)
					}
				}
				if read != nil || list != nil || search != nil {
					t.Errorf("%s: a refused call returned data: %v %v %v", name, read, list, search)
				}
			}
		})
	}
}

// blockingState is a StateService client whose Read waits for release
// and counts the calls in flight.
type blockingState struct {
	statev1.StateServiceClient
	release  chan struct{}
	mu       sync.Mutex
	inFlight int
	peak     int
}

func (b *blockingState) Read(ctx context.Context, _ *statev1.ReadRequest, _ ...grpc.CallOption) (*statev1.ReadResponse, error) {
	b.mu.Lock()
	b.inFlight++
	b.peak = max(b.peak, b.inFlight)
	b.mu.Unlock()
	defer func() { b.mu.Lock(); b.inFlight--; b.mu.Unlock() }()
	select {
	case <-b.release:
		return &statev1.ReadResponse{Value: structpb.NewStringValue("v")}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (b *blockingState) counts() (inFlight, peak int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inFlight, b.peak
}

// serveLimited serves a bridge for session s1 with lim and returns its
// socket path and logs.
func serveLimited(t *testing.T, st statev1.StateServiceClient, lim environment.BridgeLimitsForTest) (string, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	sock := filepath.Join(shortTemp(t), "state.sock")
	stop, err := environment.ServeStateBridgeWithLimitsForTest(sock, st, &operatorv1.OperatorInput{SessionId: proto.String("s1")}, lim, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return sock, logs
}

// bridgeClient dials sock with a connection of its own.
func bridgeClient(t *testing.T, sock string) statev1.StateServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return statev1.NewStateServiceClient(conn)
}

// closedWithin reports whether the server closes c within d (EOF or a
// reset after whatever it wrote first).
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	var b [512]byte
	for {
		if _, err := c.Read(b[:]); err != nil {
			return !errors.Is(err, os.ErrDeadlineExceeded)
		}
	}
}

// The bridge holds at most MaxConns connections: one past the cap is
// closed at once (never queued), a call on it fails UNAVAILABLE at once,
// and the slot is usable again when a connection closes.
func TestStateBridgeConnectionCap(t *testing.T) {
	st := startState(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := st.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("s1"), Key: "k", Value: structpb.NewStringValue("v")}); err != nil {
		t.Fatal(err)
	}
	lim := environment.DefaultBridgeLimitsForTest()
	lim.MaxConns = 4
	lim.Handshake = time.Minute // silent connections stay for this test
	sock, logs := serveLimited(t, st, lim)
	var held []net.Conn
	for range lim.MaxConns {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	for i, c := range held {
		if closedWithin(c, 300*time.Millisecond) {
			t.Fatalf("connection %d of %d, within the cap, was closed", i+1, lim.MaxConns)
		}
	}
	// Past the cap: closed at once, and a real client fails fast.
	for i := range 50 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		if !closedWithin(c, 5*time.Second) {
			t.Fatalf("connection %d past the cap of %d was kept open", i+1, lim.MaxConns)
		}
		c.Close()
	}
	start := time.Now()
	_, err := bridgeClient(t, sock).Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "k"})
	if status.Code(err) != codes.Unavailable || time.Since(start) > 10*time.Second {
		t.Errorf("a call past the cap: %v after %v, want UNAVAILABLE at once", err, time.Since(start))
	}
	if !strings.Contains(logs.String(), "closing connections over the cap") {
		t.Errorf("no warning logged: %s", logs.String())
	}
	// A slot frees when a held connection closes.
	held[0].Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := bridgeClient(t, sock).Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "k"})
		if err == nil && got.GetValue().GetStringValue() == "v" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the freed slot was never reused: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Connections that never speak gRPC (past the handshake timeout) and
// connections left idle (past the idle timeout) are closed, so abandoned
// connections give their slots back.
func TestStateBridgeDropsAbandonedConnections(t *testing.T) {
	st := startState(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := st.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("s1"), Key: "k", Value: structpb.NewStringValue("v")}); err != nil {
		t.Fatal(err)
	}
	t.Run("silent", func(t *testing.T) {
		lim := environment.DefaultBridgeLimitsForTest()
		lim.Handshake = 300 * time.Millisecond
		sock, _ := serveLimited(t, st, lim)
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !closedWithin(c, 10*time.Second) {
			t.Error("a connection that never sent the HTTP/2 preface was kept open")
		}
	})
	t.Run("idle", func(t *testing.T) {
		lim := environment.DefaultBridgeLimitsForTest()
		lim.MaxConns = 1
		lim.Idle = 300 * time.Millisecond
		sock, _ := serveLimited(t, st, lim)
		if _, err := bridgeClient(t, sock).Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "k"}); err != nil {
			t.Fatal(err)
		}
		// The first client's connection stays open until the server
		// closes it as idle; only then can the second one connect.
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := bridgeClient(t, sock).Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "k"})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the idle connection was never closed: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// One connection carries at most MaxStreams calls at once.
func TestStateBridgeStreamLimit(t *testing.T) {
	st := &blockingState{release: make(chan struct{})}
	lim := environment.DefaultBridgeLimitsForTest()
	lim.MaxStreams = 2
	sock, _ := serveLimited(t, st, lim)
	client := bridgeClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const calls = 6
	errc := make(chan error, calls)
	for range calls {
		go func() {
			_, err := client.Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "k"})
			errc <- err
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := st.counts(); n >= int(lim.MaxStreams) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // let any call past the limit arrive
	if _, peak := st.counts(); peak != int(lim.MaxStreams) {
		t.Errorf("%d calls in flight on one connection, want the limit %d", peak, lim.MaxStreams)
	}
	close(st.release)
	for range calls {
		if err := <-errc; err != nil {
			t.Errorf("a call waiting for a stream: %v", err)
		}
	}
}
