package agents

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/state"
)

// countingState counts the Reads made through it.
type countingState struct {
	statev1.StateServiceClient
	reads atomic.Int64
}

func (c *countingState) Read(ctx context.Context, in *statev1.ReadRequest, opts ...grpc.CallOption) (*statev1.ReadResponse, error) {
	c.reads.Add(1)
	return c.StateServiceClient.Read(ctx, in, opts...)
}

// TestLookupCache: within the TTL a lookup reads no State (a dispatch
// adds no round trip); this replica's own update is seen at once;
// another replica's once the TTL has passed.
func TestLookupCache(t *testing.T) {
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: harness.Quiet(), Listener: lis, Backend: state.BackendMemory})
	})
	client := statev1.NewStateServiceClient(harness.Dial(t, addr))
	ctx := context.Background()
	clock := time.Unix(1000, 0)
	now := func() time.Time { return clock }
	a, b := NewStore(client, time.Minute), NewStore(&countingState{StateServiceClient: client}, time.Minute)
	a.now, b.now = now, now
	counted := b.state.(*countingState)

	def := func(addendum string) *agentv1.Agent {
		return &agentv1.Agent{Name: "cached", Definition: &agentv1.AgentDefinition{SystemAddendum: addendum,
			Route: &agentv1.Route{Target: &agentv1.Route_Operator{Operator: &agentv1.OperatorRoute{Address: "127.0.0.1:1"}}}}}
	}
	v1, err := a.Create(ctx, def("one"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Lookup("cached"); err != nil || got.Defaults.SystemAddendum != "one" {
		t.Fatalf("Lookup = %v, %v; want revision one", got, err)
	}
	before := counted.reads.Load()
	for range 5 {
		if _, err := b.Lookup("cached"); err != nil {
			t.Fatal(err)
		}
	}
	if n := counted.reads.Load() - before; n != 0 {
		t.Errorf("5 lookups within the TTL made %d State reads, want 0", n)
	}
	// Another replica (a) changes it: b serves what it read until its TTL
	// passes.
	if _, err := a.Update(ctx, def("two"), v1.GetRevision()); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Lookup("cached"); got.Defaults.SystemAddendum != "two" {
		t.Errorf("the writing replica's Lookup = %q, want its own write, two", got.Defaults.SystemAddendum)
	}
	if got, _ := b.Lookup("cached"); got.Defaults.SystemAddendum != "one" {
		t.Errorf("within the TTL the other replica's Lookup = %q, want its cached one", got.Defaults.SystemAddendum)
	}
	clock = clock.Add(time.Minute)
	if got, _ := b.Lookup("cached"); got.Defaults.SystemAddendum != "two" {
		t.Errorf("after the TTL the other replica's Lookup = %q, want two", got.Defaults.SystemAddendum)
	}
	// The first revision stays readable by revision.
	if got, err := b.LookupRevision("cached", v1.GetRevision()); err != nil || got.Defaults.SystemAddendum != "one" {
		t.Errorf("LookupRevision(%d) = %v, %v; want one", v1.GetRevision(), got, err)
	}
}
