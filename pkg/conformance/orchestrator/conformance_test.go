package orchestrator_test

import (
	"flag"
	"testing"
	"time"

	"google.golang.org/grpc"

	conformance "github.com/secbear/neuron/pkg/conformance/orchestrator"
	"github.com/secbear/neuron/pkg/grpcclient"
)

var (
	addr           = flag.String("addr", "", "OrchestratorService to check (host:port); empty: skip (services/orchestrator runs the suite in process)")
	stateAddr      = flag.String("state-addr", "", "the StateService the orchestrator writes memory to; empty skips the checks that read it")
	tokenFile      = flag.String("token-file", "", "file holding a bearer token for the orchestrator")
	stateTokenFile = flag.String("state-token-file", "", "file holding a bearer token for the StateService")
	useTLS         = flag.Bool("tls", false, "connect with TLS (implied by -ca)")
	caFile         = flag.String("ca", "", "CA bundle that signed the servers' certificates")
	serverName     = flag.String("server-name", "", "server name to verify in the orchestrator's certificate")
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
	if *addr == "" {
		t.Skip("no -addr: services/orchestrator's TestConformance runs the suite against the reference orchestrator")
	}
	secure := *useTLS || *caFile != ""
	target := conformance.Target{
		Conn: dial(t, grpcclient.Config{Target: *addr, Plaintext: !secure, CAFile: *caFile, ServerName: *serverName, TokenFile: *tokenFile}),
		Agents: conformance.Agents{
			Answer: *answerAgent, Slow: *slowAgent, Suspend: *suspendAgent, Writer: *writerAgent,
			Approver: *approverAgent, Streamer: *streamerAgent,
		},
		WaitTimeout: *waitTimeout,
		ListWait:    *listWait,
	}
	if *stateAddr != "" {
		target.State = dial(t, grpcclient.Config{Target: *stateAddr, Plaintext: !secure, CAFile: *caFile, TokenFile: *stateTokenFile})
	}
	conformance.Run(t, target)
}

// dial connects without client retries, so the suite sees every code
// as the server returned it.
func dial(t *testing.T, cfg grpcclient.Config) *grpc.ClientConn {
	t.Helper()
	cfg.MaxRetries = -1
	cfg.Timeout = time.Minute
	conn, err := grpcclient.Dial(cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", cfg.Target, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
