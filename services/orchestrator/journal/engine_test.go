package journal

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/services/orchestrator"
)

// effectsCaller answers with the effects of its agent: "echo" none,
// "logs" two log effects, "custom" two custom effects of type "t".
type effectsCaller struct{}

func (effectsCaller) Call(_ context.Context, a *orchestrator.Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	out := &operatorv1.OperatorOutput{Message: in.GetMessage(), ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE}}
	for i := range 2 {
		switch a.ID {
		case "logs":
			out.Effects = append(out.Effects, &typesv1.Effect{Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{Message: fmt.Sprint("line ", i)}}})
		case "custom":
			out.Effects = append(out.Effects, &typesv1.Effect{Kind: &typesv1.Effect_Custom{Custom: &typesv1.CustomEffect{EffectType: "t", Data: structpb.NewNumberValue(float64(i))}}})
		}
	}
	return out, nil
}

// A dispatch that names its workflow commits once before its operator
// call and once after (the workflow's creation with its step's intent;
// the step's result, its effects' outcomes and the end), except that
// what is held back is committed before an effect acts outside the
// process: a custom effect's handler finds the step's output journaled,
// and the outcome of the effect before it. Log effects act on the event
// log alone. One that names none (Unnamed) holds its creation and
// intent back over the operator call: a one-step dispatch is one
// commit, and its effects still find what they depend on journaled.
func TestDispatchCommits(t *testing.T) {
	j := openT(t, t.TempDir()+"/journal.db")
	defer j.Close()
	reg, err := orchestrator.ParseRegistry([]byte("agents:\n  - {id: echo, operator: 127.0.0.1:1}\n  - {id: logs, operator: 127.0.0.1:1}\n  - {id: custom, operator: 127.0.0.1:1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		handled []string
	)
	handler := func(_ context.Context, wf, key string, _ *structpb.Value) error {
		mu.Lock()
		defer mu.Unlock()
		st, err := j.Step(wf, 1)
		if err != nil || st == nil || !st.done() {
			t.Errorf("effect %s ran before its step's output was journaled: %+v, %v", key, st, err)
		}
		for _, prev := range handled {
			if e, err := j.Effect(wf, prev); err != nil || e == nil {
				t.Errorf("effect %s ran before the outcome of %s was journaled: %v", key, prev, err)
			}
		}
		handled = append(handled, key)
		return nil
	}
	e := New(j, orchestrator.Deps{Registry: reg, Caller: effectsCaller{}}, orchestrator.Options{Handlers: map[string]orchestrator.EffectHandler{"t": handler}})
	defer e.Close()
	ctx := context.Background()
	for _, tt := range []struct {
		agent   string
		unnamed bool
		commits int
		effects int
	}{{"echo", false, 2, 0}, {"logs", false, 2, 2}, {"custom", false, 4, 2},
		{"echo", true, 1, 0}, {"logs", true, 1, 2}, {"custom", true, 3, 2}} {
		name := fmt.Sprintf("%s/unnamed=%v", tt.agent, tt.unnamed)
		t.Run(name, func(t *testing.T) {
			mu.Lock()
			handled = nil // this workflow's
			mu.Unlock()
			tx0 := lastTx(t, j)
			id, _, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: "wf-" + name, AgentID: tt.agent, Unnamed: tt.unnamed,
				Input: &operatorv1.OperatorInput{Message: content.Text("go")}})
			if err != nil {
				t.Fatal(err)
			}
			wf, err := e.Wait(ctx, id)
			if err != nil || wf.Status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || len(wf.Effects) != tt.effects {
				t.Fatalf("Wait = %+v, %v; want COMPLETED with %d effects", wf, err, tt.effects)
			}
			for _, o := range wf.Effects {
				if !o.GetApplied() {
					t.Errorf("effect %s not applied: %s", o.GetIdempotencyKey(), o.GetDetail())
				}
			}
			if n := lastTx(t, j) - tx0; n != tt.commits {
				t.Errorf("%d commits for a dispatch of %s; want %d", n, name, tt.commits)
			}
		})
	}
}

// A workflow started detached exists, durably, when Start returns,
// and its events go out only once it does.
func TestStartReturnsOnceCreated(t *testing.T) {
	j := openT(t, t.TempDir()+"/journal.db")
	defer j.Close()
	caller := newFakeCaller()
	e := newEngine(t, j, caller)
	defer e.Close()
	ctx := context.Background()
	id, existed, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: "slow-1", AgentID: "slow", Input: &operatorv1.OperatorInput{Message: content.Text("go")}, Detached: true})
	if err != nil || existed {
		t.Fatalf("Start = %v, %v", existed, err)
	}
	if r, err := j.Get(id); err != nil || r.Status != running {
		t.Fatalf("right after Start: %+v, %v; want it journaled RUNNING", r, err)
	}
	if st, err := j.Step(id, 1); err != nil || st == nil {
		t.Fatalf("right after Start, step 1: %+v, %v; want its intent journaled", st, err)
	}
	<-caller.started
	// The same request again finds it; another one is refused.
	if _, existed, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: "slow-1", AgentID: "slow", Input: &operatorv1.OperatorInput{Message: content.Text("go")}, Detached: true}); err != nil || !existed {
		t.Fatalf("Start again = %v, %v; want existed", existed, err)
	}
	if _, _, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: "slow-1", AgentID: "echo", Input: &operatorv1.OperatorInput{Message: content.Text("go")}, Detached: true}); err == nil {
		t.Fatal("Start of another request with the id: accepted")
	}
	close(caller.release)
	waitFor(t, e, id, completed)
	if n := caller.callsOf(id); n != 1 {
		t.Errorf("%d operator calls; want 1", n)
	}
	// An id that ended is found too, with nothing run again.
	if _, existed, err := e.Start(ctx, &orchestrator.StartRequest{WorkflowID: "slow-1", AgentID: "slow", Input: &operatorv1.OperatorInput{Message: content.Text("go")}, Detached: true}); err != nil || !existed {
		t.Fatalf("Start of an ended id = %v, %v; want existed", existed, err)
	}
	time.Sleep(20 * time.Millisecond)
	if n := caller.callsOf(id); n != 1 {
		t.Errorf("%d operator calls after a Start of the ended id; want 1", n)
	}
}

// hasEffects tells outputs with effects from those without, whatever
// else they hold, and sends what it cannot parse to the decoder.
func TestHasEffects(t *testing.T) {
	none := &operatorv1.OperatorOutput{Message: content.Text("hi"), ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata: &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.RequireFromString("0.1"))}}
	some := proto.Clone(none).(*operatorv1.OperatorOutput)
	some.Effects = []*typesv1.Effect{{Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{Message: "x"}}}}
	for _, tt := range []struct {
		name string
		out  *operatorv1.OperatorOutput
		want bool
	}{{"empty", &operatorv1.OperatorOutput{}, false}, {"none", none, false}, {"some", some, true}} {
		raw, err := proto.Marshal(tt.out)
		if err != nil {
			t.Fatal(err)
		}
		if got := hasEffects(raw); got != tt.want {
			t.Errorf("%s: hasEffects = %v, want %v", tt.name, got, tt.want)
		}
	}
	if !hasEffects([]byte{0x0a, 0x7f}) {
		t.Error("a cut-short output: hasEffects = false; want true, for the decoder to report")
	}
}
