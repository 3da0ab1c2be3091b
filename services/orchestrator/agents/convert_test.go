package agents_test

import (
	"testing"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/agents"
)

// A definition's busy_session policy reaches the orchestrator's agent and
// comes back when the agent is written as a definition (a file agent
// seeded into the AgentService).
func TestBusySessionRoundTrip(t *testing.T) {
	for p, want := range map[agentv1.BusySessionPolicy]string{
		agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_UNSPECIFIED: "",
		agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_REJECT:      orchestrator.BusyReject,
		agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_ENQUEUE:     orchestrator.BusyEnqueue,
		agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_INTERRUPT:   orchestrator.BusyInterrupt,
		agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_SIGNAL:      orchestrator.BusySignal,
	} {
		a, err := agents.ToAgent(&agentv1.Agent{Name: "a", Definition: &agentv1.AgentDefinition{BusySession: p,
			Route: &agentv1.Route{Target: &agentv1.Route_Operator{Operator: &agentv1.OperatorRoute{Address: "127.0.0.1:1"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if a.BusySession != want {
			t.Fatalf("%v: BusySession = %q, want %q", p, a.BusySession, want)
		}
		if back := agents.FromAgent(a).GetDefinition().GetBusySession(); back != p {
			t.Fatalf("%v: back as %v", p, back)
		}
	}
}
