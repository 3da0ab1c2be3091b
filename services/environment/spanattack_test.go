package environment_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/telemetry"
	"github.com/secbear/neuron/services/environment"
)

// spanAttackBackend stands in for a sandbox whose one-shot operator is
// hostile: its stderr carries spans forged to leave the run's trace, pose
// as another service's span, hang off spans that do not exist, and carry
// the invocation's credential out; or a spans line too large to read.
type spanAttackBackend struct {
	secret string
	flood  bool
}

func (spanAttackBackend) Name() string { return "spanattack" }

func (spanAttackBackend) Check(*environmentv1.EnvironmentSpec) error { return nil }

func (b spanAttackBackend) Run(_ context.Context, inv *environment.Invocation) (*environment.Result, error) {
	// What the real operator does: read the trace context from the input.
	in := &operatorv1.OperatorInput{}
	_ = protojson.Unmarshal(inv.InputJSON, in)
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(in.GetDispatch().GetTraceContext())))
	tid, pid := sc.TraceID(), sc.SpanID()
	id := func(b byte) []byte { return bytes.Repeat([]byte{b}, 8) }
	str := func(k, v string) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
	}
	spans := []*tracepb.Span{
		{Name: "invoke_agent honest", TraceId: tid[:], SpanId: id(1), ParentSpanId: pid[:], Attributes: []*commonpb.KeyValue{str("leak", "key="+b.secret)}},
		{Name: "forged other trace", TraceId: bytes.Repeat([]byte{7}, 16), SpanId: id(2), ParentSpanId: pid[:]},
		{Name: "forged impostor", TraceId: tid[:], SpanId: pid[:], ParentSpanId: id(1)},
		{Name: "forged orphan", TraceId: tid[:], SpanId: id(3), ParentSpanId: id(0x55)},
	}
	raw, _ := proto.Marshal(&tracepb.TracesData{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource:   nil,
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}},
	}}})
	payload := base64.StdEncoding.EncodeToString(raw)
	if b.flood {
		payload = strings.Repeat("A", telemetry.MaxSandboxSpanBytes+1)
	}
	logs := `{"msg":"starting"}` + "\n" + telemetry.SpansPrefix + payload + "\n" + "operator: done\n"
	return &environment.Result{Output: &operatorv1.OperatorOutput{Message: content.Text("done")}, Logs: []byte(logs)}, nil
}

// Spans a hostile sandbox hands back are exported only inside the run's
// trace and under the run's span: another trace's are dropped, an
// impostor of the run span's id gets a fresh one, an orphan is put under
// the run, a credential in an attribute is scrubbed, a line too large is
// dropped whole; none of it reaches the logs, and the run's output is
// unaffected.
func TestAttackSandboxSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	restore := telemetry.SetReexporter(sdktrace.NewSimpleSpanProcessor(exp))
	t.Cleanup(func() { restore(); otel.SetTracerProvider(prev) })

	const secret = "tok-span-side-channel-41197"
	for _, flood := range []bool{false, true} {
		exp.Reset()
		e := startEnv(t, envOptions{
			binary:    os.Args[0], // never run: the extra backend answers
			secrets:   environment.MapSecrets{"api": secret},
			extra:     []environment.Backend{spanAttackBackend{secret: secret, flood: flood}},
			container: "spanattack",
		})
		spec := &environmentv1.EnvironmentSpec{
			Isolation: []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{}}}},
			Credentials: []*environmentv1.CredentialRef{{Name: "api", Injection: &environmentv1.CredentialInjection{
				Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "API_TOKEN"}},
			}}},
		}
		resp, err := e.run(t, "hi", spec)
		if err != nil || text(resp) != "done" {
			t.Fatalf("flood=%v: the run: %v %v", flood, resp, err)
		}
		got := exp.GetSpans()
		var run *tracetest.SpanStub
		for i := range got {
			if got[i].Name == "sandbox spanattack" {
				run = &got[i]
			}
		}
		if run == nil {
			t.Fatalf("flood=%v: no run span among %d", flood, len(got))
		}
		byName := map[string]tracetest.SpanStub{}
		for _, s := range got {
			byName[s.Name] = s
			if s.SpanContext.TraceID() != run.SpanContext.TraceID() {
				t.Errorf("flood=%v: %q exported in trace %s, not the run's %s", flood, s.Name, s.SpanContext.TraceID(), run.SpanContext.TraceID())
			}
			if s.Name != run.Name && s.SpanContext.SpanID() == run.SpanContext.SpanID() {
				t.Errorf("flood=%v: %q took the run span's id", flood, s.Name)
			}
			for _, kv := range s.Attributes {
				if strings.Contains(kv.Value.Emit(), secret) {
					t.Errorf("flood=%v: %q carries the credential in %s", flood, s.Name, kv.Key)
				}
			}
		}
		if strings.Contains(e.logs.String(), telemetry.SpansPrefix) || strings.Contains(e.logs.String(), secret) {
			t.Errorf("flood=%v: the spans line or the credential reached the logs", flood)
		}
		if flood {
			if len(got) != 1 {
				t.Errorf("a spans line past the limit: %d spans exported, want only the run's", len(got))
			}
			if !strings.Contains(e.logs.String(), "spans were dropped") {
				t.Errorf("the dropped spans were not logged:\n%s", e.logs)
			}
			continue
		}
		if _, ok := byName["forged other trace"]; ok {
			t.Errorf("a span of another trace was exported")
		}
		honest, orphan := byName["invoke_agent honest"], byName["forged orphan"]
		if honest.Parent.SpanID() != run.SpanContext.SpanID() || orphan.Parent.SpanID() != run.SpanContext.SpanID() {
			t.Errorf("parents: honest %s, orphan %s; want both the run's span %s", honest.Parent.SpanID(), orphan.Parent.SpanID(), run.SpanContext.SpanID())
		}
		if svc, _ := honest.Resource.Set().Value("service.name"); svc.AsString() != "neuron-operator" {
			t.Errorf("the handed-back span's service: %q", svc.AsString())
		}
		if imp, ok := byName["forged impostor"]; !ok || imp.Parent.SpanID() != honest.SpanContext.SpanID() {
			t.Errorf("impostor: %v (parent %s), want it kept under invoke_agent honest with a fresh id", ok, imp.Parent.SpanID())
		}
	}
}
