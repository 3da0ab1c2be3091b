package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/state"
)

// seenChannels is a Channels keeping its deliveries seen in a State
// service of its own.
func seenChannels(t *testing.T) (*Channels, context.Context) {
	t.Helper()
	addr := harness.ServeFake(t, "state", func(s *grpcserver.Server) {
		statev1.RegisterStateServiceServer(s, state.NewServer(state.NewMemory()))
	})
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return &Channels{g: &Gateway{ctx: ctx}, store: newKV(statev1.NewStateServiceClient(cc)), log: slog.New(slog.DiscardHandler)}, ctx
}

// A delivery is claimed once; a claim not yet done is being queued
// elsewhere (retry later) until it is stale, then taken over; a
// forgotten one is taken again.
func TestSeenClaims(t *testing.T) {
	t.Parallel()
	c, ctx := seenChannels(t)
	if ok, err := c.claimSeen(ctx, "slack/E1"); !ok || err != nil {
		t.Fatalf("first claim: %v, %v", ok, err)
	}
	if ok, err := c.claimSeen(ctx, "slack/E1"); ok || !errors.Is(err, errs.Retryable) {
		t.Fatalf("claim while the first is queued: %v, %v; want a retryable error", ok, err)
	}
	c.doneSeen(ChatEvent{ID: "E1"}, "slack/E1")
	if ok, err := c.claimSeen(ctx, "slack/E1"); ok || err != nil {
		t.Fatalf("claim of a handled delivery: %v, %v; want seen", ok, err)
	}
	// A claim left by a replica that stopped before queueing.
	if _, err := c.store.put(ctx, seenPrefix+"slack/E2", seenRecord{At: time.Now().Add(-seenStale - time.Second).UTC().Format(time.RFC3339Nano)}, 0); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.claimSeen(ctx, "slack/E2"); !ok || err != nil {
		t.Fatalf("claim of a stale claim: %v, %v; want taken", ok, err)
	}
	c.forgetSeen("slack/E2")
	if ok, err := c.claimSeen(ctx, "slack/E2"); !ok || err != nil {
		t.Fatalf("claim of a forgotten delivery: %v, %v; want taken", ok, err)
	}
}

// The sweep deletes the deliveries older than the age, and the oldest
// beyond the bound.
func TestSeenSweep(t *testing.T) {
	t.Parallel()
	c, ctx := seenChannels(t)
	now := time.Now()
	for i := range 6 { // E0 the oldest: 6 h ago ... E5: now
		at := now.Add(-time.Duration(5-i) * time.Hour).UTC().Format(time.RFC3339Nano)
		if _, err := c.store.put(ctx, seenPrefix+fmt.Sprintf("slack/E%d", i), seenRecord{At: at, Done: true}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := c.sweepSeen(ctx, now, 150*time.Minute, 100); n != 3 || err != nil { // E0..E2 are older
		t.Fatalf("swept %d, %v; want 3", n, err)
	}
	if n, err := c.sweepSeen(ctx, now, 150*time.Minute, 1); n != 2 || err != nil { // E3, E4 beyond the bound
		t.Fatalf("swept %d, %v; want 2", n, err)
	}
	items, err := c.store.list(ctx, seenPrefix)
	if err != nil || len(items) != 1 || items[0].key != seenPrefix+"slack/E5" {
		t.Fatalf("left %v, %v; want the newest", items, err)
	}
}
