package operator_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shopspring/decimal"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider"
)

// longHistory is a session of n past exchanges, each about 1000 tokens.
type longHistory struct{ n int }

func (h longHistory) Load(context.Context, string, int) ([]provider.Message, error) {
	var msgs []provider.Message
	for i := range h.n {
		msgs = append(msgs,
			provider.Message{Role: provider.User, Parts: []provider.Part{{Text: strings.Repeat("q", 4000) + string(rune('a'+i))}}},
			provider.Message{Role: provider.Assistant, Parts: []provider.Part{{Text: "answer"}}})
	}
	return msgs, nil
}

type recordingPublisher struct {
	mu     sync.Mutex
	events []*lifecyclev1.LifecycleEvent
}

func (p *recordingPublisher) Publish(ev *lifecyclev1.LifecycleEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, ev)
}

// fakeCatalog writes a catalog file giving fake-1 a 3500-token window.
func fakeCatalog(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "catalog.json")
	data := `{"version":1,"models":[{"name":"fake-1","provider":"fake","context_window":3500,
	  "capabilities":{"tools":true},"price_per_mtok":{"input":"0","output":"0","cache_read":"0","cache_write":"0"}}]}`
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCompaction checks, with the strategy and budget set up as the
// binary's --compaction, --catalog and --context-reserve do, that the
// loop compacts what the model is shown, counts a summary call's cost,
// publishes a CompactionEvent, and still stores only the new turns.
func TestCompaction(t *testing.T) {
	cat := fakeCatalog(t)
	tests := []struct {
		name     string
		steps    []step // the summary (asked of the default model), then the answer
		wantCost string
		first    string // start of the first message the model sees
	}{
		{compaction.NameSliding, []step{say("done", "0.01")}, "0.01", strings.Repeat("q", 10)},
		{compaction.NameSummarize, []step{say("they asked many questions", "0.05"), say("done", "0.01")}, "0.06", compaction.SummaryHeader},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &fakeModel{steps: tc.steps}
			pub := &recordingPublisher{}
			c := serve(t, operator.Config{
				History:   longHistory{n: 6},
				Publisher: pub,
				Models:    operator.Models{Compaction: tc.name, Catalog: cat, ContextReserve: 500},
			}, m)
			sid := "long"
			in := input("latest question")
			in.SessionId = &sid
			in.Dispatch = &operatorv1.DispatchContext{WorkflowId: "wf-1", AgentId: "a"}
			out := execute(t, c, in)
			wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
			reqs := m.requests()
			if len(reqs) != len(tc.steps) {
				t.Fatalf("%d model calls, want %d", len(reqs), len(tc.steps))
			}
			seen := reqs[len(reqs)-1].Messages
			if len(seen) >= 13 || seen[len(seen)-1].Parts[0].Text != "latest question" {
				t.Fatalf("model saw %d messages ending %q; want fewer than 13 ending with the new question", len(seen), seen[len(seen)-1].Parts[0].Text)
			}
			if !strings.HasPrefix(seen[0].Parts[0].Text, tc.first) {
				t.Fatalf("first message %.40q, want prefix %q", seen[0].Parts[0].Text, tc.first)
			}
			if got := decimal.RequireFromString(out.GetMetadata().GetCost().GetAmount()); !got.Equal(decimal.RequireFromString(tc.wantCost)) {
				t.Fatalf("cost %s, want %s", got, tc.wantCost)
			}
			pub.mu.Lock()
			defer pub.mu.Unlock()
			// PreCompactionFlush, then CompactionComplete (no ContextPressure:
			// Models.ContextPressure is 0).
			if len(pub.events) != 2 || pub.events[0].GetCompaction().GetPreCompactionFlush() == nil {
				t.Fatalf("events published: %v", pub.events)
			}
			cc := pub.events[1].GetCompaction().GetCompactionComplete()
			if cc == nil || cc.GetTokensFreed() == 0 || pub.events[1].GetWorkflowId() != "wf-1" || !strings.HasPrefix(cc.GetStrategy(), tc.name) {
				t.Fatalf("event %v", pub.events[1])
			}
			if stored := decodeHistory(t, out.GetEffects()[0]); len(stored) != 2 {
				t.Fatalf("stored %d messages, want only the new user turn and answer", len(stored))
			}
		})
	}
}
