package orchestrator_test

import (
	"flag"
	"testing"

	"github.com/secbear/neuron/pkg/conformance/internal/remote"
	conformance "github.com/secbear/neuron/pkg/conformance/orchestrator"
)

var (
	server         = remote.Register("OrchestratorService", "skip (services/orchestrator runs the suite in process)", "every OrchestratorService method")
	stateAddr      = flag.String("state-addr", "", "the StateService the orchestrator writes memory to; empty skips the checks that read it")
	stateTokenFile = flag.String("state-token-file", "", "file holding a bearer token for the StateService")
	answerAgent    = flag.String("answer-agent", conformance.DefaultAnswerAgent, "id of the Answer agent")
	slowAgent      = flag.String("slow-agent", conformance.DefaultSlowAgent, "id of the Slow agent")
	suspendAgent   = flag.String("suspend-agent", conformance.DefaultSuspendAgent, "id of the Suspend agent")
	writerAgent    = flag.String("writer-agent", conformance.DefaultWriterAgent, "id of the Writer agent")
	approverAgent  = flag.String("approver-agent", conformance.DefaultApproverAgent, "id of the Approver agent")
	streamerAgent  = flag.String("streamer-agent", conformance.DefaultStreamerAgent, "id of the Streamer agent")
	waitTimeout    = flag.Duration("wait-timeout", conformance.DefaultWaitTimeout, "bound of each wait for a workflow's status")
	listWait       = flag.Duration("list-wait", conformance.DefaultListWait, "bound of each wait for ListWorkflows to show a change")
)

// TestConformance runs the suite against -addr.
func TestConformance(t *testing.T) {
	if server.Addr() == "" {
		t.Skip("no -addr: services/orchestrator's TestConformance runs the suite against the reference orchestrator")
	}
	target := conformance.Target{
		Conn: server.Dial(t),
		Agents: conformance.Agents{
			Answer: *answerAgent, Slow: *slowAgent, Suspend: *suspendAgent, Writer: *writerAgent,
			Approver: *approverAgent, Streamer: *streamerAgent,
		},
		WaitTimeout: *waitTimeout,
		ListWait:    *listWait,
	}
	if *stateAddr != "" {
		target.State = remote.Dial(t, server.Config(*stateAddr, *stateTokenFile))
	}
	conformance.Run(t, target)
}
