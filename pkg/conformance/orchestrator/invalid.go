package orchestrator

import (
	"testing"

	"google.golang.org/grpc/codes"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// badCall is a request with one fault and the code it must get.
type badCall struct {
	name string
	call func(t *testing.T, s *suite) error
	code codes.Code
	// names: the message must contain it (a workflow or agent id).
	names func(s *suite) string
}

func runBad(t *testing.T, s *suite, calls []badCall) {
	t.Helper()
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			var names []string
			if c.names != nil {
				names = append(names, c.names(s))
			}
			wantCode(t, c.name, c.call(t, s), c.code, names...)
		})
	}
}

// completed dispatches the Answer agent and returns the id of its
// (COMPLETED) workflow.
func (s *suite) completed(t *testing.T) string {
	t.Helper()
	id := s.id("done")
	s.dispatch(t, &orchestratorv1.DispatchRequest{AgentId: s.agents.Answer, WorkflowId: id, Input: input("Finish.")})
	return id
}

// testInvalidArgument: each malformed request is INVALID_ARGUMENT.
func testInvalidArgument(t *testing.T, s *suite) {
	dispatch := func(req *orchestratorv1.DispatchRequest) func(*testing.T, *suite) error {
		return func(t *testing.T, s *suite) error {
			_, err := s.c.Dispatch(ctx(t), req)
			return err
		}
	}
	start := func(req *orchestratorv1.StartWorkflowRequest) func(*testing.T, *suite) error {
		return func(t *testing.T, s *suite) error {
			res, err := s.c.StartWorkflow(ctx(t), req)
			if err == nil {
				s.cancelAtEnd(t, res.GetWorkflowId())
			}
			return err
		}
	}
	list := func(req *orchestratorv1.ListWorkflowsRequest) func(*testing.T, *suite) error {
		return func(t *testing.T, s *suite) error {
			_, err := s.c.ListWorkflows(ctx(t), req)
			return err
		}
	}
	noMessage := &operatorv1.OperatorInput{Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}
	a := s.agents.Answer
	runBad(t, s, []badCall{
		{name: "DispatchWithoutInputMessage", code: codes.InvalidArgument,
			call: dispatch(&orchestratorv1.DispatchRequest{AgentId: a, WorkflowId: s.id("bad"), Input: noMessage})},
		{name: "DispatchWithoutInput", code: codes.InvalidArgument,
			call: dispatch(&orchestratorv1.DispatchRequest{AgentId: a, WorkflowId: s.id("bad")})},
		{name: "DispatchWithoutAgentID", code: codes.InvalidArgument,
			call: dispatch(&orchestratorv1.DispatchRequest{WorkflowId: s.id("bad"), Input: input("x")})},
		{name: "DispatchWithMalformedBudget", code: codes.InvalidArgument,
			call: dispatch(&orchestratorv1.DispatchRequest{AgentId: a, WorkflowId: s.id("bad"), Input: input("x"), Budget: &typesv1.Money{Amount: "ten dollars"}})},
		{name: "DispatchWithNegativeBudget", code: codes.InvalidArgument,
			call: dispatch(&orchestratorv1.DispatchRequest{AgentId: a, WorkflowId: s.id("bad"), Input: input("x"), Budget: &typesv1.Money{Amount: "-1"}})},
		{name: "StartWorkflowWithoutInputMessage", code: codes.InvalidArgument,
			call: start(&orchestratorv1.StartWorkflowRequest{AgentId: a, WorkflowId: s.id("bad"), Input: noMessage})},
		{name: "StartWorkflowWithMalformedBudget", code: codes.InvalidArgument,
			call: start(&orchestratorv1.StartWorkflowRequest{AgentId: a, WorkflowId: s.id("bad"), Input: input("x"), Budget: &typesv1.Money{Amount: "1e3"}})},
		{name: "DispatchManyWithoutTasks", code: codes.InvalidArgument, call: func(t *testing.T, s *suite) error {
			_, err := s.c.DispatchMany(ctx(t), &orchestratorv1.DispatchManyRequest{})
			return err
		}},
		{name: "QueryOfUnknownType", code: codes.InvalidArgument, names: func(*suite) string { return "conformance-no-such-query" },
			call: func(t *testing.T, s *suite) error {
				_, err := s.c.Query(ctx(t), &orchestratorv1.QueryRequest{WorkflowId: s.completed(t), QueryType: "conformance-no-such-query"})
				return err
			}},
		{name: "SignalWithoutPayload", code: codes.InvalidArgument, call: func(t *testing.T, s *suite) error {
			_, err := s.c.Signal(ctx(t), &orchestratorv1.SignalRequest{WorkflowId: s.completed(t)})
			return err
		}},
		{name: "ListPageSizeNegative", code: codes.InvalidArgument, call: list(&orchestratorv1.ListWorkflowsRequest{PageSize: -1})},
		{name: "ListPageSizeOver1000", code: codes.InvalidArgument, call: list(&orchestratorv1.ListWorkflowsRequest{PageSize: 1001})},
		{name: "ListGarbagePageToken", code: codes.InvalidArgument, call: list(&orchestratorv1.ListWorkflowsRequest{PageToken: "not a page token!"})},
		// Valid base64 that this server did not issue.
		{name: "ListForgedPageToken", code: codes.InvalidArgument, call: list(&orchestratorv1.ListWorkflowsRequest{PageToken: "Y29uZm9ybWFuY2UtZm9yZ2VkLXRva2Vu"})},
	})
}

// testNotFound: unknown agents and workflows are NOT_FOUND, naming them.
func testNotFound(t *testing.T, s *suite) {
	ghostAgent := func(s *suite) string { return s.ns + "-no-such-agent" }
	ghostWF := func(s *suite) string { return s.ns + "-no-such-workflow" }
	runBad(t, s, []badCall{
		{name: "DispatchOfUnknownAgent", code: codes.NotFound, names: ghostAgent, call: func(t *testing.T, s *suite) error {
			_, err := s.c.Dispatch(ctx(t), &orchestratorv1.DispatchRequest{AgentId: ghostAgent(s), WorkflowId: s.id("ghost"), Input: input("x")})
			return err
		}},
		{name: "StartWorkflowOfUnknownAgent", code: codes.NotFound, names: ghostAgent, call: func(t *testing.T, s *suite) error {
			_, err := s.c.StartWorkflow(ctx(t), &orchestratorv1.StartWorkflowRequest{AgentId: ghostAgent(s), WorkflowId: s.id("ghost"), Input: input("x")})
			return err
		}},
		{name: "GetWorkflow", code: codes.NotFound, names: ghostWF, call: func(t *testing.T, s *suite) error {
			_, err := s.c.GetWorkflow(ctx(t), &orchestratorv1.GetWorkflowRequest{WorkflowId: ghostWF(s)})
			return err
		}},
		{name: "Query", code: codes.NotFound, names: ghostWF, call: func(t *testing.T, s *suite) error {
			_, err := s.c.Query(ctx(t), &orchestratorv1.QueryRequest{WorkflowId: ghostWF(s), QueryType: "status"})
			return err
		}},
		{name: "Signal", code: codes.NotFound, names: ghostWF, call: func(t *testing.T, s *suite) error {
			_, err := s.c.Signal(ctx(t), &orchestratorv1.SignalRequest{WorkflowId: ghostWF(s), Signal: &typesv1.SignalPayload{SignalType: "conformance"}})
			return err
		}},
		{name: "SignalWithIdempotencyKey", code: codes.NotFound, names: ghostWF, call: func(t *testing.T, s *suite) error {
			_, err := s.c.Signal(ctx(t), &orchestratorv1.SignalRequest{WorkflowId: ghostWF(s), IdempotencyKey: "k",
				Signal: &typesv1.SignalPayload{SignalType: "conformance"}})
			return err
		}},
		{name: "CancelWorkflow", code: codes.NotFound, names: ghostWF, call: func(t *testing.T, s *suite) error {
			_, err := s.c.CancelWorkflow(ctx(t), &orchestratorv1.CancelWorkflowRequest{WorkflowId: ghostWF(s), Reason: "conformance"})
			return err
		}},
	})
}
