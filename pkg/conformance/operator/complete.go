package operator

import (
	"testing"

	"github.com/shopspring/decimal"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

func testComplete(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"Answer", testAnswer},
		{"CostSums", testCostSums},
	})
}

// testAnswer: one model call answering text completes with that text
// and reports what it consumed: the scripted usage as tokens, the
// scripted cost as a decimal string, one turn, a model and a provider.
func testAnswer(t *testing.T, s *suite) {
	const answer = "The conformance answer."
	in := s.input(t, script{with(turn(answer), "usage", usage(120, 7), "cost", "0.0125")})
	out := s.execute(t, in)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	if got := content.TextOf(out.GetMessage()); got != answer {
		t.Errorf("message %q, want the script's %q", got, answer)
	}
	md := out.GetMetadata()
	if md == nil {
		t.Fatal("no metadata; every output carries OperatorMetadata")
	}
	if md.GetTokensIn() != 120 || md.GetTokensOut() != 7 {
		t.Errorf("tokens in %d out %d, want the scripted usage 120 and 7", md.GetTokensIn(), md.GetTokensOut())
	}
	if c := amount(t, "metadata.cost", md.GetCost()); !c.Equal(decimal.RequireFromString("0.0125")) {
		t.Errorf("cost %q, want 0.0125 (the scripted cost, as a decimal string)", md.GetCost().GetAmount())
	}
	if md.GetTurnsUsed() != 1 {
		t.Errorf("turns_used %d, want 1", md.GetTurnsUsed())
	}
	if md.GetModel() == "" || md.GetProvider() == "" {
		t.Errorf("model %q provider %q, want both named", md.GetModel(), md.GetProvider())
	}
	if len(out.GetEffects()) != 0 {
		t.Errorf("effects %v, want none (no session, no effect tool called)", out.GetEffects())
	}
}

// testCostSums: the metadata of an invocation of several model calls
// sums their tokens and costs exactly (decimal arithmetic: 0.1 + 0.2 is
// 0.3) and counts the turns.
func testCostSums(t *testing.T, s *suite) {
	in := s.input(t, script{
		with(turn("Noting it.", writeCall("conformance/sum", "x")), "usage", usage(100, 10), "cost", "0.1"),
		with(turn("Noted."), "usage", usage(50, 5), "cost", "0.2"),
	})
	out := s.execute(t, in)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	md := out.GetMetadata()
	if md.GetTokensIn() != 150 || md.GetTokensOut() != 15 {
		t.Errorf("tokens in %d out %d, want 150 and 15 (the sums)", md.GetTokensIn(), md.GetTokensOut())
	}
	if c := amount(t, "metadata.cost", md.GetCost()); !c.Equal(decimal.RequireFromString("0.3")) {
		t.Errorf("cost %q, want 0.3 exactly (0.1 + 0.2 in decimal)", md.GetCost().GetAmount())
	}
	if md.GetTurnsUsed() != 2 {
		t.Errorf("turns_used %d, want 2", md.GetTurnsUsed())
	}
	if n := len(md.GetSubDispatches()); n != 1 || md.GetSubDispatches()[0].GetName() != "write_memory" || !md.GetSubDispatches()[0].GetSuccess() {
		t.Errorf("sub_dispatches %v, want one successful write_memory", md.GetSubDispatches())
	}
}
