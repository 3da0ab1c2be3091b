package orchestrator_test

import (
	"strings"
	"testing"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/agents"
)

// An agent's tool_approvals reach every invocation's config, from the
// registry file and from a stored definition alike, and survive the
// file's seeding into a definition.
func TestToolApprovalsReachTheOperator(t *testing.T) {
	r, err := orchestrator.ParseRegistry([]byte(`agents:
  - id: careful
    operator: 127.0.0.1:1
    tool_approvals: {write_file: always, read_file: never, "*": ask}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := r.Lookup("careful")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]operatorv1.ToolApproval{
		"write_file": operatorv1.ToolApproval_TOOL_APPROVAL_ALWAYS,
		"read_file":  operatorv1.ToolApproval_TOOL_APPROVAL_NEVER,
		"*":          operatorv1.ToolApproval_TOOL_APPROVAL_UNLESS_READ_ONLY,
	}
	check := func(where string, got map[string]operatorv1.ToolApproval) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: tool_approvals = %v, want %v", where, got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("%s: tool_approvals = %v, want %v", where, got, want)
			}
		}
	}
	check("file", a.Apply(nil).GetConfig().GetToolApprovals())
	// An input's own policy wins, whole.
	own := &operatorv1.OperatorInput{Config: &operatorv1.OperatorConfig{ToolApprovals: map[string]operatorv1.ToolApproval{"x": operatorv1.ToolApproval_TOOL_APPROVAL_ALWAYS}}}
	if got := a.Apply(own).GetConfig().GetToolApprovals(); len(got) != 1 {
		t.Fatalf("the input's own tool_approvals were merged: %v", got)
	}

	def := agents.FromAgent(a).GetDefinition()
	if def.GetToolApprovals()["*"] != agentv1.ApprovalPolicy_APPROVAL_POLICY_ASK || def.GetToolApprovals()["write_file"] != agentv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS {
		t.Fatalf("seeded definition tool_approvals = %v", def.GetToolApprovals())
	}
	back, err := agents.ToAgent(&agentv1.Agent{Name: "careful", Definition: def})
	if err != nil {
		t.Fatal(err)
	}
	check("definition", back.Apply(nil).GetConfig().GetToolApprovals())

	_, err = orchestrator.ParseRegistry([]byte(`agents:
  - id: careful
    operator: 127.0.0.1:1
    tool_approvals: {write_file: sometimes}
`))
	if err == nil || !strings.Contains(err.Error(), "want a tool name") || !strings.Contains(err.Error(), "never, always or ask") {
		t.Fatalf("a bad policy: %v", err)
	}
}
