package operator

import (
	"slices"
	"testing"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
)

func testEffects(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"Declared", testEffectsDeclared},
		{"KeysStable", testEffectKeysStable},
	})
}

// effectScript writes two values in one turn, then answers.
func effectScript() script {
	return script{
		turn("Writing two notes.", writeCall("conformance/a", "first"), writeCall("conformance/b", map[string]any{"n": 2.0, "ok": true})),
		turn("Both notes are written."),
	}
}

// testEffectsDeclared: each write_memory call is declared as a
// WriteMemory effect, in the model's order, in the workflow scope it
// names, with a non-empty idempotency key unique within the output.
func testEffectsDeclared(t *testing.T, s *suite) {
	in := s.input(t, effectScript())
	out := s.execute(t, in)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	effects := out.GetEffects()
	if len(effects) != 2 {
		t.Fatalf("%d effects %v, want 2 (the two write_memory calls)", len(effects), effects)
	}
	wantWrite(t, in, effects[0], "conformance/a", "first")
	wantWrite(t, in, effects[1], "conformance/b", map[string]any{"n": 2.0, "ok": true})
	if effects[0].GetIdempotencyKey() == effects[1].GetIdempotencyKey() {
		t.Fatalf("both effects have the idempotency key %q; each effect needs its own", effects[0].GetIdempotencyKey())
	}
}

// testEffectKeysStable: the orchestrator retries a dispatch with the same
// dispatch id and applies each effect once by its key, so the same input
// must declare the same keys, and another dispatch other keys.
func testEffectKeysStable(t *testing.T, s *suite) {
	in := s.input(t, effectScript())
	first := keys(s.execute(t, in).GetEffects())
	again := keys(s.execute(t, in).GetEffects())
	if !slices.Equal(first, again) {
		t.Fatalf("the same input (dispatch %q) declared keys %q, then %q; a retried dispatch must declare the same keys",
			in.GetDispatch().GetDispatchId(), first, again)
	}
	other := s.input(t, effectScript())
	for _, k := range keys(s.execute(t, other).GetEffects()) {
		if slices.Contains(first, k) {
			t.Fatalf("dispatches %q and %q both declared the key %q; keys must differ between dispatches",
				in.GetDispatch().GetDispatchId(), other.GetDispatch().GetDispatchId(), k)
		}
	}
}
