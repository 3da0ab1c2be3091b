package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// limitsOrch is an OrchestratorService with one workflow, wf-l, that
// waits for a raise of its budget; it records UpdateWorkflowLimits.
type limitsOrch struct {
	orchestratorv1.UnimplementedOrchestratorServiceServer
	mu   sync.Mutex
	reqs []*orchestratorv1.UpdateWorkflowLimitsRequest
}

func (o *limitsOrch) request() *orchestratorv1.LimitRequest {
	return &orchestratorv1.LimitRequest{Kind: orchestratorv1.LimitKind_LIMIT_KIND_BUDGET, Spent: &typesv1.Money{Amount: "0.2"},
		Budget: &typesv1.Money{Amount: "0.15"}, Steps: 2, MaxSteps: 256, AgentId: "worker"}
}

func (o *limitsOrch) GetWorkflow(_ context.Context, req *orchestratorv1.GetWorkflowRequest) (*orchestratorv1.GetWorkflowResponse, error) {
	if req.GetWorkflowId() != "wf-l" {
		return nil, status.Errorf(codes.NotFound, "workflow %q not found", req.GetWorkflowId())
	}
	return &orchestratorv1.GetWorkflowResponse{Workflow: &orchestratorv1.Workflow{WorkflowId: "wf-l",
		Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED, LimitRequest: o.request()}}, nil
}

func (o *limitsOrch) ListApprovals(context.Context, *orchestratorv1.ListApprovalsRequest) (*orchestratorv1.ListApprovalsResponse, error) {
	return &orchestratorv1.ListApprovalsResponse{Approvals: []*orchestratorv1.PendingApproval{{WorkflowId: "wf-l", AgentId: "worker", Step: 2,
		LimitRequest: o.request()}}}, nil
}

func (o *limitsOrch) UpdateWorkflowLimits(_ context.Context, req *orchestratorv1.UpdateWorkflowLimitsRequest) (*orchestratorv1.UpdateWorkflowLimitsResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reqs = append(o.reqs, proto.CloneOf(req))
	return &orchestratorv1.UpdateWorkflowLimitsResponse{Sequence: uint64(len(o.reqs))}, nil
}

// TestWorkflowLimitsCLI: `neuron workflows limits` sends the change it is
// given, refuses flags that change nothing, and a workflow waiting for a
// raise reads as such in `approvals list` and `approve`.
func TestWorkflowLimitsCLI(t *testing.T) {
	o := &limitsOrch{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	orchestratorv1.RegisterOrchestratorServiceServer(s, o)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	addr := lis.Addr().String()

	code, out, errOut := runCLI(t, "workflows", "limits", "wf-l", "--budget", "2.50", "--reason", "worth it", "--key", "k1", "--addr", addr)
	if code != 0 || !strings.Contains(out, "workflow wf-l: the change is recorded as sequence 1") {
		t.Fatalf("raise: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "workflows", "limits", "wf-l", "--reject", "--reason", "too much", "--addr", addr)
	if code != 0 || !strings.Contains(out, "the refusal is recorded as sequence 2") {
		t.Fatalf("reject: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "workflows", "limits", "wf-l", "--max-steps", "300", "--addr", addr)
	if code != 0 {
		t.Fatalf("max steps: exit %d\n%s\n%s", code, out, errOut)
	}
	o.mu.Lock()
	got := o.reqs
	o.mu.Unlock()
	if len(got) != 3 || got[0].GetBudget().GetAmount() != "2.5" || got[0].GetReason() != "worth it" || got[0].GetIdempotencyKey() != "k1" ||
		!got[1].GetReject() || got[1].GetBudget() != nil || got[1].GetReason() != "too much" || got[2].GetMaxSteps() != 300 {
		t.Fatalf("requests = %v", got)
	}
	for _, bad := range [][]string{{"wf-l"}, {"wf-l", "--budget", "-1"}, {"wf-l", "--budget", "lots"}, {}} {
		code, _, errOut = runCLI(t, append(append([]string{"workflows", "limits"}, bad...), "--addr", addr)...)
		if code != exitUsage || !strings.Contains(errOut, "workflows limits") {
			t.Fatalf("limits %q: exit %d, want usage %d\n%s", bad, code, exitUsage, errOut)
		}
	}

	code, out, errOut = runCLI(t, "approvals", "list", "--addr", addr)
	if code != 0 || !strings.Contains(out, "(limit)") || !strings.Contains(out, "budget spent: $0.2 of $0.15") ||
		!strings.Contains(out, "neuron workflows limits WORKFLOW") {
		t.Fatalf("approvals list: exit %d\n%s\n%s", code, out, errOut)
	}
	code, _, errOut = runCLI(t, "approve", "wf-l", "--addr", addr)
	if code != exitStatusBase+int(codes.FailedPrecondition) || !strings.Contains(errOut, "waits for a raise, not for tool calls") ||
		!strings.Contains(errOut, "neuron workflows limits wf-l --budget USD") {
		t.Fatalf("approve: exit %d\n%s", code, errOut)
	}
}
