package operator_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/compaction"
)

// countingState counts the State calls that read history.
type countingState struct {
	statev1.StateServiceClient
	lists, reads atomic.Int32
}

func (c *countingState) List(ctx context.Context, in *statev1.ListRequest, opts ...grpc.CallOption) (*statev1.ListResponse, error) {
	c.lists.Add(1)
	return c.StateServiceClient.List(ctx, in, opts...)
}

func (c *countingState) Read(ctx context.Context, in *statev1.ReadRequest, opts ...grpc.CallOption) (*statev1.ReadResponse, error) {
	c.reads.Add(1)
	return c.StateServiceClient.Read(ctx, in, opts...)
}

// TestSessionHistorySetting: OperatorConfig.session_history false reads
// no history (no State List or Read), declares no history write, keeps
// the session from the provider, and the model sees only the new input;
// unset, the same session is read and written.
func TestSessionHistorySetting(t *testing.T) {
	_, st := startState(t)
	counter := &countingState{StateServiceClient: st}
	m := &fakeModel{steps: []step{say("first answer", "0"), say("second answer", "0"), say("third answer", "0")}}
	c := serve(t, operator.Config{History: operator.StateHistory{Client: counter}}, m)
	sid := "chat-7"
	apply := func(out *operatorv1.OperatorOutput) {
		for _, e := range out.GetEffects() {
			w := e.GetWriteMemory()
			if _, err := st.Write(ctxT(t), &statev1.WriteRequest{Scope: w.GetScope(), Key: w.GetKey(), Value: w.GetValue(), IdempotencyKey: e.GetIdempotencyKey()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	run := func(text, id string, cfg *operatorv1.OperatorConfig) *operatorv1.OperatorOutput {
		in := input(text)
		in.SessionId, in.Config = &sid, cfg
		in.Dispatch = &operatorv1.DispatchContext{DispatchId: id}
		out := execute(t, c, in)
		wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
		apply(out)
		return out
	}

	if out := run("my name is ada", "d1", nil); len(out.GetEffects()) != 1 {
		t.Fatalf("default: %d effects, want the history write", len(out.GetEffects()))
	}
	lists := counter.lists.Load()
	if lists == 0 {
		t.Fatal("default: the session's history was not listed")
	}
	reads := counter.reads.Load()

	out := run("what is my name?", "d2", &operatorv1.OperatorConfig{SessionHistory: proto.Bool(false)})
	if n := len(out.GetEffects()); n != 0 {
		t.Errorf("session_history false: %d effects %v, want no history write", n, out.GetEffects())
	}
	if counter.lists.Load() != lists || counter.reads.Load() != reads {
		t.Errorf("session_history false: %d State List and %d Read calls, want none", counter.lists.Load()-lists, counter.reads.Load()-reads)
	}
	req := m.requests()[1]
	if len(req.Messages) != 1 || req.Messages[0].Parts[0].Text != "what is my name?" {
		t.Errorf("session_history false: the model saw %d messages %+v, want only the new input", len(req.Messages), req.Messages)
	}
	if req.SessionID != "" {
		t.Errorf("session_history false: the provider got session %q, want none (it would chain the session's earlier calls)", req.SessionID)
	}

	// Back to the default: the first exchange is read back, the second
	// (not written) is not.
	run("and now?", "d3", &operatorv1.OperatorConfig{SessionHistory: proto.Bool(true)})
	req = m.requests()[2]
	if len(req.Messages) != 3 || req.Messages[0].Parts[0].Text != "my name is ada" || req.Messages[2].Parts[0].Text != "and now?" {
		t.Errorf("session_history true after an invocation without history: the model saw %+v, want the first exchange and the new input", req.Messages)
	}
	if req.SessionID != sid {
		t.Errorf("session_history true: the provider got session %q, want %q", req.SessionID, sid)
	}
}

// TestSessionHistoryOffWithoutState: an operator with no State service
// refuses a session (its history could not be kept) unless the
// invocation turns session history off.
func TestSessionHistoryOffWithoutState(t *testing.T) {
	c := serve(t, operator.Config{}, &fakeModel{steps: []step{say("hi", "0")}})
	sid := "s"
	in := input("hello")
	in.SessionId = &sid
	_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: in})
	wantStatus(t, err, codes.FailedPrecondition, "")
	in.Config = &operatorv1.OperatorConfig{SessionHistory: proto.Bool(false)}
	out := execute(t, c, in)
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	if len(out.GetEffects()) != 0 {
		t.Errorf("effects %v, want none", out.GetEffects())
	}
}

// TestContextStrategySetting: each OperatorConfig.context_strategy
// overrides the deployment's --compaction for its invocation, over a
// session of about 6000 tokens and a 3500-token window (500 reserved):
// TRUNCATE drops older turns without a summary call, COMPACT summarises
// them, NONE refuses before any model call, UNSPECIFIED keeps the
// deployment's strategy.
func TestContextStrategySetting(t *testing.T) {
	cat := fakeCatalog(t)
	tests := []struct {
		name       string
		deployment string
		strategy   operatorv1.ContextStrategy
		steps      []step
		calls      int
		first      string // start of the first message of the last call
		all        bool   // the model saw the whole conversation
	}{
		{"truncate over none", compaction.NameNone, operatorv1.ContextStrategy_CONTEXT_STRATEGY_TRUNCATE, []step{say("done", "0")}, 1, strings.Repeat("q", 10), false},
		{"compact over sliding", compaction.NameSliding, operatorv1.ContextStrategy_CONTEXT_STRATEGY_COMPACT, []step{say("they asked many questions", "0"), say("done", "0")}, 2, compaction.SummaryHeader, false},
		{"unspecified keeps none", compaction.NameNone, operatorv1.ContextStrategy_CONTEXT_STRATEGY_UNSPECIFIED, []step{say("done", "0")}, 1, strings.Repeat("q", 10), true},
		{"none over sliding", compaction.NameSliding, operatorv1.ContextStrategy_CONTEXT_STRATEGY_NONE, []step{say("done", "0")}, 0, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &fakeModel{steps: tc.steps}
			c := serve(t, operator.Config{
				History: longHistory{n: 6},
				Models:  operator.Models{Compaction: tc.deployment, Catalog: cat, ContextReserve: 500},
			}, m)
			sid := "long"
			in := input("latest question")
			in.SessionId = &sid
			in.Config = &operatorv1.OperatorConfig{ContextStrategy: tc.strategy}
			resp, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: in})
			reqs := m.requests()
			if len(reqs) != tc.calls {
				t.Fatalf("%d model calls, want %d", len(reqs), tc.calls)
			}
			if tc.strategy == operatorv1.ContextStrategy_CONTEXT_STRATEGY_NONE {
				wantStatus(t, err, codes.FailedPrecondition, errs.ReasonNonRetryable)
				if !strings.Contains(err.Error(), "context_strategy is NONE") || !strings.Contains(err.Error(), "fake-1") {
					t.Errorf("%v: want a message naming the setting and the model", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantExit(t, resp.GetOutput(), operatorv1.ExitKind_EXIT_KIND_COMPLETE)
			seen := reqs[len(reqs)-1].Messages
			if whole := len(seen) == 13; whole != tc.all || seen[len(seen)-1].Parts[0].Text != "latest question" {
				t.Fatalf("model saw %d of 13 messages ending %q; want all: %v, ending with the new question", len(seen), seen[len(seen)-1].Parts[0].Text, tc.all)
			}
			if !strings.HasPrefix(seen[0].Parts[0].Text, tc.first) {
				t.Fatalf("first message %.40q, want prefix %q", seen[0].Parts[0].Text, tc.first)
			}
		})
	}
}

// TestContextStrategyNoneFits: NONE sends a conversation that fits
// whole, and a strategy the contract does not define is INVALID_ARGUMENT.
func TestContextStrategyNoneFits(t *testing.T) {
	m := &fakeModel{steps: []step{say("done", "0")}}
	c := serve(t, operator.Config{
		History: longHistory{n: 1},
		Models:  operator.Models{Compaction: compaction.NameSliding, Catalog: fakeCatalog(t), ContextReserve: 500},
	}, m)
	sid := "short"
	in := input("latest question")
	in.SessionId = &sid
	in.Config = &operatorv1.OperatorConfig{ContextStrategy: operatorv1.ContextStrategy_CONTEXT_STRATEGY_NONE}
	wantExit(t, execute(t, c, in), operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	if reqs := m.requests(); len(reqs) != 1 || len(reqs[0].Messages) != 3 {
		t.Fatalf("model calls %d, want 1 with all 3 messages", len(reqs))
	}
	in.Config.ContextStrategy = 42
	_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: in})
	wantStatus(t, err, codes.InvalidArgument, "")
}
