package operator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/state"
)

// seedKey is the key of a seeded history entry: the operator's format,
// with a start time i nanoseconds after the epoch (older than any real
// invocation's).
func seedKey(i int, tag string) string {
	return fmt.Sprintf("%s%020d-%s", operator.HistoryPrefix, i, tag)
}

// writeTurn writes a history entry of about 1000 tokens (a long question
// ending in tag, and a short answer) under key.
func writeTurn(t *testing.T, st statev1.StateServiceClient, sid, key, tag string) {
	t.Helper()
	var msgs []any
	for i, text := range []string{strings.Repeat("q", 4000) + tag, "answer " + tag} {
		b, err := protojson.Marshal(content.Text(text))
		if err != nil {
			t.Fatal(err)
		}
		var c map[string]any
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, map[string]any{"role": []string{"user", "assistant"}[i], "content": c})
	}
	v, err := structpb.NewValue(map[string]any{"version": 1, "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(ctxT(t), &statev1.WriteRequest{Scope: scope.Session(sid), Key: key, Value: v, Unindexed: true}); err != nil {
		t.Fatal(err)
	}
}

// applyEffects applies an output's memory effects to State in order, as
// the orchestrator does.
func applyEffects(t *testing.T, st statev1.StateServiceClient, out *operatorv1.OperatorOutput) {
	t.Helper()
	for _, e := range out.GetEffects() {
		switch {
		case e.GetWriteMemory() != nil:
			w := e.GetWriteMemory()
			if _, err := st.Write(ctxT(t), &statev1.WriteRequest{Scope: w.GetScope(), Key: w.GetKey(), Value: w.GetValue(),
				IdempotencyKey: e.GetIdempotencyKey(), Unindexed: w.GetUnindexed()}); err != nil {
				t.Fatal(err)
			}
		case e.GetDeleteMemory() != nil:
			d := e.GetDeleteMemory()
			if _, err := st.Delete(ctxT(t), &statev1.DeleteRequest{Scope: d.GetScope(), Key: d.GetKey()}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// sessionKeys lists a session's keys under prefix.
func sessionKeys(t *testing.T, st statev1.StateServiceClient, sid, prefix string) []string {
	t.Helper()
	resp, err := st.List(ctxT(t), &statev1.ListRequest{Scope: scope.Session(sid), Prefix: prefix, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, it := range resp.GetItems() {
		out = append(out, it.GetKey())
	}
	return out
}

// firstTexts is the start of each message's first text, for messages.
func firstTexts(msgs []provider.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		text := m.Parts[0].Text
		if strings.HasPrefix(text, strings.Repeat("q", 100)) {
			text = "q…" + strings.TrimLeft(text, "q")
		}
		out[i] = text
	}
	return out
}

// summaryConfig is an operator on a real State whose fake-1 has a
// 3000-token budget and the summarize strategy.
func summaryConfig(t *testing.T, stateAddr string) operator.Config {
	return operator.Config{
		State:  grpcclient.Config{Target: stateAddr},
		Models: operator.Models{Compaction: compaction.NameSummarize, Catalog: fakeCatalog(t), ContextReserve: 500},
	}
}

func sessionInput(sid, dispatch, text string) *operatorv1.OperatorInput {
	in := input(text)
	in.SessionId = &sid
	in.Dispatch = &operatorv1.DispatchContext{DispatchId: dispatch}
	return in
}

// TestSessionSummaryPersisted: a summarizing invocation declares its
// summary as memory of the session; once applied to a real State, a later
// invocation starts from it plus the newer turns, without summarizing
// again, and keyword search finds the summary.
func TestSessionSummaryPersisted(t *testing.T) {
	// A State with the test embedder, which embeds every indexed write.
	stateAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{
			Server: grpcserver.Config{Name: "state", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:    harness.Quiet(), Listener: lis, Backend: state.BackendMemory,
			EmbedderConfig: embed.Config{Provider: embed.ProviderTest},
		})
	})
	st := statev1.NewStateServiceClient(harness.Dial(t, stateAddr))
	const sid = "remember"
	for i := 1; i <= 6; i++ {
		writeTurn(t, st, sid, seedKey(i, "seed"), fmt.Sprint(i))
	}
	m := &fakeModel{steps: []step{say("the user's cat is called Tom", "0"), say("a1", "0"), say("a2", "0")}}
	c := serve(t, summaryConfig(t, stateAddr), m)

	out := execute(t, c, sessionInput(sid, "d1", "first question"))
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	if n := len(m.requests()); n != 2 {
		t.Fatalf("%d model calls, want the summary and the answer", n)
	}
	var written []string
	for _, e := range out.GetEffects() {
		written = append(written, e.GetWriteMemory().GetKey())
	}
	wantSuffix := strings.TrimPrefix(seedKey(5, "seed"), operator.HistoryPrefix) + "~"
	if len(written) != 3 || !strings.HasPrefix(written[1], operator.SummaryCoversPrefix+wantSuffix) ||
		!strings.HasPrefix(written[2], operator.SummaryPrefix+wantSuffix) {
		t.Fatalf("effects write %q; want the history entry, then the covers and summary keys of epoch %s", written, wantSuffix)
	}
	if out.GetEffects()[2].GetWriteMemory().GetUnindexed() || !out.GetEffects()[1].GetWriteMemory().GetUnindexed() {
		t.Fatal("the summary must be indexed and its covers key not")
	}
	applyEffects(t, st, out)

	// The summary is memory: keyword search finds it.
	res, err := st.Search(ctxT(t), &statev1.SearchRequest{Scope: scope.Session(sid), Query: "cat Tom", Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.GetResults()) != 1 || !strings.HasPrefix(res.GetResults()[0].GetKey(), operator.SummaryPrefix) {
		t.Fatalf("search found %v, want the summary", res.GetResults())
	}
	// And vector search finds it by meaning, in other words.
	res, err = st.Search(ctxT(t), &statev1.SearchRequest{Scope: scope.Session(sid), Query: "kitten named", Limit: 5, Mode: statev1.SearchMode_SEARCH_MODE_VECTOR})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.GetResults()) == 0 || !strings.HasPrefix(res.GetResults()[0].GetKey(), operator.SummaryPrefix) {
		t.Fatalf("vector search found %v, want the summary first", res.GetResults())
	}

	out = execute(t, c, sessionInput(sid, "d2", "second question"))
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	reqs := m.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d model calls, want 3: the second invocation must not summarize again", len(reqs))
	}
	got := firstTexts(reqs[2].Messages)
	want := []string{compaction.SummaryHeader + "\nthe user's cat is called Tom", "q…6", "answer 6", "first question", "a1", "second question"}
	if !slices.Equal(got, want) {
		t.Fatalf("second invocation's model saw\n%q\nwant\n%q", got, want)
	}
	if n := len(out.GetEffects()); n != 1 {
		t.Fatalf("%d effects; want only the history entry (nothing newly summarized)", n)
	}
}

// TestSessionSummaryRace: two compactions of one session race, and the
// one covering older turns is applied last; a turn that was written while
// the newer summary was being made, under a key older than its epoch,
// must not be lost.
func TestSessionSummaryRace(t *testing.T) {
	stateAddr, st := startState(t)
	const sid = "race"
	for i := 1; i <= 6; i++ {
		writeTurn(t, st, sid, seedKey(i*10, "seed"), fmt.Sprint(i))
	}
	m := &fakeModel{steps: []step{say("OLD summary", "0"), say("a", "0"), say("NEW summary", "0"), say("b", "0"), say("c", "0")}}
	c := serve(t, summaryConfig(t, stateAddr), m)

	// A loads six entries and summarizes the first five; its effects are
	// held back.
	outA := execute(t, c, sessionInput(sid, "dA", "question A"))
	// Meanwhile two more turns land, and B summarizes seven.
	writeTurn(t, st, sid, seedKey(70, "seed"), "7")
	writeTurn(t, st, sid, seedKey(80, "seed"), "8")
	outB := execute(t, c, sessionInput(sid, "dB", "question B"))
	if len(outA.GetEffects()) != 3 || len(outB.GetEffects()) != 3 {
		t.Fatalf("A declared %d effects, B %d; want a history entry and a summary each", len(outA.GetEffects()), len(outB.GetEffects()))
	}
	// B lands first, then the stale A.
	applyEffects(t, st, outB)
	applyEffects(t, st, outA)
	sums := sessionKeys(t, st, sid, operator.SummaryPrefix)
	if len(sums) != 2 {
		t.Fatalf("summary keys %q, want both (a stale summary lands beside the newer one, never over it)", sums)
	}
	// A turn that started before the epoch of B's summary and finished
	// after it was written: B does not cover it.
	writeTurn(t, st, sid, seedKey(35, "late"), "late")

	out := execute(t, c, sessionInput(sid, "dC", "question C"))
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	reqs := m.requests()
	got := firstTexts(reqs[len(reqs)-1].Messages)
	want := []string{compaction.SummaryHeader + "\nNEW summary", "q…late", "answer late", "q…8", "answer 8",
		"question A", "a", "question B", "b", "question C"}
	if !slices.Equal(got, want) {
		t.Fatalf("the model saw\n%q\nwant\n%q (the newer summary, then every turn it does not cover)", got, want)
	}
}

// TestSummaryMessageOrder: a loaded summary folded into a new one is
// deleted after the new one is written, so a session keeps one summary.
func TestSummarySupersedes(t *testing.T) {
	stateAddr, st := startState(t)
	const sid = "roll"
	for i := 1; i <= 6; i++ {
		writeTurn(t, st, sid, seedKey(i, "seed"), fmt.Sprint(i))
	}
	m := &fakeModel{steps: []step{say("first summary", "0"), say("a", "0"), say("second summary", "0"), say("b", "0")}}
	c := serve(t, summaryConfig(t, stateAddr), m)
	applyEffects(t, st, execute(t, c, sessionInput(sid, "d1", "q1")))
	for i := 7; i <= 9; i++ {
		writeTurn(t, st, sid, seedKey(i, "seed"), fmt.Sprint(i))
	}
	out := execute(t, c, sessionInput(sid, "d2", "q2"))
	reqs := m.requests()
	// The second summary request's transcript starts with the first
	// summary: rolling.
	if tr := reqs[2].Messages[0].Parts[0].Text; !strings.Contains(tr, "first summary") {
		t.Fatalf("the second summary request does not fold in the first: %.200q", tr)
	}
	var kinds []string
	for _, e := range out.GetEffects() {
		if w := e.GetWriteMemory(); w != nil {
			kinds = append(kinds, "write "+strings.SplitN(w.GetKey(), "/", 2)[0])
		} else {
			kinds = append(kinds, "delete "+strings.SplitN(e.GetDeleteMemory().GetKey(), "/", 2)[0])
		}
	}
	want := []string{"write conversation", "write summary-covers", "write summary", "delete summary", "delete summary-covers"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("effects %q, want %q", kinds, want)
	}
	applyEffects(t, st, out)
	if sums := sessionKeys(t, st, sid, operator.SummaryPrefix); len(sums) != 1 || !strings.Contains(sums[0], "~d2") {
		t.Fatalf("summary keys %q, want only d2's", sums)
	}
	if covers := sessionKeys(t, st, sid, operator.SummaryCoversPrefix); len(covers) != 1 || !strings.Contains(covers[0], "~d2") {
		t.Fatalf("covers keys %q, want only d2's", covers)
	}
}

// startLifecycle serves a real LifecycleService (pkg/lifecycle, as the
// orchestrator does) and returns its address and a client.
func startLifecycle(t *testing.T) (string, lifecyclev1.LifecycleServiceClient) {
	t.Helper()
	bus := lifecycle.NewBus(lifecycle.Options{})
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		gs, err := grpcserver.New(grpcserver.Config{Name: "lifecycle", Dev: true, ShutdownTimeout: 2 * time.Second}, harness.Quiet())
		if err != nil {
			return err
		}
		lifecyclev1.RegisterLifecycleServiceServer(gs, lifecycle.NewServer(bus))
		return gs.Serve(ctx, lis)
	})
	return addr, lifecyclev1.NewLifecycleServiceClient(harness.Dial(t, addr))
}

// TestCompactionEvents: through the operator's lifecycle publisher and a
// real LifecycleService, a subscriber sees ContextPressure, then
// PreCompactionFlush with the session's scope, then CompactionComplete;
// a context over the pressure threshold that still fits sees only
// ContextPressure.
func TestCompactionEvents(t *testing.T) {
	cat := fakeCatalog(t)
	tests := []struct {
		name    string
		history int // past exchanges of about 1000 tokens; the budget is 3000
		want    []string
	}{
		{"over the budget", 6, []string{"context_pressure", "pre_compaction_flush", "compaction_complete"}},
		{"over the threshold only", 2, []string{"context_pressure"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lcAddr, lc := startLifecycle(t)
			ctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			sub, err := lc.Subscribe(ctx, &lifecyclev1.SubscribeRequest{AfterSequence: proto.Uint64(0)})
			if err != nil {
				t.Fatal(err)
			}
			m := &fakeModel{steps: []step{say("summary", "0"), say("done", "0")}}
			if len(tc.want) == 1 {
				m.steps = m.steps[1:]
			}
			c := serve(t, operator.Config{
				History:   longHistory{n: tc.history},
				Lifecycle: grpcclient.Config{Target: lcAddr},
				Models:    operator.Models{Compaction: compaction.NameSummarize, Catalog: cat, ContextReserve: 500, ContextPressure: 50},
			}, m)
			sid := "s-events"
			in := input("latest question")
			in.SessionId = &sid
			in.Dispatch = &operatorv1.DispatchContext{WorkflowId: "wf-ev", AgentId: "agent-ev", DispatchId: "d-ev"}
			wantExit(t, execute(t, c, in), operatorv1.ExitKind_EXIT_KIND_COMPLETE)

			var got []string
			var last uint64
			for range tc.want {
				resp, err := sub.Recv()
				if err != nil {
					t.Fatal(err)
				}
				ev := resp.GetEvent()
				if ev.GetWorkflowId() != "wf-ev" || ev.GetAgentId() != "agent-ev" || ev.GetSequence() <= last {
					t.Fatalf("event %v: want workflow wf-ev, agent agent-ev, sequence after %d", ev, last)
				}
				last = ev.GetSequence()
				ce := ev.GetCompaction()
				switch {
				case ce.GetContextPressure() != nil:
					p := ce.GetContextPressure()
					if p.GetAgentId() != "agent-ev" || p.GetTokensAvailable() != 3000 || p.GetTokensUsed() < 1500 ||
						p.GetFillPercent() < 50 || p.GetFillPercent() > 100 {
						t.Fatalf("pressure %v", p)
					}
					if tc.history == 6 && p.GetFillPercent() != 100 {
						t.Fatalf("pressure %v, want 100%% for a context over the budget", p)
					}
					got = append(got, "context_pressure")
				case ce.GetPreCompactionFlush() != nil:
					if !proto.Equal(ce.GetPreCompactionFlush().GetScope(), scope.Session(sid)) {
						t.Fatalf("flush scope %v, want the session's", ce.GetPreCompactionFlush().GetScope())
					}
					got = append(got, "pre_compaction_flush")
				case ce.GetCompactionComplete() != nil:
					if ce.GetCompactionComplete().GetStrategy() != compaction.NameSummarize || ce.GetCompactionComplete().GetTokensFreed() == 0 {
						t.Fatalf("complete %v", ce.GetCompactionComplete())
					}
					got = append(got, "compaction_complete")
				default:
					t.Fatalf("unexpected event %v", ev)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("events %q, want %q", got, tc.want)
			}
			// Nothing else was published: the last model call's context
			// (now under the threshold, or still over it) raises no second
			// pressure event.
			if _, err := lc.Publish(ctxT(t), &lifecyclev1.PublishRequest{Event: lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_MIDDLEWARE, "test.end", "", "", nil)}); err != nil {
				t.Fatal(err)
			}
			resp, err := sub.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetEvent().GetObservable().GetEventType() != "test.end" {
				t.Fatalf("event after the expected ones: %v", resp.GetEvent())
			}
		})
	}
}
