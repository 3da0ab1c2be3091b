package orchestrator

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
)

// callerPatience is how long the suite's Dispatch callers wait before
// giving up on the Slow agent.
const callerPatience = time.Second

// cancel cancels a workflow that must then be CANCELED; it returns the
// workflow CancelWorkflow returned.
func (s *suite) cancel(t *testing.T, id, reason string) *orchestratorv1.Workflow {
	t.Helper()
	res, err := s.c.CancelWorkflow(ctx(t), &orchestratorv1.CancelWorkflowRequest{WorkflowId: id, Reason: reason})
	if err != nil {
		t.Fatalf("CancelWorkflow(%q): %v", id, err)
	}
	wf := res.GetWorkflow()
	if wf.GetWorkflowId() != id || wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED {
		t.Fatalf("CancelWorkflow(%q) returned workflow %q: %s; want it CANCELED", id, wf.GetWorkflowId(), describe(wf))
	}
	return wf
}

// wantCanceled fails t unless GetWorkflow and the status query show the
// workflow CANCELED.
func (s *suite) wantCanceled(t *testing.T, id string) *orchestratorv1.Workflow {
	t.Helper()
	wf := s.get(t, id)
	if wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED {
		t.Fatalf("GetWorkflow(%q) after CancelWorkflow returned: %s; want CANCELED", id, describe(wf))
	}
	if st := s.queryStatus(t, id); st["status"] != "CANCELED" {
		t.Fatalf("Query(%q, \"status\") after CancelWorkflow: status %v; want \"CANCELED\"", id, st["status"])
	}
	return wf
}

// testCancel checks CancelWorkflow of running, suspended and ended
// workflows.
func testCancel(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"RunningWorkflow", testCancelRunning},
		{"SuspendedWorkflow", testCancelSuspended},
		{"ReasonRecorded", testCancelReason},
		{"CompletedWorkflowUnchanged", testCancelCompleted},
	})
}

// slow starts the Slow agent and waits until its call is in flight.
func (s *suite) slow(t *testing.T) string {
	t.Helper()
	id := s.id("slow")
	s.start(t, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: s.agents.Slow, Input: input("Take your time.")})
	s.waitCalling(t, id)
	return id
}

// testCancelRunning cancels the Slow agent's workflow during its
// operator call; cancelling it again returns it unchanged.
func testCancelRunning(t *testing.T, s *suite) {
	id := s.slow(t)
	first := s.cancel(t, id, "conformance: cancelled while running")
	s.wantCanceled(t, id)
	again := s.cancel(t, id, "conformance: cancelled again")
	if again.GetFailure().GetMessage() != first.GetFailure().GetMessage() {
		t.Fatalf("CancelWorkflow(%q) of a CANCELED workflow returned failure %q; the first CancelWorkflow returned %q (want it unchanged)",
			id, again.GetFailure().GetMessage(), first.GetFailure().GetMessage())
	}
}

// waitCalling waits, for a few seconds at most, until the steps query
// lists an operator call of the workflow: then a cancellation has an
// in-flight call to stop. An implementation that lists only finished
// calls is not failed for it; the cancellation is checked all the same.
func (s *suite) waitCalling(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if len(s.queryList(t, id, "steps")) > 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("Query(%q, \"steps\") listed no operator call within 3s; cancelling anyway", id)
}

func testCancelSuspended(t *testing.T, s *suite) {
	id := s.suspended(t).GetWorkflowId()
	s.cancel(t, id, "conformance: cancelled while suspended")
	s.wantCanceled(t, id)
}

// testCancelReason: the reason of a CancelWorkflow is in the workflow's
// failure.message, as CancelWorkflow and GetWorkflow return it, for a
// running and for a suspended workflow.
func testCancelReason(t *testing.T, s *suite) {
	for what, id := range map[string]string{"running": s.slow(t), "suspended": s.suspended(t).GetWorkflowId()} {
		reason := "conformance: cancelled while " + what + " " + randomHex(4)
		wf := s.cancel(t, id, reason)
		if !strings.Contains(wf.GetFailure().GetMessage(), reason) {
			t.Fatalf("CancelWorkflow(%q, reason %q) of a %s workflow returned failure %v; want the reason in its message", id, reason, what, wf.GetFailure())
		}
		if got := s.get(t, id).GetFailure(); !strings.Contains(got.GetMessage(), reason) {
			t.Fatalf("GetWorkflow(%q) after CancelWorkflow(reason %q) of a %s workflow: failure %v; want the reason in its message", id, reason, what, got)
		}
	}
}

func testCancelCompleted(t *testing.T, s *suite) {
	id := s.completed(t)
	before := s.get(t, id)
	res, err := s.c.CancelWorkflow(ctx(t), &orchestratorv1.CancelWorkflowRequest{WorkflowId: id, Reason: "conformance: too late"})
	if err != nil {
		t.Fatalf("CancelWorkflow(%q) of a COMPLETED workflow: %v; want it returned unchanged", id, err)
	}
	got := res.GetWorkflow()
	if got.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || got.GetSteps() != before.GetSteps() ||
		got.GetFailure() != nil || !proto.Equal(got.GetLastOutput(), before.GetLastOutput()) {
		t.Fatalf("CancelWorkflow(%q) of a COMPLETED workflow returned %s; want it unchanged: %s", id, describe(got), describe(before))
	}
	if after := s.get(t, id); after.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Fatalf("GetWorkflow(%q) after CancelWorkflow of the COMPLETED workflow: %s; want COMPLETED", id, describe(after))
	}
}

// testCallerGivesUp: a Dispatch of the Slow agent whose caller's
// deadline passes, or who cancels, fails on the caller's side, and its
// workflow stops (FAILED or CANCELED) instead of running on.
func testCallerGivesUp(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"Deadline", testCallerDeadline},
		{"Cancel", testCallerCancel},
	})
}

func testCallerDeadline(t *testing.T, s *suite) {
	id := s.id("deadline")
	s.cancelAtEnd(t, id)
	c, cancel := context.WithTimeout(t.Context(), callerPatience)
	defer cancel()
	began := time.Now()
	_, err := s.c.Dispatch(c, &orchestratorv1.DispatchRequest{AgentId: s.agents.Slow, WorkflowId: id, Input: input("Take your time.")})
	wantCode(t, "Dispatch of the Slow agent with a deadline of "+callerPatience.String(), err, codes.DeadlineExceeded)
	s.wantStopped(t, id, began)
}

func testCallerCancel(t *testing.T, s *suite) {
	id := s.id("gone")
	s.cancelAtEnd(t, id)
	c, cancel := context.WithCancel(t.Context())
	defer cancel()
	timer := time.AfterFunc(callerPatience, cancel)
	defer timer.Stop()
	began := time.Now()
	_, err := s.c.Dispatch(c, &orchestratorv1.DispatchRequest{AgentId: s.agents.Slow, WorkflowId: id, Input: input("Take your time.")})
	wantCode(t, "Dispatch of the Slow agent cancelled by its caller after "+callerPatience.String(), err, codes.Canceled)
	s.wantStopped(t, id, began)
}

// wantStopped waits until the workflow of a Dispatch whose caller gave
// up has ended FAILED or CANCELED.
func (s *suite) wantStopped(t *testing.T, id string, began time.Time) {
	t.Helper()
	if took := time.Since(began); took > SlowAtLeast {
		t.Fatalf("the Dispatch took %v: is the Slow agent slow enough (at least %v per call)?", took, SlowAtLeast)
	}
	_, err := s.c.GetWorkflow(ctx(t), &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
	if status.Code(err) == codes.NotFound {
		t.Logf("workflow %q was never created (the caller gave up first): nothing runs on", id)
		return
	}
	wf := s.waitEnded(t, id)
	switch wf.GetStatus() {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
	default:
		t.Fatalf("workflow %q of a Dispatch whose caller gave up during the Slow agent's call ended %s; want FAILED or CANCELED", id, describe(wf))
	}
}
