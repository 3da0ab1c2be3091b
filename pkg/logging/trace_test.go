package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// Counts under secret-sounding keys print as numbers; secret values
// under the same keys are still redacted.
func TestCountsNotRedacted(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(&buf, Options{Format: "json"})
	if err != nil {
		t.Fatal(err)
	}
	l.Info("model call", "tokens_in", 1200, "tokens_out", uint64(34), "credential_count", 2, "cache_tokens", 0.5, "has_token", true)
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"tokens_in": 1200.0, "tokens_out": 34.0, "credential_count": 2.0, "cache_tokens": 0.5, "has_token": true} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v (line %s)", k, got[k], want, buf.String())
		}
	}
	buf.Reset()
	l.Info("x", "token", "tok-value-1", "credentials", "cred-value-2", "tokens_in", "12 of tok-value-3")
	for _, secret := range []string{"tok-value-1", "cred-value-2", "tok-value-3"} {
		if strings.Contains(buf.String(), secret) {
			t.Errorf("secret %q leaked: %s", secret, buf.String())
		}
	}
}

// A record logged with a span in its context carries the span's trace
// and span ids; one without carries neither.
func TestTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(&buf, Options{Format: "json"})
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	l.With("dispatch_id", "d-1").InfoContext(ctx, "call")
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["trace_id"] != tid.String() || got["span_id"] != sid.String() || got["dispatch_id"] != "d-1" {
		t.Fatalf("line %s", buf.String())
	}
	buf.Reset()
	l.InfoContext(context.Background(), "no span")
	if strings.Contains(buf.String(), "trace_id") {
		t.Fatalf("trace_id without a span: %s", buf.String())
	}
}
