package operator

import (
	"slices"
	"testing"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider"
)

// loaded is a session read from a summary covering c0, then entries e1
// to e3 of two messages each: [S, e1, e1, e2, e2, e3, e3].
func loaded() *sessionMemory {
	return newSessionMemory(&loadedSession{
		summaryKey: "c0~w0", covered: []string{"conversation/c0"},
		entries: []entrySpan{
			{key: "conversation/e1", start: 1, end: 3, whole: true},
			{key: "conversation/e2", start: 3, end: 5, whole: true},
			{key: "conversation/e3", start: 5, end: 7, whole: true},
		},
	})
}

func summarized(k int) (*compaction.Report, []provider.Message) {
	return &compaction.Report{Strategy: compaction.NameSummarize, Summarized: k}, []provider.Message{compaction.SummaryMessage("sum")}
}

func slid(d int) (*compaction.Report, []provider.Message) {
	return &compaction.Report{Strategy: compaction.NameSliding, Dropped: d}, nil
}

// effectKeys renders effects as "write KEY" / "delete KEY", with the
// covers list of a covers write.
func effectKeys(t *testing.T, m *sessionMemory) []string {
	t.Helper()
	effs, err := m.effects(scope.Session("s"), "d1")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range effs {
		switch k := e.GetKind().(type) {
		case *typesv1.Effect_WriteMemory:
			line := "write " + k.WriteMemory.GetKey()
			for _, c := range k.WriteMemory.GetValue().GetStructValue().GetFields()["covers"].GetListValue().GetValues() {
				line += " " + c.GetStringValue()
			}
			out = append(out, line)
		case *typesv1.Effect_DeleteMemory:
			out = append(out, "delete "+k.DeleteMemory.GetKey())
		}
	}
	return out
}

// TestSessionMemory follows the entries a summary covers through the
// compactions of one invocation: only whole entries are listed, the
// loaded summary counts only while its text is still folded in, and
// nothing is written when nothing new is covered.
func TestSessionMemory(t *testing.T) {
	cov := "conversation/c0 conversation/e1 conversation/e2"
	tests := []struct {
		name  string
		steps [][2]any // (*Report, []Message) pairs
		want  []string
	}{
		{"summary of whole entries folds in the loaded one", [][2]any{pair(summarized(5))}, []string{
			"write summary-covers/e2~d1 " + cov, "write summary/e2~d1", "delete summary/c0~w0", "delete summary-covers/c0~w0"}},
		{"a cut inside an entry leaves it unlisted", [][2]any{pair(summarized(4))}, []string{
			"write summary-covers/e1~d1 conversation/c0 conversation/e1", "write summary/e1~d1", "delete summary/c0~w0", "delete summary-covers/c0~w0"}},
		{"and a later summary of its rest too", [][2]any{pair(summarized(4)), pair(summarized(2)), pair(summarized(3))}, []string{
			"write summary-covers/e3~d1 conversation/c0 conversation/e1 conversation/e3", "write summary/e3~d1", "delete summary/c0~w0", "delete summary-covers/c0~w0"}},
		{"the sliding window dropped the loaded summary", [][2]any{pair(slid(3)), pair(summarized(2))}, []string{
			"write summary-covers/e2~d1 conversation/e2", "write summary/e2~d1"}},
		{"nothing new covered", [][2]any{pair(summarized(1))}, nil},
		{"only a sliding window", [][2]any{pair(slid(3))}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := loaded()
			for _, s := range tt.steps {
				m.compacted(s[0].(*compaction.Report), s[1].([]provider.Message))
			}
			if got := effectKeys(t, m); !slices.Equal(got, tt.want) {
				t.Fatalf("effects\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

func pair(r *compaction.Report, out []provider.Message) [2]any { return [2]any{r, out} }
