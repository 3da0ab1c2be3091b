package store_test

import (
	"context"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/internal/boundarytest"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/state"
)

// TestRemote runs the boundaries' shared suite at the store boundary: a
// real state server (memory backend) started as its binary starts it
// (state.Run: the standard chain, the remote middleware's
// StoreServerInterceptor, the audit log), written and read back.
func TestRemote(t *testing.T) {
	boundarytest.Run(t, boundarytest.Boundary{
		Kind: middlewarev1.Boundary_BOUNDARY_STORE,
		Methods: []boundarytest.Method{
			{Name: "write+read", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return stateBehind(t, m) }},
		},
		HaltNames: func(key string) []string { return []string{fmt.Sprintf("%q", key)} },
		Replaced:  "value",
	})
}

// stateTarget is a state server behind the store boundary and a client
// of it. Every key it is called with is written in one scope.
type stateTarget struct {
	mem    *state.Memory
	client statev1.StateServiceClient
	conn   *grpc.ClientConn
	scope  *typesv1.Scope
	keys   []string
}

// stateBehind serves a fresh memory backend through state.Run with m as
// its middleware.
func stateBehind(t *testing.T, m *remote.Middleware) *stateTarget {
	t.Helper()
	mem := state.NewMemory()
	t.Cleanup(func() { mem.Close() })
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true}, Listener: lis, Store: mem, Middleware: m})
	})
	conn := boundarytest.Dial(t, addr)
	return &stateTarget{mem: mem, client: statev1.NewStateServiceClient(conn), conn: conn, scope: scope.Session("s1")}
}

// Call writes word under the key word, then reads it back; the read
// carries the write's revision, whatever value the middleware shows.
func (s *stateTarget) Call(ctx context.Context, t *testing.T, word string) boundarytest.Result {
	t.Helper()
	s.keys = append(s.keys, word)
	w, err := s.client.Write(ctx, &statev1.WriteRequest{Scope: s.scope, Key: word, Value: structpb.NewStringValue(word)})
	if err != nil {
		return boundarytest.Result{Err: err, Calls: 1}
	}
	r, err := s.client.Read(ctx, &statev1.ReadRequest{Scope: s.scope, Key: word})
	if err == nil && r.GetRevision() != w.GetRevision() {
		t.Errorf("read revision %d, want the write's %d", r.GetRevision(), w.GetRevision())
	}
	return boundarytest.Result{Err: err, Output: r.GetValue().GetStringValue(), Calls: 2}
}

// Received is the values stored under the keys called.
func (s *stateTarget) Received(t *testing.T) []string {
	var got []string
	for _, k := range s.keys {
		if it, err := s.mem.Read(context.Background(), s.scope, k); err == nil {
			got = append(got, it.Value.GetStringValue())
		}
	}
	return got
}

// Other is a health check.
func (s *stateTarget) Other(ctx context.Context, t *testing.T) {
	t.Helper()
	if _, err := healthpb.NewHealthClient(s.conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestRemoteOperations: what the shared suite's write and read do not
// cover: a halted Delete, and List and Search, which are sent too.
func TestRemoteOperations(t *testing.T) {
	ctx := context.Background()
	p := &boundarytest.Policy{Name: "store-policy"}
	s := stateBehind(t, boundarytest.StartPolicy(t, p, remote.Config{}))
	before := middlewarev1.Phase_PHASE_BEFORE
	storeBoundary := middlewarev1.Boundary_BOUNDARY_STORE

	t.Run("halted delete is not applied", func(t *testing.T) {
		if _, err := s.mem.Write(ctx, s.scope, boundarytest.HaltBefore, structpb.NewStringValue("kept"), state.Guard{}); err != nil {
			t.Fatal(err)
		}
		_, err := s.client.Delete(ctx, &statev1.DeleteRequest{Scope: s.scope, Key: boundarytest.HaltBefore})
		boundarytest.WantStatus(t, err, codes.PermissionDenied, `"store-policy"`, boundarytest.HaltReason, `delete of key "forbidden"`)
		if it, err := s.mem.Read(ctx, s.scope, boundarytest.HaltBefore); err != nil || it.Value.GetStringValue() != "kept" {
			t.Fatalf("after a halted delete: %v, %v", it.Value, err)
		}
	})
	t.Run("list and search are sent", func(t *testing.T) {
		n := p.Calls(storeBoundary, before)
		if _, err := s.client.List(ctx, &statev1.ListRequest{Scope: s.scope}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.client.Search(ctx, &statev1.SearchRequest{Scope: s.scope, Query: "kept"}); err != nil {
			t.Fatal(err)
		}
		if got := p.Calls(storeBoundary, before) - n; got != 2 {
			t.Fatalf("%d store calls before, want 2", got)
		}
	})
}
