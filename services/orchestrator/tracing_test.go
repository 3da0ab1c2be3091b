package orchestrator_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/pkg/telemetry"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/journal"
)

// handoffCaller: agent "a" hands off to "b"; "b" waits for release (or
// its context) before it completes.
type handoffCaller struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *handoffCaller) Call(ctx context.Context, a *orchestrator.Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	out := &operatorv1.OperatorOutput{Message: content.Text("done"), ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata: &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.RequireFromString("0.25")), TokensIn: 7, Model: "m-1"}}
	if a.ID == "a" {
		out.Effects = []*typesv1.Effect{{IdempotencyKey: in.GetDispatch().GetDispatchId() + "/effect/0",
			Kind: &typesv1.Effect_Handoff{Handoff: &typesv1.Handoff{AgentId: "b"}}}}
		return out, nil
	}
	h.once.Do(func() { close(h.started) })
	select {
	case <-h.release:
		return out, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// A step is a "dispatch {agent}" span with its declared effects under
// it, in the trace of the call that started the workflow; after a
// restart the journal replays the finished step without a span (it is
// not executed again) and only the interrupted step is dispatched anew.
func TestTracerSpansAndReplay(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	restore := telemetry.SetReexporter(rec) // the workflow span
	t.Cleanup(func() { restore(); otel.SetTracerProvider(prev) })

	reg, err := orchestrator.ParseRegistry([]byte("agents:\n  - {id: a, operator: 127.0.0.1:1}\n  - {id: b, operator: 127.0.0.1:1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/journal.db"
	j, err := journal.Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	caller := &handoffCaller{started: make(chan struct{}), release: make(chan struct{})}
	e := journal.New(j, orchestrator.Deps{Registry: reg, Caller: orchestrator.Traced(caller)}, orchestrator.Options{})
	ctx, root := tp.Tracer("test").Start(context.Background(), "StartWorkflow")
	const id = "wf-traced"
	if _, _, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: id, AgentID: "a", Detached: true,
		Input: &operatorv1.OperatorInput{Message: content.Text("go")}}); err != nil {
		t.Fatal(err)
	}
	root.End()
	<-caller.started // a has handed off; b runs
	e.Close()        // b is cut; the workflow stays RUNNING in the journal
	e = journal.New(j, orchestrator.Deps{Registry: reg, Caller: orchestrator.Traced(caller)}, orchestrator.Options{})
	defer e.Close()
	close(caller.release)
	if n, err := e.Resume(); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v", n, err)
	}
	wf, err := e.Wait(context.Background(), id)
	if err != nil || wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Fatalf("Wait = %+v, %v", wf, err)
	}
	_ = tp.ForceFlush(context.Background())

	count := map[string]int{}
	var dispatchA, workflow sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		count[s.Name()]++
		if s.Name() == "workflow a" {
			workflow = s
		}
		if s.Name() != "StartWorkflow" && s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("%s is in trace %s, not the workflow's %s", s.Name(), s.SpanContext().TraceID(), root.SpanContext().TraceID())
		}
		if s.Name() == "dispatch a" {
			dispatchA = s
		}
	}
	if count["dispatch a"] != 1 || count["dispatch b"] != 2 || count["effect handoff"] != 1 || count["workflow a"] != 1 {
		t.Fatalf("spans %v: want dispatch a once (replayed, not executed again), dispatch b twice (cut, then run again), one handoff effect, one workflow span across the restart", count)
	}
	// One workflow span, from start to end across the restart, under the
	// starting call; every step under it, before and after the restart.
	if workflow.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Errorf("the workflow span's parent is %s, want the starting call's span", workflow.Parent().SpanID())
	}
	if !workflow.StartTime().Before(dispatchA.StartTime()) || workflow.EndTime().Before(dispatchA.EndTime()) {
		t.Errorf("the workflow span (%v..%v) does not cover its first step (%v..%v)", workflow.StartTime(), workflow.EndTime(), dispatchA.StartTime(), dispatchA.EndTime())
	}
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), "dispatch ") && s.Parent().SpanID() != workflow.SpanContext().SpanID() {
			t.Errorf("%s's parent is %s, want the workflow span %s", s.Name(), s.Parent().SpanID(), workflow.SpanContext().SpanID())
		}
	}
	for _, s := range rec.Ended() {
		if s.Name() == "effect handoff" && s.Parent().SpanID() != dispatchA.SpanContext().SpanID() {
			t.Errorf("the handoff effect is not under the dispatch that declared it")
		}
	}
	attrs := map[string]string{}
	for _, kv := range dispatchA.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs["neuron.outcome"] != "complete" || attrs["neuron.step"] != "1" || attrs["neuron.gen_ai.cost_usd"] != "0.25" || attrs["gen_ai.agent.name"] != "a" {
		t.Errorf("dispatch a attributes %v", attrs)
	}
}
