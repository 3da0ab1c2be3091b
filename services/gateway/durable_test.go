//go:build unix

package gateway_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/a2a"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/gateway"
)

// gatewayProc runs the gateway binary in front of s's orchestrator and
// State service, on s.grpcAddr and s.httpURL, with more flags.
func gatewayProc(t *testing.T, ctx context.Context, s *stack, bin, logName string, flags ...string) *proc.Proc {
	t.Helper()
	p := proc.Start(t, bin, proc.Options{Name: "gateway", LogPath: filepath.Join(t.TempDir(), logName), EnvPrefix: "NEURON_GATEWAY"},
		append([]string{"--dev", "--addr", s.grpcAddr, "--http-addr", strings.TrimPrefix(s.httpURL, "http://"),
			"--orchestrator-addr", s.orchAddr, "--state-addr", s.stateAddr, "--agents", s.registry, "--log-format", "text"}, flags...)...)
	p.WaitServing(ctx, t, healthpb.NewHealthClient(harness.Dial(t, s.grpcAddr)), "", 50*time.Millisecond)
	return p
}

// The done-when of durable lanes: messages the gateway binary
// acknowledged (non-blocking A2A sends, answered "submitted") and had
// not started when it was SIGKILLed all run after it starts again,
// each exactly once (one workflow, one model call), in the order sent.
func TestDurableLanesSurviveKill(t *testing.T) {
	bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/gateway/cmd/gateway")
	s := startStack(t, stackOptions{noGateway: true}, scriptedAgent("paced", map[string]any{"text": "noted", "delay": "500ms"}))
	s.grpcAddr, s.httpURL = proc.FreeAddr(t), "http://"+proc.FreeAddr(t)
	ctx := ctxFor(t, 4*time.Minute)
	gw := gatewayProc(t, ctx, s, bin, "gateway-1.log")

	const n = 5
	const session = "crash-lane"
	c := a2aClients(t, s, "paced")["jsonrpc"]
	var ids []string
	for i := range n {
		p := userText(session, fmt.Sprintf("message %d", i))
		p.Config = &a2a.MessageSendConfig{Blocking: new(bool)}
		task := asTask(t)(c.SendMessage(ctx, p))
		if task.Status.State != a2a.TaskStateSubmitted && task.Status.State != a2a.TaskStateWorking {
			t.Fatalf("message %d acknowledged as %s", i, task.Status.State)
		}
		ids = append(ids, string(task.ID))
	}
	gw.Kill(t)
	checkDrained(t, ctx, s, session, ids, func() { gatewayProc(t, ctx, s, bin, "gateway-2.log") })
}

// A live replica takes over the lanes of one that died: a gateway binary
// is SIGKILLed holding a lane with acknowledged messages, and another
// gateway, already running (it never restarts, so only its rescan finds
// the lane once the dead one's lease has run out), runs them all, each
// exactly once, in the order sent.
func TestDurableLanesTakeover(t *testing.T) {
	bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/gateway/cmd/gateway")
	s := startStack(t, stackOptions{noGateway: true}, scriptedAgent("paced", map[string]any{"text": "noted", "delay": "500ms"}))
	live := *s
	live.startGateway(t, stackOptions{gateway: func(cfg *gateway.Config) { cfg.LaneLease = time.Second }})
	s.grpcAddr, s.httpURL = proc.FreeAddr(t), "http://"+proc.FreeAddr(t)
	ctx := ctxFor(t, 4*time.Minute)
	gw := gatewayProc(t, ctx, s, bin, "gateway-dies.log", "--lane-lease", "1s")

	const n = 5
	const session = "takeover-lane"
	c := a2aClients(t, s, "paced")["jsonrpc"]
	var ids []string
	for i := range n {
		p := userText(session, fmt.Sprintf("message %d", i))
		p.Config = &a2a.MessageSendConfig{Blocking: new(bool)}
		task := asTask(t)(c.SendMessage(ctx, p))
		ids = append(ids, string(task.ID))
	}
	gw.Kill(t)
	checkDrained(t, ctx, s, session, ids, nil)
}

// checkDrained checks, once a gateway was killed with the messages ids
// acknowledged on session's lane, that some had not started then and
// (after restart, when set) that all of them run, each exactly once, in
// order, and the lane's record goes.
func checkDrained(t *testing.T, ctx context.Context, s *stack, session string, ids []string, restart func()) {
	t.Helper()
	n := len(ids)
	unstarted := 0
	for _, id := range ids {
		if _, err := s.orch.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id}); status.Code(err) == codes.NotFound {
			unstarted++
		}
	}
	if unstarted == 0 {
		t.Fatal("every message had started before the kill: nothing was left queued to survive it (raise the agent's delay)")
	}
	t.Logf("%d of %d acknowledged messages not started at the SIGKILL", unstarted, n)
	if restart != nil {
		restart()
	}

	var prevEnd time.Time
	for i, id := range ids {
		wf := waitEnded(t, ctx, s, id)
		if wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || gateway.Answer(wf) != "noted" {
			t.Fatalf("message %d (%s): %s %q", i, id, wf.GetStatus(), gateway.Answer(wf))
		}
		tr, err := s.orch.GetTranscript(ctx, &orchestratorv1.GetTranscriptRequest{WorkflowId: id})
		if err != nil || len(tr.GetSteps()) != 1 {
			t.Fatalf("message %d ran %d times (transcript %v, %v), want once", i, len(tr.GetSteps()), tr, err)
		}
		st := tr.GetSteps()[0]
		if st.GetStartTime().AsTime().Before(prevEnd) {
			t.Fatalf("message %d started at %v, before message %d ended at %v", i, st.GetStartTime().AsTime(), i-1, prevEnd)
		}
		prevEnd = st.GetEndTime().AsTime()
	}
	// No other workflow ran for the session: nothing was started twice
	// under another id.
	list, err := s.orch.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, wf := range list.GetWorkflows() {
		if gateway.SessionOf(wf.GetWorkflowId()) == session {
			count++
		}
	}
	if count != n {
		t.Fatalf("%d workflows for the session, want %d", count, n)
	}
	// The drained lane leaves no record behind.
	st := statev1.NewStateServiceClient(harness.Dial(t, s.stateAddr))
	for {
		_, err := st.Read(ctx, &statev1.ReadRequest{Scope: scope.Custom(gateway.StateScope), Key: "lane/" + session})
		if status.Code(err) == codes.NotFound {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the lane's record is still there: %v", err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}
