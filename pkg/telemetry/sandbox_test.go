package telemetry_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/secbear/neuron/pkg/telemetry"
)

// runSpan is an environment's span of a run, and its trusted view.
func runSpan(t *testing.T) (trace.SpanContext, telemetry.SandboxRun) {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	_, span := tp.Tracer("env").Start(context.Background(), "sandbox process")
	span.End()
	sc := span.SpanContext()
	return sc, telemetry.SandboxRun{
		Parent:   sc,
		Start:    time.Now().Add(-time.Minute),
		End:      time.Now().Add(time.Minute),
		Resource: resource.NewSchemaless(attribute.String("service.name", "neuron-operator")),
		Scrub:    func(s string) string { return strings.ReplaceAll(s, "hunter2", "[REDACTED]") },
	}
}

// A one-shot operator's spans, recorded under the run's trace context,
// cross the stderr line and come back as the same tree under the run's
// span, with fresh ids, the environment's resource and secrets scrubbed;
// the rest of stderr is left as it was.
func TestSandboxSpansRoundTrip(t *testing.T) {
	parent, run := runSpan(t)
	rec := telemetry.NewRecorder("operator")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
	tr := rec.TracerProvider().Tracer("op")
	ctx, inv := tr.Start(ctx, "invoke_agent assistant")
	_, chat := tr.Start(ctx, "chat scripted", trace.WithAttributes(attribute.String("gen_ai.request.model", "scripted"), attribute.String("secret", "pw hunter2")))
	chat.End()
	inv.End()
	// Without a sampled parent nothing is recorded.
	_, orphan := tr.Start(context.Background(), "orphan")
	orphan.End()

	var stderr bytes.Buffer
	stderr.WriteString(`{"level":"INFO","msg":"start"}` + "\n")
	if dropped, err := rec.WriteSpans(&stderr); err != nil || dropped != 0 {
		t.Fatalf("WriteSpans: %d dropped, %v", dropped, err)
	}
	stderr.WriteString("operator: done\n")
	payload, rest := telemetry.CutSpans(stderr.Bytes())
	if string(rest) != "{\"level\":\"INFO\",\"msg\":\"start\"}\noperator: done\n" {
		t.Errorf("the rest of stderr: %q", rest)
	}
	spans, rep, err := telemetry.SandboxSpans(payload, run)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Got != 2 || rep.Kept != 2 || rep.Reparented != 0 || rep.ForeignTrace != 0 {
		t.Fatalf("report %+v, want 2 got and kept", rep)
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
		if s.SpanContext().TraceID() != parent.TraceID() {
			t.Errorf("%s: trace %s, want %s", s.Name(), s.SpanContext().TraceID(), parent.TraceID())
		}
		if svc, _ := s.Resource().Set().Value("service.name"); svc.AsString() != "neuron-operator" {
			t.Errorf("%s: resource %v", s.Name(), s.Resource())
		}
	}
	i, c := byName["invoke_agent assistant"], byName["chat scripted"]
	if i == nil || c == nil {
		t.Fatalf("spans %v", byName)
	}
	if i.Parent().SpanID() != parent.SpanID() {
		t.Errorf("invoke_agent's parent %s, want the run's span %s", i.Parent().SpanID(), parent.SpanID())
	}
	if c.Parent().SpanID() != i.SpanContext().SpanID() {
		t.Errorf("chat's parent %s, want invoke_agent %s", c.Parent().SpanID(), i.SpanContext().SpanID())
	}
	if i.SpanContext().SpanID() == inv.SpanContext().SpanID() {
		t.Errorf("the span id was kept; want a fresh one")
	}
	for _, kv := range c.Attributes() {
		if kv.Key == "secret" && kv.Value.AsString() != "pw [REDACTED]" {
			t.Errorf("secret attribute %q, want it scrubbed", kv.Value.AsString())
		}
	}
}

func id8(b byte) []byte  { return bytes.Repeat([]byte{b}, 8) }
func id16(b byte) []byte { return bytes.Repeat([]byte{b}, 16) }

func encode(t *testing.T, spans ...*tracepb.Span) []byte {
	t.Helper()
	b, err := proto.Marshal(&tracepb.TracesData{ResourceSpans: []*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return []byte(base64.StdEncoding.EncodeToString(b))
}

// Spans forged by a hostile sandbox: another trace's are dropped, one
// posing as a span of another service (its id) gets a fresh id, one
// naming an unknown parent and a cycle are put under the run, times are
// clamped, and a payload too large or not OTLP is refused whole.
func TestSandboxSpansForged(t *testing.T) {
	parent, run := runSpan(t)
	tid, pid := parent.TraceID(), parent.SpanID()
	now := uint64(time.Now().UnixNano())
	mk := func(name string, trace, span, parent []byte) *tracepb.Span {
		return &tracepb.Span{Name: name, TraceId: trace, SpanId: span, ParentSpanId: parent, StartTimeUnixNano: now, EndTimeUnixNano: now + 1,
			Attributes: []*commonpb.KeyValue{{Key: "k", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: strings.Repeat("x", 100<<10)}}}}}
	}
	payload := encode(t,
		mk("good", tid[:], id8(1), pid[:]),
		mk("foreign", id16(9), id8(2), pid[:]),
		mk("impostor", tid[:], pid[:], id8(1)), // the run span's own id
		mk("orphan", tid[:], id8(3), id8(0xee)),
		mk("cycle-a", tid[:], id8(4), id8(5)),
		mk("cycle-b", tid[:], id8(5), id8(4)),
		&tracepb.Span{Name: "ancient", TraceId: tid[:], SpanId: id8(6), ParentSpanId: id8(1), StartTimeUnixNano: 1, EndTimeUnixNano: 1 << 63},
	)
	spans, rep, err := telemetry.SandboxSpans(payload, run)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ForeignTrace != 1 || rep.Kept != 6 {
		t.Errorf("report %+v, want 1 foreign and 6 kept", rep)
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	ids := map[trace.SpanID]string{}
	for _, s := range spans {
		byName[s.Name()] = s
		ids[s.SpanContext().SpanID()] = s.Name()
		if s.SpanContext().TraceID() != tid {
			t.Errorf("%s left the run's trace", s.Name())
		}
		if s.SpanContext().SpanID() == pid {
			t.Errorf("%s kept the run span's id", s.Name())
		}
		for _, kv := range s.Attributes() {
			if len(kv.Value.AsString()) > 8<<10 {
				t.Errorf("%s: attribute of %d bytes kept", s.Name(), len(kv.Value.AsString()))
			}
		}
		if s.StartTime().Before(run.Start) || s.EndTime().After(run.End) {
			t.Errorf("%s: times %v..%v outside the run", s.Name(), s.StartTime(), s.EndTime())
		}
	}
	if _, ok := byName["foreign"]; ok {
		t.Errorf("a span of another trace was kept")
	}
	// Every span reaches the run's span.
	for _, s := range spans {
		p, steps := s.Parent().SpanID(), 0
		for ; p != pid && steps < 10; steps++ {
			n, ok := ids[p]
			if !ok {
				t.Errorf("%s: parent %s is neither the run nor a handed-back span", s.Name(), p)
				break
			}
			p = byName[n].Parent().SpanID()
		}
		if steps >= 10 {
			t.Errorf("%s does not reach the run's span (a cycle)", s.Name())
		}
	}
	if byName["impostor"].Parent().SpanID() != byName["good"].SpanContext().SpanID() {
		t.Errorf("impostor's parent is not good")
	}
	if byName["orphan"].Parent().SpanID() != pid {
		t.Errorf("orphan not put under the run")
	}

	for _, tc := range []struct {
		name    string
		payload []byte
		says    string
	}{
		{"too large", bytes.Repeat([]byte("A"), telemetry.MaxSandboxSpanBytes+1), "more than"},
		{"not base64", []byte("!!!"), "not base64"},
		{"not OTLP", []byte(base64.StdEncoding.EncodeToString([]byte{0xff, 0xff, 0xff})), "not an OTLP"},
	} {
		if _, _, err := telemetry.SandboxSpans(tc.payload, run); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.says)
		}
	}
	// Past MaxSandboxSpans the rest are dropped.
	var many []*tracepb.Span
	for i := range telemetry.MaxSandboxSpans + 10 {
		many = append(many, &tracepb.Span{Name: "s", TraceId: tid[:], SpanId: []byte{1, 2, 3, 4, 5, 6, byte(i >> 8), byte(i)}, ParentSpanId: pid[:]})
	}
	many[0].SpanId = id8(0x77) // a zero low byte would not matter, but keep ids valid
	spans, rep, err = telemetry.SandboxSpans(encode(t, many...), run)
	if err != nil || len(spans) != telemetry.MaxSandboxSpans || rep.TooMany != 10 {
		t.Errorf("%d spans, report %+v, err %v; want %d kept and 10 too many", len(spans), rep, err, telemetry.MaxSandboxSpans)
	}
}

// The recorder keeps the latest MaxSandboxSpans: the invocation's own
// span, which ends last, is never the one left out.
func TestRecorderKeepsLatest(t *testing.T) {
	parent, _ := runSpan(t)
	rec := telemetry.NewRecorder("operator")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
	tr := rec.TracerProvider().Tracer("op")
	ctx, inv := tr.Start(ctx, "invoke_agent")
	for range telemetry.MaxSandboxSpans + 5 {
		_, s := tr.Start(ctx, "chat")
		s.End()
	}
	inv.End()
	got := rec.Spans()
	if len(got) != telemetry.MaxSandboxSpans || got[len(got)-1].Name() != "invoke_agent" {
		t.Errorf("%d spans, last %q; want %d ending with invoke_agent", len(got), got[len(got)-1].Name(), telemetry.MaxSandboxSpans)
	}
}
