package operator

import (
	"fmt"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/money"
)

func testLimits(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"MaxTurns", testMaxTurns},
		{"MaxCost", testMaxCost},
		{"MaxDuration", testMaxDuration},
		{"CircuitBreaker", testCircuitBreaker},
	})
}

// writingTurns is n turns that each write conformance/t<i> and cost
// cost.
func writingTurns(n int, cost string) script {
	sc := make(script, n)
	for i := range sc {
		sc[i] = with(turn(fmt.Sprintf("Turn %d.", i), writeCall(fmt.Sprintf("conformance/t%d", i), i)), "cost", cost)
	}
	return sc
}

// testMaxTurns: a model that keeps calling tools stops at max_turns
// with an output (not an error): EXIT_KIND_MAX_TURNS, turns_used the
// limit, and the effects of the turns that ran, not of later ones.
func testMaxTurns(t *testing.T, s *suite) {
	in := s.input(t, writingTurns(4, "0"))
	in.Config = &operatorv1.OperatorConfig{MaxTurns: proto.Uint32(2)}
	out := s.execute(t, in)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_MAX_TURNS)
	if n := out.GetMetadata().GetTurnsUsed(); n != 2 {
		t.Errorf("turns_used %d, want 2 (max_turns)", n)
	}
	w := writes(out.GetEffects())
	if len(w["conformance/t0"]) != 1 || len(w["conformance/t1"]) != 1 || len(w) != 2 {
		t.Errorf("effects %v, want exactly the writes of turns 0 and 1 (effects declared before a limit are kept)", out.GetEffects())
	}
}

// testMaxCost: a loop whose cost reaches max_cost stops with
// EXIT_KIND_BUDGET_EXHAUSTED after the model call that reached it,
// reporting that cost.
func testMaxCost(t *testing.T, s *suite) {
	in := s.input(t, writingTurns(4, "0.01"))
	in.Config = &operatorv1.OperatorConfig{MaxCost: money.FromDecimal(decimal.RequireFromString("0.015"))}
	out := s.execute(t, in)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_BUDGET_EXHAUSTED)
	if n := out.GetMetadata().GetTurnsUsed(); n != 2 {
		t.Errorf("turns_used %d, want 2 (0.01 after the first call is under 0.015, 0.02 after the second is not)", n)
	}
	if c := amount(t, "metadata.cost", out.GetMetadata().GetCost()); !c.Equal(decimal.RequireFromString("0.02")) {
		t.Errorf("cost %q, want 0.02", out.GetMetadata().GetCost().GetAmount())
	}
}

// testMaxDuration: a model call that would outlast max_duration ends the
// loop with an output EXIT_KIND_TIMEOUT, within the caller's deadline
// (callTimeout, far longer than the limit and far shorter than the
// scripted delay).
func testMaxDuration(t *testing.T, s *suite) {
	in := s.input(t, script{with(turn("Too late."), "delay", longDelay)})
	in.Config = &operatorv1.OperatorConfig{MaxDuration: durationpb.New(500 * time.Millisecond)}
	out := s.execute(t, in)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_TIMEOUT)
}

// testCircuitBreaker: Target.CircuitBreaker consecutive failed tool
// calls (arguments that are not JSON) end the loop with
// EXIT_KIND_CIRCUIT_BREAKER, not an error.
func testCircuitBreaker(t *testing.T, s *suite) {
	if s.breaker <= 0 {
		t.Skip("Target.CircuitBreaker (-circuit-breaker) is 0: the deployment's limit is unknown")
	}
	sc := make(script, s.breaker+2)
	for i := range sc {
		sc[i] = turn("", map[string]any{"name": "write_memory", "raw_arguments": `{"key": `})
	}
	in := s.input(t, sc)
	in.Config = &operatorv1.OperatorConfig{MaxTurns: proto.Uint32(uint32(s.breaker + 2))}
	out := s.execute(t, in)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_CIRCUIT_BREAKER)
	if n := out.GetMetadata().GetTurnsUsed(); n != uint32(s.breaker) {
		t.Errorf("turns_used %d, want %d (one failed call per turn)", n, s.breaker)
	}
	if len(out.GetEffects()) != 0 {
		t.Errorf("effects %v, want none (no call had valid arguments)", out.GetEffects())
	}
}
