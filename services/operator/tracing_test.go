package operator_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
)

// recordSpans installs a tracer provider that keeps every ended span.
func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })
	return rec
}

// serveTraced is serve with content capture set as given.
func serveTraced(t *testing.T, capture bool, cfg operator.Config, model provider.Provider) operatorv1.OperatorServiceClient {
	t.Helper()
	cfg.Router = provider.Single{Provider: model, Default: "fake-1"}
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg.Server = grpcserver.Config{Name: "operator", Dev: true, ShutdownTimeout: 2 * time.Second}
		cfg.Server.OTel.CaptureContent = capture
		cfg.Log = harness.Logger(t)
		cfg.Listener = lis
		return operator.Run(ctx, cfg)
	})
	return operatorv1.NewOperatorServiceClient(harness.Dial(t, addr))
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// An invocation is an invoke_agent span whose children are a "chat
// {model}" span per model call, with the GenAI usage attributes, and an
// "execute_tool {name}" span per tool call; content is left out unless
// capture is on.
func TestGenAISpans(t *testing.T) {
	for _, capture := range []bool{false, true} {
		t.Run(map[bool]string{false: "no content", true: "content captured"}[capture], func(t *testing.T) {
			rec := recordSpans(t)
			m := &fakeModel{steps: []step{callTools("0.1", "look", `{"q":"secret-arg"}`), say("the answer", "0.2")}}
			c := serveTraced(t, capture, operator.Config{ExtraTools: tools(okTool("look", tool.ReadOnly))}, m)
			in := input("question")
			in.Dispatch = &operatorv1.DispatchContext{DispatchId: "d-1", AgentId: "researcher", WorkflowId: "wf-1"}
			wantExit(t, execute(t, c, in), operatorv1.ExitKind_EXIT_KIND_COMPLETE)

			byName := map[string][]sdktrace.ReadOnlySpan{}
			for _, s := range rec.Ended() {
				byName[s.Name()] = append(byName[s.Name()], s)
			}
			inv, chats, tools := byName["invoke_agent researcher"], byName["chat fake-1"], byName["execute_tool look"]
			if len(inv) != 1 || len(chats) != 2 || len(tools) != 1 {
				t.Fatalf("spans %v", keys(byName))
			}
			root := inv[0].SpanContext()
			for _, s := range append(chats, tools...) {
				if s.Parent().SpanID() != root.SpanID() || s.SpanContext().TraceID() != root.TraceID() {
					t.Errorf("%s is not a child of invoke_agent", s.Name())
				}
			}
			a := attrs(inv[0])
			if a["gen_ai.operation.name"].AsString() != "invoke_agent" || a["gen_ai.agent.name"].AsString() != "researcher" ||
				a["neuron.exit_kind"].AsString() != "EXIT_KIND_COMPLETE" || a["gen_ai.usage.input_tokens"].AsInt64() != 20 ||
				a["neuron.gen_ai.cost_usd"].AsFloat64() < 0.299 || a["neuron.dispatch_id"].AsString() != "d-1" {
				t.Errorf("invoke_agent attributes %v", a)
			}
			a = attrs(chats[0])
			if a["gen_ai.operation.name"].AsString() != "chat" || a["gen_ai.request.model"].AsString() != "fake-1" ||
				a["gen_ai.response.model"].AsString() != "fake-1" || a["gen_ai.provider.name"].AsString() != "fake" ||
				a["gen_ai.usage.input_tokens"].AsInt64() != 10 || a["gen_ai.usage.output_tokens"].AsInt64() != 5 ||
				strings.Join(a["gen_ai.response.finish_reasons"].AsStringSlice(), ",") != "tool_call" ||
				a["neuron.gen_ai.cost_usd"].AsFloat64() != 0.1 {
				t.Errorf("chat attributes %v", a)
			}
			if _, ok := a["gen_ai.usage.cache_read.input_tokens"]; !ok {
				t.Errorf("no cache token attribute: %v", a)
			}
			a = attrs(tools[0])
			if a["gen_ai.tool.name"].AsString() != "look" || !strings.HasPrefix(a["gen_ai.tool.call.id"].AsString(), "call_") ||
				a["neuron.tool.outcome"].AsString() != "ok" {
				t.Errorf("execute_tool attributes %v", a)
			}
			var all strings.Builder
			for _, s := range rec.Ended() {
				for _, kv := range s.Attributes() {
					all.WriteString(kv.Value.Emit())
				}
			}
			for _, content := range []string{"secret-arg", "the answer", "question", "look ok"} {
				if got := strings.Contains(all.String(), content); got != capture {
					t.Errorf("%q on spans = %v, want %v: %s", content, got, capture, all.String())
				}
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
