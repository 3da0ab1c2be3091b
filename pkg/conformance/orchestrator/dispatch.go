package orchestrator

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// testDispatch checks Dispatch: the answer, the workflow it leaves, and
// repeats with the same workflow_id.
func testDispatch(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"ReturnsOutputAndCost", testDispatchAnswer},
		{"AssignsWorkflowID", testDispatchAssignsID},
		{"RepeatReturnsRecordedResult", testDispatchRepeat},
		{"OtherRequestWithSameIDIsAlreadyExists", testDispatchConflict},
	})
}

// wantAnswer fails t unless res is a completed Answer dispatch of
// workflow id whose record agrees with it; it returns the record.
func (s *suite) wantAnswer(t *testing.T, id string, res *orchestratorv1.DispatchResponse) *orchestratorv1.Workflow {
	t.Helper()
	if res.GetWorkflowId() != id {
		t.Fatalf("Dispatch(workflow_id %q) returned workflow_id %q", id, res.GetWorkflowId())
	}
	if res.GetOutput() == nil || content.TextOf(res.GetOutput().GetMessage()) == "" {
		t.Fatalf("Dispatch of the Answer agent %q returned output %v; want its text answer", s.agents.Answer, res.GetOutput())
	}
	if len(res.GetEffects()) != 0 {
		t.Fatalf("Dispatch of the Answer agent %q reported %d effect outcomes %v; the agent declares none", s.agents.Answer, len(res.GetEffects()), res.GetEffects())
	}
	cost := amount(t, "Dispatch total_cost", res.GetTotalCost())

	wf := s.get(t, id)
	if wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Fatalf("GetWorkflow(%q) after its Dispatch returned: %s; want COMPLETED", id, describe(wf))
	}
	if wf.GetSteps() < 1 {
		t.Fatalf("GetWorkflow(%q): %d steps after a Dispatch that called the operator; want at least 1", id, wf.GetSteps())
	}
	if wf.GetRootAgentId() != s.agents.Answer || wf.GetCurrentAgentId() != s.agents.Answer {
		t.Fatalf("GetWorkflow(%q): root agent %q, current agent %q; want %q for both", id, wf.GetRootAgentId(), wf.GetCurrentAgentId(), s.agents.Answer)
	}
	if spent := amount(t, "Workflow spent", wf.GetSpent()); !spent.Equal(cost) {
		t.Fatalf("GetWorkflow(%q): spent %s; Dispatch reported total_cost %s", id, spent, cost)
	}
	if !proto.Equal(wf.GetLastOutput(), res.GetOutput()) {
		t.Fatalf("GetWorkflow(%q): last_output %v; want the output Dispatch returned, %v", id, wf.GetLastOutput(), res.GetOutput())
	}
	if wf.GetCreateTime() == nil || wf.GetUpdateTime() == nil || wf.GetUpdateTime().AsTime().Before(wf.GetCreateTime().AsTime()) {
		t.Fatalf("GetWorkflow(%q): create_time %v, update_time %v; want both set, update not before create", id, wf.GetCreateTime(), wf.GetUpdateTime())
	}
	return wf
}

func testDispatchAnswer(t *testing.T, s *suite) {
	id := s.id("dispatch")
	res := s.dispatch(t, &orchestratorv1.DispatchRequest{AgentId: s.agents.Answer, WorkflowId: id, Input: input("What is 2 + 2?")})
	s.wantAnswer(t, id, res)
	if k := res.GetOutput().GetExitReason().GetKind(); k != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		t.Fatalf("Dispatch of the Answer agent: output exit %v; want EXIT_KIND_COMPLETE", k)
	}
}

func testDispatchAssignsID(t *testing.T, s *suite) {
	res := s.dispatch(t, &orchestratorv1.DispatchRequest{AgentId: s.agents.Answer, Input: input("Without a workflow id.")})
	if res.GetWorkflowId() == "" {
		t.Fatal("Dispatch without workflow_id returned an empty workflow_id; want the id it assigned")
	}
	s.wantAnswer(t, res.GetWorkflowId(), res)
}

// testDispatchRepeat: a repeated Dispatch (same workflow_id, same
// request) returns the recorded result and runs nothing again.
func testDispatchRepeat(t *testing.T, s *suite) {
	id := s.id("repeat")
	req := &orchestratorv1.DispatchRequest{AgentId: s.agents.Answer, WorkflowId: id, Input: input("Answer once.")}
	first := s.dispatch(t, req)
	wf := s.wantAnswer(t, id, first)
	for i := range 2 {
		again := s.dispatch(t, req)
		if !proto.Equal(again, first) {
			t.Fatalf("repeated Dispatch #%d of workflow %q returned %v; want the recorded result %v", i+1, id, again, first)
		}
	}
	if now := s.get(t, id); now.GetSteps() != wf.GetSteps() || now.GetStatus() != wf.GetStatus() {
		t.Fatalf("workflow %q after repeated Dispatches: %s; before them: %s (a repeat must not run the agent again)", id, describe(now), describe(wf))
	}
}

// testDispatchConflict: another request reusing a workflow_id is
// ALREADY_EXISTS and leaves the workflow alone.
func testDispatchConflict(t *testing.T, s *suite) {
	id := s.id("conflict")
	res := s.dispatch(t, &orchestratorv1.DispatchRequest{AgentId: s.agents.Answer, WorkflowId: id, Input: input("The first request.")})
	wf := s.wantAnswer(t, id, res)
	others := map[string]*orchestratorv1.DispatchRequest{
		"another message": {AgentId: s.agents.Answer, WorkflowId: id, Input: input("Another request.")},
		"another agent":   {AgentId: s.agents.Writer, WorkflowId: id, Input: input("The first request.")},
	}
	for name, req := range others {
		_, err := s.c.Dispatch(ctx(t), req)
		wantCode(t, "Dispatch reusing workflow_id "+id+" with "+name, err, codes.AlreadyExists)
	}
	if now := s.get(t, id); now.GetSteps() != wf.GetSteps() || now.GetStatus() != wf.GetStatus() || !proto.Equal(now.GetLastOutput(), wf.GetLastOutput()) {
		t.Fatalf("workflow %q after refused Dispatches: %s; before: %s", id, describe(now), describe(wf))
	}
}

// testStartWorkflow checks StartWorkflow: it returns before the
// workflow ends, is idempotent, and the workflow runs to its end.
func testStartWorkflow(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"ReturnsAtOnce", testStartReturnsAtOnce},
		{"WorkflowCompletes", testStartCompletes},
		{"AssignsWorkflowID", testStartAssignsID},
		{"OtherRequestWithSameIDIsAlreadyExists", testStartConflict},
	})
}

// testStartReturnsAtOnce starts the Slow agent: StartWorkflow returns
// while its operator call still runs; a repeat is already_started.
func testStartReturnsAtOnce(t *testing.T, s *suite) {
	id := s.id("start-slow")
	req := &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: s.agents.Slow, Input: input("Take your time.")}
	began := time.Now()
	res := s.start(t, req)
	if took := time.Since(began); took > startBound {
		t.Fatalf("StartWorkflow of the Slow agent took %v; it must return without waiting for the workflow (within %v)", took, startBound)
	}
	if res.GetWorkflowId() != id || res.GetAlreadyStarted() {
		t.Fatalf("StartWorkflow(workflow_id %q) = %v; want workflow_id %q, already_started false", id, res, id)
	}
	if wf := s.get(t, id); wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING {
		t.Fatalf("GetWorkflow(%q) just after StartWorkflow of the Slow agent: %s; want RUNNING", id, describe(wf))
	}
	again, err := s.c.StartWorkflow(ctx(t), req)
	if err != nil {
		t.Fatalf("repeated StartWorkflow(workflow_id %q): %v", id, err)
	}
	if again.GetWorkflowId() != id || !again.GetAlreadyStarted() {
		t.Fatalf("repeated StartWorkflow(workflow_id %q) = %v; want workflow_id %q, already_started true", id, again, id)
	}
}

func testStartCompletes(t *testing.T, s *suite) {
	id := s.id("start")
	req := &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: s.agents.Answer, Input: input("Answer in the background.")}
	res := s.start(t, req)
	if res.GetWorkflowId() != id || res.GetAlreadyStarted() {
		t.Fatalf("StartWorkflow(workflow_id %q) = %v; want workflow_id %q, already_started false", id, res, id)
	}
	wf := s.waitStatus(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if wf.GetSteps() < 1 || content.TextOf(wf.GetLastOutput().GetMessage()) == "" {
		t.Fatalf("workflow %q completed with %d steps and last_output %v; want at least 1 step and the Answer agent's text", id, wf.GetSteps(), wf.GetLastOutput())
	}
	again, err := s.c.StartWorkflow(ctx(t), req)
	if err != nil {
		t.Fatalf("StartWorkflow(workflow_id %q) again after it completed: %v", id, err)
	}
	if again.GetWorkflowId() != id || !again.GetAlreadyStarted() {
		t.Fatalf("StartWorkflow(workflow_id %q) again after it completed = %v; want already_started true", id, again)
	}
	if now := s.get(t, id); now.GetSteps() != wf.GetSteps() || now.GetStatus() != wf.GetStatus() {
		t.Fatalf("workflow %q after a repeated StartWorkflow: %s; before: %s (a repeat must not run it again)", id, describe(now), describe(wf))
	}
}

func testStartAssignsID(t *testing.T, s *suite) {
	res := s.start(t, &orchestratorv1.StartWorkflowRequest{AgentId: s.agents.Answer, Input: input("Without a workflow id.")})
	if res.GetWorkflowId() == "" || res.GetAlreadyStarted() {
		t.Fatalf("StartWorkflow without workflow_id = %v; want the id it assigned, already_started false", res)
	}
	s.waitStatus(t, res.GetWorkflowId(), orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
}

func testStartConflict(t *testing.T, s *suite) {
	id := s.id("start-conflict")
	s.start(t, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: s.agents.Answer, Input: input("The first request.")})
	_, err := s.c.StartWorkflow(ctx(t), &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: s.agents.Answer, Input: input("Another request.")})
	wantCode(t, "StartWorkflow reusing workflow_id "+id+" with another message", err, codes.AlreadyExists)
	_, err = s.c.Dispatch(ctx(t), &orchestratorv1.DispatchRequest{WorkflowId: id, AgentId: s.agents.Answer, Input: input("Another request.")})
	wantCode(t, "Dispatch reusing the workflow_id "+id+" of a StartWorkflow with another message", err, codes.AlreadyExists)
}

// testDispatchMany checks the batch: results in task order, failures
// alone.
func testDispatchMany(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"ResultsInTaskOrder", testDispatchManyOrder},
	})
}

func testDispatchManyOrder(t *testing.T, s *suite) {
	ghost := s.id("no-such-agent")
	ids := []string{s.id("many"), s.id("many"), s.id("many"), s.id("many"), s.id("many")}
	agents := []string{s.agents.Answer, ghost, s.agents.Answer, s.agents.Writer, s.agents.Answer}
	var tasks []*orchestratorv1.DispatchRequest
	for i, id := range ids {
		tasks = append(tasks, &orchestratorv1.DispatchRequest{AgentId: agents[i], WorkflowId: id, Input: input("Task " + id)})
	}
	res, err := s.c.DispatchMany(ctx(t), &orchestratorv1.DispatchManyRequest{Tasks: tasks, MaxConcurrency: 3})
	if err != nil {
		t.Fatalf("DispatchMany of %d tasks, one for an unknown agent: %v; want per-task results", len(tasks), err)
	}
	if got := len(res.GetResults()); got != len(tasks) {
		t.Fatalf("DispatchMany of %d tasks returned %d results", len(tasks), got)
	}
	for i, r := range res.GetResults() {
		if agents[i] == ghost {
			e := r.GetError()
			if e == nil {
				t.Errorf("result %d (unknown agent %q) = %v; want an error", i, ghost, r)
				continue
			}
			if codes.Code(e.GetCode()) != codes.NotFound || !strings.Contains(e.GetMessage(), ghost) {
				t.Errorf("result %d (unknown agent %q): error %v %q; want NOT_FOUND naming the agent", i, ghost, codes.Code(e.GetCode()), e.GetMessage())
			}
			continue
		}
		resp := r.GetResponse()
		if resp == nil {
			t.Errorf("result %d (agent %q, workflow %q): error %v; want a response (one task's failure must not fail the others)", i, agents[i], ids[i], r.GetError())
			continue
		}
		if resp.GetWorkflowId() != ids[i] {
			t.Errorf("result %d is of workflow %q; want task %d's, %q (results in task order)", i, resp.GetWorkflowId(), i, ids[i])
			continue
		}
		if resp.GetOutput() == nil {
			t.Errorf("result %d (workflow %q) has no output", i, ids[i])
		}
		if wf := s.get(t, ids[i]); wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || wf.GetRootAgentId() != agents[i] {
			t.Errorf("workflow %q of result %d: %s, root agent %q; want COMPLETED, %q", ids[i], i, describe(wf), wf.GetRootAgentId(), agents[i])
		}
	}
}
