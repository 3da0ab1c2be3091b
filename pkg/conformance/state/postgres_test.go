package state_test

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/conformance/internal/remote"
	conformance "github.com/secbear/neuron/pkg/conformance/state"
	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/state"
)

// TestPostgresConformance runs the gRPC conformance suite
// (pkg/conformance/state) against state.NewServer over the PostgreSQL
// backend, served on loopback through the standard server chain in dev
// mode, like the in-process targets in conformance_test.go. Each call goes
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
		addrs = append(addrs, serve(t, grpcserver.Config{Name: "state", Dev: true}, store, embed.Test{}))
	}
	conns := make([]*grpc.ClientConn, len(addrs))
	for i, a := range addrs {
		conns[i] = remote.Dial(t, grpcclient.Config{Target: a, Dev: true})
		waitServing(t, conns[i])
	}
	conformance.Run(t, conformance.Target{
		Conn:          &pgRoundRobin{conns: conns},
		MaxKeyBytes:   limits.MaxKeyBytes,
		MaxValueBytes: limits.MaxValueBytes,
		Embedder:      conformance.EmbedderTest,

		RetentionMaxEntries: confRetention[0].MaxEntries,
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
