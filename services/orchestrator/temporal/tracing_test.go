package temporal

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/telemetry"
	"github.com/secbear/neuron/services/orchestrator"
)

// TestWorkflowSpan: a workflow Temporal runs reports one "workflow
// {agent}" span when it ends, with the ids orchestrator.WorkflowTrace
// chose at the start (under the starting call's span), and a replay of
// a finished workflow's history (what a worker taking the workflow over,
// or answering a query, does) reports none: the same guarantee as the
// journal engine's (TestTracerSpansAndReplay).
func TestWorkflowSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	restore := telemetry.SetReexporter(rec)
	t.Cleanup(restore)
	tp := sdktrace.NewTracerProvider()
	ctx, root := tp.Tracer("test").Start(context.Background(), "StartWorkflow")
	root.End()
	trace := orchestrator.WorkflowTrace(ctx)

	e := newTSEnv(t, "wf-span", []map[string]any{tsAgent("a", 2)}, map[string]tsBehaviour{
		"a": func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			return tsDone(in, "Hello.", "0.01"), nil
		},
	}, Options{})
	in := tsInput(t, "a", "Hi.", "")
	in.Trace = trace
	e.mustRun(in)

	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "workflow a" {
			spans = append(spans, s)
		}
	}
	if len(spans) != 1 {
		t.Fatalf("%d workflow spans, want 1", len(spans))
	}
	s := spans[0]
	if s.SpanContext().TraceID() != root.SpanContext().TraceID() || s.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Errorf("the workflow span is %v under %s, want trace %s under the starting call's span %s",
			s.SpanContext(), s.Parent().SpanID(), root.SpanContext().TraceID(), root.SpanContext().SpanID())
	}
	attrs := map[string]string{}
	for _, kv := range s.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs["neuron.workflow_id"] != e.wfID || attrs["neuron.workflow.status"] != "completed" || s.EndTime().Before(s.StartTime()) {
		t.Errorf("workflow span %v from %v to %v", attrs, s.StartTime(), s.EndTime())
	}

	// Replays of recorded histories whose input carries that trace
	// context: End runs again in each, and must report nothing.
	files, err := filepath.Glob(filepath.Join(historyDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no recorded histories in %s: %v", historyDir, err)
	}
	reg, err := orchestrator.ParseRegistry([]byte(`{"agents": [{"id": "replay", "operator": "127.0.0.1:1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := worker.NewWorkflowReplayer()
	New(nil, orchestrator.Deps{Registry: reg}, Options{}).RegisterWorkflow(r)
	before := len(rec.Ended())
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		h, err := client.HistoryFromJSON(fh, client.HistoryJSONOptions{})
		fh.Close()
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		p := h.GetEvents()[0].GetWorkflowExecutionStartedEventAttributes().GetInput().GetPayloads()[0]
		var input map[string]any
		if err := json.Unmarshal(p.GetData(), &input); err != nil {
			t.Fatalf("%s: the workflow's input: %v", f, err)
		}
		input["trace"] = trace
		if p.Data, err = json.Marshal(input); err != nil {
			t.Fatal(err)
		}
		if err := r.ReplayWorkflowHistory(quietTemporal(), h); err != nil {
			t.Fatalf("%s does not replay: %v", f, err)
		}
	}
	if n := len(rec.Ended()) - before; n != 0 {
		t.Errorf("replaying %d finished workflows reported %d spans, want none", len(files), n)
	}
}
