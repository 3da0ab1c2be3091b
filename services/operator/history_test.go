package operator_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/state"
)

// fakeHistory is a session with no past turns.
type fakeHistory struct{}

func (fakeHistory) Load(context.Context, string, int) ([]provider.Message, error) { return nil, nil }

// decodeHistory returns the contents stored by a history effect.
func decodeHistory(t *testing.T, e *typesv1.Effect) []*typesv1.Content {
	t.Helper()
	w := e.GetWriteMemory()
	if w == nil {
		t.Fatalf("not a history write: %v", e)
	}
	var out []*typesv1.Content
	for _, m := range w.GetValue().GetStructValue().GetFields()["messages"].GetListValue().GetValues() {
		b, err := protojson.Marshal(m.GetStructValue().GetFields()["content"])
		if err != nil {
			t.Fatal(err)
		}
		c := &typesv1.Content{}
		if err := protojson.Unmarshal(b, c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// startState serves a real StateService (memory backend) on loopback
// and returns its address and a client.
func startState(t *testing.T) (string, statev1.StateServiceClient) {
	t.Helper()
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{
			Server: grpcserver.Config{Name: "state", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:    harness.Quiet(), Listener: lis, Backend: state.BackendMemory,
		})
	})
	return addr, statev1.NewStateServiceClient(harness.Dial(t, addr))
}

// TestSessionHistory runs two invocations of one session against a real
// state service, applying the history effect in between as the
// orchestrator would, and checks the second model call sees the first
// conversation.
func TestSessionHistory(t *testing.T) {
	stateAddr, st := startState(t)
	m := &fakeModel{steps: []step{callTools("0", "ok", `{}`), say("first answer", "0"), say("second answer", "0")}}
	c := serve(t, operator.Config{ExtraTools: tools(okTool("ok", 1)), State: grpcclient.Config{Target: stateAddr}}, m)
	sid := "chat-42"
	apply := func(out *operatorv1.OperatorOutput) {
		for _, e := range out.GetEffects() {
			w := e.GetWriteMemory()
			if _, err := st.Write(ctxT(t), &statev1.WriteRequest{Scope: w.GetScope(), Key: w.GetKey(), Value: w.GetValue(), IdempotencyKey: e.GetIdempotencyKey()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	in := input("my name is ada")
	in.SessionId = &sid
	in.Dispatch = &operatorv1.DispatchContext{DispatchId: "d1"}
	apply(execute(t, c, in))

	in2 := input("what is my name?")
	in2.SessionId = &sid
	in2.Dispatch = &operatorv1.DispatchContext{DispatchId: "d2"}
	out := execute(t, c, in2)
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	reqs := m.requests()
	msgs := reqs[2].Messages
	// user, assistant (tool call), user (tool result), assistant, user.
	if len(msgs) != 5 {
		t.Fatalf("second invocation's model saw %d messages, want 5", len(msgs))
	}
	if msgs[0].Parts[0].Text != "my name is ada" || msgs[3].Parts[0].Text != "first answer" || msgs[4].Parts[0].Text != "what is my name?" {
		t.Fatalf("history %+v", msgs)
	}
	if msgs[1].Parts[0].ToolUse == nil || msgs[2].Parts[0].ToolResult == nil || msgs[2].Parts[0].ToolResult.Content != "ok ok" {
		t.Fatalf("tool turns not restored: %+v %+v", msgs[1], msgs[2])
	}
	// The second entry holds only the new turns.
	stored := decodeHistory(t, out.GetEffects()[0])
	if len(stored) != 2 || content.TextOf(stored[0]) != "what is my name?" || content.TextOf(stored[1]) != "second answer" {
		t.Fatalf("stored %v", stored)
	}
}

// TestHistoryUnavailable checks that an unreachable state service is a
// retryable error naming the session.
func TestHistoryUnavailable(t *testing.T) {
	c := serve(t, operator.Config{State: grpcclient.Config{Target: deadAddr(t).String()}}, &fakeModel{steps: []step{say("x", "0")}})
	sid := "s-down"
	in := input("hi")
	in.SessionId = &sid
	_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: in})
	wantStatus(t, err, codes.Unavailable, errs.ReasonRetryable)
	if !strings.Contains(err.Error(), "s-down") {
		t.Fatalf("%v does not name the session", err)
	}
}
