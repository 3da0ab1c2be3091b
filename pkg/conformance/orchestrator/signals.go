package orchestrator

import (
	"fmt"
	"slices"
	"testing"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc/codes"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// signalType is the signal_type of the suite's signals.
const signalType = "conformance.resume"

// testSignals checks Signal against workflows of the Suspend agent.
func testSignals(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"ResumesSuspendedWorkflow", testSignalResumes},
		{"RepeatedKeyIsDuplicate", testSignalDuplicate},
		{"WithoutKeyEverySignalIsNew", testSignalWithoutKey},
		{"EndedWorkflowIsFailedPrecondition", testSignalEnded},
	})
}

// suspended starts the Suspend agent and waits until its workflow is
// SUSPENDED; it returns the workflow.
func (s *suite) suspended(t *testing.T) *orchestratorv1.Workflow {
	t.Helper()
	id := s.id("suspend")
	s.start(t, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: s.agents.Suspend, Input: input("Wait for a signal.")})
	wf := s.waitStatus(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
	if wf.GetSteps() < 1 {
		t.Fatalf("workflow %q is SUSPENDED after %d steps; the operator call that suspended it must count", id, wf.GetSteps())
	}
	return wf
}

// signal sends a signal that must be accepted.
func (s *suite) signal(t *testing.T, id, key string, data string) *orchestratorv1.SignalResponse {
	t.Helper()
	res, err := s.c.Signal(ctx(t), &orchestratorv1.SignalRequest{WorkflowId: id, IdempotencyKey: key,
		Signal: &typesv1.SignalPayload{SignalType: signalType, Data: str(data)}})
	if err != nil {
		t.Fatalf("Signal(%q, idempotency_key %q): %v", id, key, err)
	}
	return res
}

// waitResumed waits until the workflow has made more than steps
// operator calls and is SUSPENDED again (the Suspend agent suspends on
// every call).
func (s *suite) waitResumed(t *testing.T, id string, steps uint32) *orchestratorv1.Workflow {
	t.Helper()
	return s.waitFor(t, id, fmt.Sprintf("resumed by the signal (more than %d steps, then SUSPENDED again)", steps), func(wf *orchestratorv1.Workflow) bool {
		return wf.GetSteps() > steps && wf.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED
	})
}

func testSignalResumes(t *testing.T, s *suite) {
	wf := s.suspended(t)
	id := wf.GetWorkflowId()
	if st := s.queryStatus(t, id); st["status"] != "SUSPENDED" {
		t.Fatalf("Query(%q, \"status\") of a SUSPENDED workflow: status %v; want \"SUSPENDED\"", id, st["status"])
	}

	res := s.signal(t, id, s.id("key"), "go on")
	if res.GetSequence() == 0 || res.GetDuplicate() {
		t.Fatalf("Signal(%q) = sequence %d, duplicate %v; want a sequence > 0, duplicate false", id, res.GetSequence(), res.GetDuplicate())
	}
	s.waitResumed(t, id, wf.GetSteps())
	seq := float64(res.GetSequence())

	// The step that ran received it.
	steps := s.queryList(t, id, "steps")
	delivered := false
	for _, st := range steps {
		if list, ok := st["signals"].([]any); ok && slices.Contains(list, any(seq)) {
			delivered = true
		}
	}
	if !delivered {
		t.Fatalf("Query(%q, \"steps\") = %v; want a step whose \"signals\" lists sequence %v", id, steps, seq)
	}
	// The signals query lists it, delivered.
	var found map[string]any
	for _, sg := range s.queryList(t, id, "signals") {
		if sg["sequence"] == seq {
			found = sg
		}
	}
	if found == nil || found["delivered"] != true || found["signal_type"] != signalType {
		t.Fatalf("Query(%q, \"signals\"): signal %v is %v; want it listed with delivered true and signal_type %q", id, seq, found, signalType)
	}
}

func testSignalDuplicate(t *testing.T, s *suite) {
	wf := s.suspended(t)
	id := wf.GetWorkflowId()
	key := s.id("key")
	first := s.signal(t, id, key, "once")
	if first.GetSequence() == 0 || first.GetDuplicate() {
		t.Fatalf("first Signal(%q, idempotency_key %q) = sequence %d, duplicate %v; want a sequence > 0, duplicate false", id, key, first.GetSequence(), first.GetDuplicate())
	}
	for _, data := range []string{"once", "a retry carrying other data"} {
		again := s.signal(t, id, key, data)
		if !again.GetDuplicate() || again.GetSequence() != first.GetSequence() {
			t.Fatalf("Signal(%q) repeating idempotency_key %q (data %q) = sequence %d, duplicate %v; want sequence %d, duplicate true",
				id, key, data, again.GetSequence(), again.GetDuplicate(), first.GetSequence())
		}
	}
	s.waitResumed(t, id, wf.GetSteps())
	var seqs []any
	for _, sg := range s.queryList(t, id, "signals") {
		seqs = append(seqs, sg["sequence"])
	}
	if len(seqs) != 1 || seqs[0] != float64(first.GetSequence()) {
		t.Fatalf("Query(%q, \"signals\") lists sequences %v after one signal sent three times with one key; want only %d", id, seqs, first.GetSequence())
	}
}

func testSignalWithoutKey(t *testing.T, s *suite) {
	wf := s.suspended(t)
	id := wf.GetWorkflowId()
	a := s.signal(t, id, "", "first")
	b := s.signal(t, id, "", "second")
	if a.GetDuplicate() || b.GetDuplicate() || a.GetSequence() == 0 || b.GetSequence() <= a.GetSequence() {
		t.Fatalf("two Signals without idempotency_key to %q = (sequence %d, duplicate %v), (sequence %d, duplicate %v); want two new signals, the second's sequence greater",
			id, a.GetSequence(), a.GetDuplicate(), b.GetSequence(), b.GetDuplicate())
	}
	s.waitResumed(t, id, wf.GetSteps())
}

func testSignalEnded(t *testing.T, s *suite) {
	done := s.completed(t)
	_, err := s.c.Signal(ctx(t), &orchestratorv1.SignalRequest{WorkflowId: done, Signal: &typesv1.SignalPayload{SignalType: signalType}})
	wantCode(t, "Signal to COMPLETED workflow "+done, err, codes.FailedPrecondition)
	_, err = s.c.Signal(ctx(t), &orchestratorv1.SignalRequest{WorkflowId: done, IdempotencyKey: s.id("key"), Signal: &typesv1.SignalPayload{SignalType: signalType}})
	wantCode(t, "Signal with an idempotency_key to COMPLETED workflow "+done, err, codes.FailedPrecondition)

	wf := s.suspended(t)
	id := wf.GetWorkflowId()
	s.cancel(t, id, "conformance: cancelled before the signal")
	s.wantCanceled(t, id)
	_, err = s.c.Signal(ctx(t), &orchestratorv1.SignalRequest{WorkflowId: id, Signal: &typesv1.SignalPayload{SignalType: signalType}})
	wantCode(t, "Signal to CANCELED workflow "+id, err, codes.FailedPrecondition)
}

// testQuery checks the built-in query types on a completed workflow.
func testQuery(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"Status", testQueryStatus},
		{"Steps", testQuerySteps},
	})
}

func testQueryStatus(t *testing.T, s *suite) {
	id := s.completed(t)
	wf := s.get(t, id)
	st := s.queryStatus(t, id)
	if st["status"] != "COMPLETED" || st["root_agent"] != s.agents.Answer {
		t.Fatalf("Query(%q, \"status\") = %v; want status \"COMPLETED\", root_agent %q", id, st, s.agents.Answer)
	}
	if n, ok := number(st["steps"]); !ok || n != float64(wf.GetSteps()) {
		t.Fatalf("Query(%q, \"status\"): steps %v; GetWorkflow says %d", id, st["steps"], wf.GetSteps())
	}
	var spent decimal.Decimal
	var err error
	switch v := st["spent"].(type) {
	case string:
		spent, err = decimal.NewFromString(v)
	case float64:
		spent = decimal.NewFromFloat(v)
	default:
		err = fmt.Errorf("%v is neither a decimal string nor a number", v)
	}
	if err != nil {
		t.Fatalf("Query(%q, \"status\"): spent: %v", id, err)
	}
	if want := amount(t, "Workflow spent", wf.GetSpent()); !spent.Equal(want) {
		t.Fatalf("Query(%q, \"status\"): spent %s; GetWorkflow says %s", id, spent, want)
	}
}

func testQuerySteps(t *testing.T, s *suite) {
	id := s.completed(t)
	wf := s.get(t, id)
	steps := s.queryList(t, id, "steps")
	if len(steps) != int(wf.GetSteps()) {
		t.Fatalf("Query(%q, \"steps\") lists %d steps; GetWorkflow says %d: %v", id, len(steps), wf.GetSteps(), steps)
	}
	for i, st := range steps {
		if st["agent"] != s.agents.Answer {
			t.Fatalf("Query(%q, \"steps\"): step %d has agent %v; want %q", id, i+1, st["agent"], s.agents.Answer)
		}
	}
}
