package operator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/scope"
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

// writeSession writes n history entries of one user message each ("0",
// "1", ...) to the session sid, as the orchestrator applies them.
func writeSession(t testing.TB, st statev1.StateServiceClient, sid string, n int) {
	t.Helper()
	for i := range n {
		b, err := protojson.Marshal(content.Text(strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		var c map[string]any
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		v, err := structpb.NewValue(map[string]any{"version": 1, "messages": []any{map[string]any{"role": "user", "content": c}}})
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("%s%06d", operator.HistoryPrefix, i)
		if _, err := st.Write(context.Background(), &statev1.WriteRequest{Scope: scope.Session(sid), Key: key, Value: v, Unindexed: true}); err != nil {
			t.Fatal(err)
		}
	}
}

// oldState is a StateService client of a State that predates List's
// include_values and reverse (it drops them, as such a server ignores
// unknown fields); keepValues keeps include_values, for one that knows
// values but not reverse.
type oldState struct {
	statev1.StateServiceClient
	keepValues bool
}

func (o oldState) List(ctx context.Context, in *statev1.ListRequest, opts ...grpc.CallOption) (*statev1.ListResponse, error) {
	in = proto.CloneOf(in)
	in.Reverse = false
	if !o.keepValues {
		in.IncludeValues = false
	}
	return o.StateServiceClient.List(ctx, in, opts...)
}

func msgTexts(msgs []provider.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Parts[0].Text
	}
	return out
}

func counting(from, to int) []string {
	out := []string{}
	for i := from; i < to; i++ {
		out = append(out, strconv.Itoa(i))
	}
	return out
}

// TestHistoryListsValues: Load reads a session's last entries, in order,
// with one List and no Read from a State that lists values.
func TestHistoryListsValues(t *testing.T) {
	_, st := startState(t)
	writeSession(t, st, "long", 30)
	for _, tt := range []struct {
		sid      string
		max      int
		from, to int
		lists    int32
	}{
		{"long", 0, 0, 30, 1},
		{"long", 10, 20, 30, 1},
		{"long", 30, 0, 30, 1},
		{"long", 1000, 0, 30, 1},
		{"new", 10, 0, 0, 1},
	} {
		c := &countingState{StateServiceClient: st}
		msgs, err := operator.NewStateHistory(c, nil).Load(ctxT(t), tt.sid, tt.max)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := msgTexts(msgs), counting(tt.from, tt.to); !slices.Equal(got, want) {
			t.Errorf("session %s, max %d: got %v, want %v", tt.sid, tt.max, got, want)
		}
		if c.lists.Load() != tt.lists || c.reads.Load() != 0 {
			t.Errorf("session %s, max %d: %d List and %d Read calls, want %d and none", tt.sid, tt.max, c.lists.Load(), c.reads.Load(), tt.lists)
		}
	}
}

// TestHistoryFallback: from a State that returns no values (or lists in
// ascending order whatever reverse says), Load reads the same history by
// List and one Read per entry; NewStateHistory remembers it and asks no
// more for values, a literal StateHistory asks each time.
func TestHistoryFallback(t *testing.T) {
	_, st := startState(t)
	writeSession(t, st, "s", 12)
	for _, keepValues := range []bool{false, true} {
		c := &countingState{StateServiceClient: oldState{st, keepValues}}
		h := operator.NewStateHistory(c, harness.Quiet())
		for round := range 3 {
			lists, reads := c.lists.Load(), c.reads.Load()
			msgs, err := h.Load(ctxT(t), "s", 5)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := msgTexts(msgs), counting(7, 12); !slices.Equal(got, want) {
				t.Fatalf("values kept %t, load %d: got %v, want %v", keepValues, round, got, want)
			}
			wantLists := int32(1)
			if round == 0 {
				wantLists = 2 // the List with values, then the keys
			}
			if l, r := c.lists.Load()-lists, c.reads.Load()-reads; l != wantLists || r != 5 {
				t.Errorf("values kept %t, load %d: %d List and %d Read calls, want %d and 5", keepValues, round, l, r, wantLists)
			}
		}
	}
	// Not remembered: each Load asks for values first.
	c := &countingState{StateServiceClient: oldState{StateServiceClient: st}}
	for range 2 {
		lists := c.lists.Load()
		msgs, err := operator.StateHistory{Client: c}.Load(ctxT(t), "s", 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := msgTexts(msgs); !slices.Equal(got, counting(0, 12)) {
			t.Fatalf("literal StateHistory: got %v", got)
		}
		if l := c.lists.Load() - lists; l != 2 {
			t.Errorf("literal StateHistory: %d List calls, want 2", l)
		}
	}
}

// BenchmarkHistoryLoad loads a session of n entries from a real State
// (memory backend, loopback gRPC) with one List with values (api=list)
// and, as from a State without values, List and n Reads (api=read).
func BenchmarkHistoryLoad(b *testing.B) {
	addr := harness.Serve(b, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{
			Server: grpcserver.Config{Name: "state", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:    harness.Quiet(), Listener: lis, Backend: state.BackendMemory,
		})
	})
	st := statev1.NewStateServiceClient(harness.Dial(b, addr))
	for _, n := range []int{1, 10, 100} {
		sid := fmt.Sprintf("bench-%d", n)
		writeSession(b, st, sid, n)
		for _, api := range []string{"list", "read"} {
			var c statev1.StateServiceClient = st
			if api == "read" {
				c = oldState{StateServiceClient: st}
			}
			h := operator.NewStateHistory(c, harness.Quiet())
			b.Run(fmt.Sprintf("entries=%d/api=%s", n, api), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					msgs, err := h.Load(context.Background(), sid, 0)
					if err != nil || len(msgs) != n {
						b.Fatalf("%d messages, %v", len(msgs), err)
					}
				}
			})
		}
	}
}
