package grpcclient

import (
	"context"
	"net"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
)

// headers records the incoming metadata of the last Read.
type headers struct {
	statev1.UnimplementedStateServiceServer
	md metadata.MD
}

func (h *headers) Read(ctx context.Context, _ *statev1.ReadRequest) (*statev1.ReadResponse, error) {
	h.md, _ = metadata.FromIncomingContext(ctx)
	return &statev1.ReadResponse{}, nil
}

// traced is a context carrying a remote span (as the orchestrator's
// engines extract it from a dispatch) and one baggage member.
func traced(t *testing.T) context.Context {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true,
	}))
	m, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	b, err := baggage.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return baggage.ContextWithBaggage(ctx, b)
}

// TestTracePropagates dials as the orchestrator does (the W3C trace
// context and baggage as the process's propagator, Telemetry off) and
// checks what the server receives.
func TestTracePropagates(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })

	for _, telemetry := range []bool{false, true} {
		h := &headers{}
		lis := bufconn.Listen(1 << 20)
		s := grpc.NewServer()
		statev1.RegisterStateServiceServer(s, h)
		go s.Serve(lis)
		t.Cleanup(s.Stop)
		conn, err := Dial(Config{Target: "passthrough:///bufnet", Dev: true, Telemetry: telemetry},
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		c := statev1.NewStateServiceClient(conn)

		ctx := metadata.AppendToOutgoingContext(traced(t), "x-kept", "yes")
		if _, err := c.Read(ctx, &statev1.ReadRequest{}); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"baggage":     "tenant=acme",
			"x-kept":      "yes",
		}
		for k, v := range want {
			if got := h.md.Get(k); len(got) != 1 || got[0] != v {
				t.Errorf("telemetry %v: %s = %q, want %q", telemetry, k, got, v)
			}
		}

		// Without a trace, nothing is added.
		if _, err := c.Read(context.Background(), &statev1.ReadRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := h.md.Get("traceparent"); len(got) != 0 {
			t.Errorf("telemetry %v: traceparent %q on a call without a trace", telemetry, got)
		}
	}
}

func TestInjectWithoutTraceKeepsContext(t *testing.T) {
	p := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	ctx := metadata.AppendToOutgoingContext(context.Background(), "k", "v")
	if got := inject(ctx, p); got != ctx {
		t.Error("inject made a new context for a call with no trace")
	}
	got, _ := metadata.FromOutgoingContext(inject(traced(t), p))
	if len(got.Get("traceparent")) != 1 || len(got.Get("baggage")) != 1 {
		t.Errorf("metadata %v", got)
	}
}
