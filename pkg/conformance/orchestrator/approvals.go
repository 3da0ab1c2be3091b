package orchestrator

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// The two tool calls the Approver agent's first call waits on
// (Suspension.tool_calls, in this order): tool_use_id and tool name.
const (
	ApproverCall1 = "call-1"
	ApproverTool1 = "write_file"
	ApproverCall2 = "call-2"
	ApproverTool2 = "shell"
)

// Decided is the text a resumed call of the Approver agent completes
// with: one "TOOL_USE_ID=approved" or "TOOL_USE_ID=rejected" per
// decision of input.resume.tool_decisions, sorted by tool_use_id,
// separated by single spaces ("call-1=approved call-2=rejected").
func Decided(decisions []*operatorv1.ToolDecision) string {
	sorted := slices.Clone(decisions)
	slices.SortStableFunc(sorted, func(a, b *operatorv1.ToolDecision) int { return strings.Compare(a.GetToolUseId(), b.GetToolUseId()) })
	parts := make([]string, len(sorted))
	for i, d := range sorted {
		verdict := "rejected"
		if d.GetApproved() {
			verdict = "approved"
		}
		parts[i] = d.GetToolUseId() + "=" + verdict
	}
	return strings.Join(parts, " ")
}

// testApprovals checks pending_approvals, ListApprovals and
// DecideApprovals against workflows of the Approver agent.
func testApprovals(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"SuspendedWithPendingApprovals", testApprovalsPending},
		{"ListApprovals", testApprovalsList},
		{"ListApprovalsBadPaging", testApprovalsListBad},
		{"BadDecisionsAreInvalidArgument", testApprovalsBadDecisions},
		{"DecisionResumesWorkflow", testApprovalsDecide},
		{"CompletedWorkflowIsFailedPrecondition", testApprovalsCompleted},
		{"WorkflowWaitingForSignalIsFailedPrecondition", testApprovalsSuspendedForSignal},
		{"RunningWorkflowIsFailedPrecondition", testApprovalsRunning},
		{"UnknownWorkflowIsNotFound", testApprovalsUnknown},
	})
}

// awaitingApproval starts the Approver agent and waits until its
// workflow is SUSPENDED; it returns the workflow.
func (s *suite) awaitingApproval(t *testing.T) *orchestratorv1.Workflow {
	t.Helper()
	id := s.id("approve")
	s.start(t, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: s.agents.Approver, Input: input("Tidy up, with my approval.")})
	return s.waitStatus(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
}

// wantPending fails t unless list holds exactly the Approver's two
// pending calls of workflow wf.
func (s *suite) wantPending(t *testing.T, what string, wf *orchestratorv1.Workflow, list []*orchestratorv1.PendingApproval) {
	t.Helper()
	want := map[string]string{ApproverCall1: ApproverTool1, ApproverCall2: ApproverTool2}
	if len(list) != len(want) {
		t.Fatalf("%s: %d pending approvals %v; want the Approver's 2 (%s %s, %s %s)", what, len(list), list, ApproverCall1, ApproverTool1, ApproverCall2, ApproverTool2)
	}
	seen := map[string]bool{}
	for _, p := range list {
		c := p.GetToolCall()
		if name, ok := want[c.GetToolUseId()]; !ok || name != c.GetName() || seen[c.GetToolUseId()] {
			t.Fatalf("%s: pending tool call %q (%q); want each of %s (%s) and %s (%s) once", what, c.GetToolUseId(), c.GetName(), ApproverCall1, ApproverTool1, ApproverCall2, ApproverTool2)
		}
		seen[c.GetToolUseId()] = true
		if p.GetWorkflowId() != wf.GetWorkflowId() || p.GetAgentId() != s.agents.Approver {
			t.Fatalf("%s: pending approval of workflow %q, agent %q; want %q, %q", what, p.GetWorkflowId(), p.GetAgentId(), wf.GetWorkflowId(), s.agents.Approver)
		}
		if p.GetStep() < 1 || p.GetStep() > uint64(wf.GetSteps()) {
			t.Fatalf("%s: pending approval of step %d; the workflow has made %d operator calls", what, p.GetStep(), wf.GetSteps())
		}
		if p.GetRequestTime() == nil || p.GetRequestTime().AsTime().Before(wf.GetCreateTime().AsTime()) {
			t.Fatalf("%s: request_time %v; want it set, not before the workflow's create_time %v", what, p.GetRequestTime(), wf.GetCreateTime())
		}
	}
}

func testApprovalsPending(t *testing.T, s *suite) {
	wf := s.awaitingApproval(t)
	if wf.GetSteps() < 1 {
		t.Fatalf("workflow %q waits for approval after %d steps; the operator call that stopped must count", wf.GetWorkflowId(), wf.GetSteps())
	}
	s.wantPending(t, "GetWorkflow("+wf.GetWorkflowId()+")", wf, wf.GetPendingApprovals())
}

// listApprovals walks every page of ListApprovals with filter id ("" for
// every workflow) and page size size.
func (s *suite) listApprovals(t *testing.T, id string, size int32) []*orchestratorv1.PendingApproval {
	t.Helper()
	var all []*orchestratorv1.PendingApproval
	token := ""
	for page := 0; ; page++ {
		if page > 10000 {
			t.Fatalf("ListApprovals(workflow_id %q, page_size %d): more than 10000 pages; next_page_token never empty", id, size)
		}
		res, err := s.c.ListApprovals(ctx(t), &orchestratorv1.ListApprovalsRequest{WorkflowId: id, PageSize: size, PageToken: token})
		if err != nil {
			t.Fatalf("ListApprovals(workflow_id %q, page_size %d, page %d): %v", id, size, page+1, err)
		}
		if size > 0 && len(res.GetApprovals()) > int(size) {
			t.Fatalf("ListApprovals(workflow_id %q, page_size %d): page %d has %d approvals", id, size, page+1, len(res.GetApprovals()))
		}
		all = append(all, res.GetApprovals()...)
		if token = res.GetNextPageToken(); token == "" {
			return all
		}
	}
}

func testApprovalsList(t *testing.T, s *suite) {
	wf := s.awaitingApproval(t)
	id := wf.GetWorkflowId()
	s.wantPending(t, "ListApprovals(workflow_id "+id+")", wf, s.listApprovals(t, id, 0))
	s.wantPending(t, "ListApprovals(workflow_id "+id+", page_size 1)", wf, s.listApprovals(t, id, 1))
	// Every workflow's, polled for up to the list wait (for
	// implementations that list from an eventually consistent store).
	deadline := time.Now().Add(s.listWait)
	for {
		var ours []*orchestratorv1.PendingApproval
		for _, p := range s.listApprovals(t, "", 0) {
			if p.GetWorkflowId() == id {
				ours = append(ours, p)
			}
		}
		if len(ours) >= 2 || time.Now().After(deadline) {
			s.wantPending(t, "ListApprovals of every workflow, those of "+id, wf, ours)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func testApprovalsListBad(t *testing.T, s *suite) {
	list := func(req *orchestratorv1.ListApprovalsRequest) func(*testing.T, *suite) error {
		return func(t *testing.T, s *suite) error {
			_, err := s.c.ListApprovals(ctx(t), req)
			return err
		}
	}
	runBad(t, s, []badCall{
		{name: "PageSizeNegative", code: codes.InvalidArgument, call: list(&orchestratorv1.ListApprovalsRequest{PageSize: -1})},
		{name: "PageSizeOver1000", code: codes.InvalidArgument, call: list(&orchestratorv1.ListApprovalsRequest{PageSize: 1001})},
		{name: "GarbagePageToken", code: codes.InvalidArgument, call: list(&orchestratorv1.ListApprovalsRequest{PageToken: "not a page token!"})},
	})
}

// approveFirst approves the Approver's first call and rejects its
// second.
func approveFirst() []*operatorv1.ToolDecision {
	return []*operatorv1.ToolDecision{
		{ToolUseId: ApproverCall1, Approved: true, DecidedBy: "conformance"},
		{ToolUseId: ApproverCall2, Reason: "conformance: not this one", DecidedBy: "conformance"},
	}
}

// decide runs a DecideApprovals that must succeed.
func (s *suite) decide(t *testing.T, id string, ds ...*operatorv1.ToolDecision) *orchestratorv1.DecideApprovalsResponse {
	t.Helper()
	res, err := s.c.DecideApprovals(ctx(t), &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: ds})
	if err != nil {
		t.Fatalf("DecideApprovals(%q, %s): %v", id, Decided(ds), err)
	}
	return res
}

func testApprovalsBadDecisions(t *testing.T, s *suite) {
	wf := s.awaitingApproval(t)
	id := wf.GetWorkflowId()
	yes := func(call string) *operatorv1.ToolDecision {
		return &operatorv1.ToolDecision{ToolUseId: call, Approved: true, DecidedBy: "conformance"}
	}
	unknown := s.ns + "-no-such-call"
	bad := []struct {
		name   string
		ds     []*operatorv1.ToolDecision
		naming string
	}{
		{"NoDecision", nil, ""},
		{"PendingCallUndecided", []*operatorv1.ToolDecision{yes(ApproverCall1)}, ApproverCall2},
		{"UnknownToolUseID", []*operatorv1.ToolDecision{yes(ApproverCall1), yes(ApproverCall2), yes(unknown)}, unknown},
		{"CallDecidedTwice", []*operatorv1.ToolDecision{yes(ApproverCall1), yes(ApproverCall2), yes(ApproverCall1)}, ApproverCall1},
	}
	for _, b := range bad {
		s.run(t, b.name, func(t *testing.T) {
			_, err := s.c.DecideApprovals(ctx(t), &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: b.ds})
			var names []string
			if b.naming != "" {
				names = append(names, b.naming)
			}
			wantCode(t, "DecideApprovals("+id+", "+Decided(b.ds)+")", err, codes.InvalidArgument, names...)
		})
	}
	now := s.get(t, id)
	if now.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED || now.GetSteps() != wf.GetSteps() {
		t.Fatalf("workflow %q after refused decisions: %s; before: %s (a refused decision must change nothing)", id, describe(now), describe(wf))
	}
	s.wantPending(t, "GetWorkflow("+id+") after refused decisions", now, now.GetPendingApprovals())
}

func testApprovalsDecide(t *testing.T, s *suite) {
	wf := s.awaitingApproval(t)
	id := wf.GetWorkflowId()
	ds := approveFirst()
	first := s.decide(t, id, ds...)
	if first.GetSequence() == 0 || first.GetDuplicate() {
		t.Fatalf("DecideApprovals(%q) = sequence %d, duplicate %v; want a sequence > 0, duplicate false", id, first.GetSequence(), first.GetDuplicate())
	}
	wantRetry := func(when string) {
		t.Helper()
		again := s.decide(t, id, ds...)
		if !again.GetDuplicate() || again.GetSequence() != first.GetSequence() {
			t.Fatalf("DecideApprovals(%q) repeated %s = sequence %d, duplicate %v; want sequence %d, duplicate true",
				id, when, again.GetSequence(), again.GetDuplicate(), first.GetSequence())
		}
	}
	wantRetry("at once")

	done := s.waitStatus(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if got, want := content.TextOf(done.GetLastOutput().GetMessage()), Decided(ds); got != want {
		t.Fatalf("workflow %q completed with %q; the resumed Approver reports the decisions it received: want %q", id, got, want)
	}
	if done.GetSteps() <= wf.GetSteps() {
		t.Fatalf("workflow %q completed after %d steps, as many as when it suspended; the decision must resume it with an operator call", id, done.GetSteps())
	}
	if n := len(done.GetPendingApprovals()); n != 0 {
		t.Fatalf("GetWorkflow(%q) of the completed workflow lists %d pending approvals %v; want none", id, n, done.GetPendingApprovals())
	}
	if left := s.listApprovals(t, id, 0); len(left) != 0 {
		t.Fatalf("ListApprovals(workflow_id %q) of the completed workflow = %v; want none", id, left)
	}
	wantRetry("after the workflow completed")

	other := []*operatorv1.ToolDecision{
		{ToolUseId: ApproverCall1, DecidedBy: "conformance"},
		{ToolUseId: ApproverCall2, Approved: true, DecidedBy: "conformance"},
	}
	_, err := s.c.DecideApprovals(ctx(t), &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: other})
	wantCode(t, "DecideApprovals("+id+") deciding the calls differently after "+Decided(ds), err, codes.FailedPrecondition)
}

// wantNotWaiting fails t unless DecideApprovals of workflow id is
// FAILED_PRECONDITION; what describes the workflow.
func (s *suite) wantNotWaiting(t *testing.T, id, what string) {
	t.Helper()
	_, err := s.c.DecideApprovals(ctx(t), &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: approveFirst()})
	wantCode(t, "DecideApprovals of "+what+" "+id, err, codes.FailedPrecondition)
}

func testApprovalsCompleted(t *testing.T, s *suite) {
	id := s.completed(t)
	s.wantNotWaiting(t, id, "COMPLETED workflow")
}

// testApprovalsSuspendedForSignal: a workflow suspended without tool
// calls (the Suspend agent's) lists no pending approval and waits for
// none.
func testApprovalsSuspendedForSignal(t *testing.T, s *suite) {
	wf := s.suspended(t)
	if n := len(wf.GetPendingApprovals()); n != 0 {
		t.Fatalf("GetWorkflow(%q) of the Suspend agent's workflow lists %d pending approvals %v; its suspension has no tool calls", wf.GetWorkflowId(), n, wf.GetPendingApprovals())
	}
	s.wantNotWaiting(t, wf.GetWorkflowId(), "workflow SUSPENDED without tool calls")
}

func testApprovalsRunning(t *testing.T, s *suite) {
	id := s.slow(t)
	s.wantNotWaiting(t, id, "RUNNING workflow")
}

func testApprovalsUnknown(t *testing.T, s *suite) {
	ghost := s.ns + "-no-such-workflow"
	_, err := s.c.DecideApprovals(ctx(t), &orchestratorv1.DecideApprovalsRequest{WorkflowId: ghost, Decisions: approveFirst()})
	wantCode(t, "DecideApprovals of unknown workflow "+ghost, err, codes.NotFound, ghost)
}
