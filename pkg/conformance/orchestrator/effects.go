package orchestrator

import (
	"testing"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// testEffects checks the Writer agent's WriteMemory effect: reported,
// applied, and applied once.
func testEffects(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"OutcomeReported", testEffectOutcome},
		{"MemoryWritten", testEffectWritten},
		{"RepeatedDispatchDoesNotApplyAgain", testEffectOnce},
	})
}

// write dispatches the Writer agent and checks the outcome it reports.
func (s *suite) write(t *testing.T, id string) *orchestratorv1.DispatchResponse {
	t.Helper()
	res := s.dispatch(t, &orchestratorv1.DispatchRequest{AgentId: s.agents.Writer, WorkflowId: id, Input: input("Remember this.")})
	if len(res.GetEffects()) != 1 {
		t.Fatalf("Dispatch of the Writer agent %q reported %d effect outcomes %v; want 1 (its WriteMemory)", s.agents.Writer, len(res.GetEffects()), res.GetEffects())
	}
	o := res.GetEffects()[0]
	if !o.GetApplied() {
		t.Fatalf("the Writer agent's WriteMemory was not applied: %q", o.GetDetail())
	}
	if o.GetIdempotencyKey() == "" {
		t.Fatal("the Writer agent's effect outcome has no idempotency_key")
	}
	effs := res.GetOutput().GetEffects()
	if len(effs) == 1 && effs[0].GetIdempotencyKey() != "" && effs[0].GetIdempotencyKey() != o.GetIdempotencyKey() {
		t.Fatalf("the effect outcome has idempotency_key %q; the output declared the effect with %q", o.GetIdempotencyKey(), effs[0].GetIdempotencyKey())
	}
	return res
}

func testEffectOutcome(t *testing.T, s *suite) {
	id := s.id("write")
	s.write(t, id)
	if wf := s.get(t, id); wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Fatalf("GetWorkflow(%q) after the Writer's Dispatch returned: %s; want COMPLETED", id, describe(wf))
	}
}

func (s *suite) needState(t *testing.T) {
	t.Helper()
	if s.state == nil {
		t.Skip("no StateService to read the written memory from (Target.State; -state-addr)")
	}
}

// written reads what the Writer wrote in workflow id's scope.
func (s *suite) written(t *testing.T, id string) *statev1.ReadResponse {
	t.Helper()
	res, err := s.state.Read(ctx(t), &statev1.ReadRequest{Scope: scope.Workflow(id), Key: WriterKey})
	if err != nil {
		t.Fatalf("State Read(workflow scope %q, key %q) after the Writer's Dispatch: %v", id, WriterKey, err)
	}
	if got := res.GetValue().GetStringValue(); got != WriterValue {
		t.Fatalf("State Read(workflow scope %q, key %q) = %v; want the string %q", id, WriterKey, res.GetValue(), WriterValue)
	}
	return res
}

func testEffectWritten(t *testing.T, s *suite) {
	s.needState(t)
	id := s.id("write")
	s.write(t, id)
	s.written(t, id)
}

// testEffectOnce: a repeated Dispatch returns the recorded outcome and
// does not write again (the key's revision does not move).
func testEffectOnce(t *testing.T, s *suite) {
	s.needState(t)
	id := s.id("write")
	first := s.write(t, id)
	before := s.written(t, id)
	again := s.write(t, id)
	if again.GetEffects()[0].GetIdempotencyKey() != first.GetEffects()[0].GetIdempotencyKey() {
		t.Fatalf("repeated Dispatch reported effect %q; the first reported %q", again.GetEffects()[0].GetIdempotencyKey(), first.GetEffects()[0].GetIdempotencyKey())
	}
	if after := s.written(t, id); after.GetRevision() != before.GetRevision() {
		t.Fatalf("key %q moved from revision %d to %d on a repeated Dispatch; want it written once", WriterKey, before.GetRevision(), after.GetRevision())
	}
}
