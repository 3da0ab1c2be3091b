package state_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	conformance "github.com/secbear/neuron/pkg/conformance/state"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/audit"
	"github.com/secbear/neuron/pkg/testenv"
	"github.com/secbear/neuron/services/state"
)

// TestPostgresConformance runs the gRPC conformance suite
// (pkg/conformance/state) against state.NewServer over the PostgreSQL
// backend, served on loopback through the standard server chain in dev
// mode, like pkg/conformance/state's in-process targets. Each call goes
// to one of two servers, each with its own backend (pool) on the same
// database, so the suite also sees replicas behave as one store. The
// access checks (which test the auth interceptor, not the backend) are
// skipped: the target has no read-only or anonymous connection.
func TestPostgresConformance(t *testing.T) {
	dsn := testenv.Postgres(t)
	limits := state.Limits{MaxKeyBytes: 1024, MaxValueBytes: 64 << 10}
	var addrs []string
	for range 2 {
		store, err := state.OpenPostgres(t.Context(), dsn, state.WithLimits(limits))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() }) // after the server stopped
		addrs = append(addrs, pgServe(t, store))
	}
	conns := make([]*grpc.ClientConn, len(addrs))
	for i, a := range addrs {
		c, err := grpcclient.Dial(grpcclient.Config{Target: a, Dev: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		pgWaitServing(t, c)
		conns[i] = c
	}
	conformance.Run(t, conformance.Target{
		Conn:          &pgRoundRobin{conns: conns},
		MaxKeyBytes:   limits.MaxKeyBytes,
		MaxValueBytes: limits.MaxValueBytes,
	})
}

// pgRoundRobin sends each unary call to the next of several connections.
type pgRoundRobin struct {
	conns []*grpc.ClientConn
	n     atomic.Uint64
}

// Invoke implements grpc.ClientConnInterface.
func (r *pgRoundRobin) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return r.pick().Invoke(ctx, method, args, reply, opts...)
}

// NewStream implements grpc.ClientConnInterface.
func (r *pgRoundRobin) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return r.pick().NewStream(ctx, desc, method, opts...)
}

func (r *pgRoundRobin) pick() *grpc.ClientConn {
	return r.conns[r.n.Add(1)%uint64(len(r.conns))]
}

// pgServe serves store on a loopback port through the standard chain
// plus the audit interceptor, as cmd/state does, until the test ends.
func pgServe(t *testing.T, store state.Backend) string {
	t.Helper()
	srv, err := grpcserver.New(grpcserver.Config{Name: "state", Dev: true}, nil,
		grpcserver.WithInterceptors([]grpc.UnaryServerInterceptor{audit.UnaryServerInterceptor()}, nil))
	if err != nil {
		t.Fatal(err)
	}
	statev1.RegisterStateServiceServer(srv, state.NewServer(store))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// pgWaitServing waits until the server behind conn reports the state
// service SERVING.
func pgWaitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "layer0.state.v1.StateService"})
		cancel()
		if err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not become SERVING: %v %v", res.GetStatus(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
