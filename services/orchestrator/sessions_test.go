package orchestrator_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// gate holds an agent's first operator call until released (or its
// call is cancelled); later calls answer at once. Every call answers
// with the text of its input's message.
type gate struct {
	mu      sync.Mutex
	calls   int
	release chan struct{}
	// at records, per call, what the test asks (observe) when it arrives.
	observe func() string
	seen    []string
}

func newGate() *gate { return &gate{release: make(chan struct{})} }

func (g *gate) behaviour() behaviour {
	return func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		g.mu.Lock()
		g.calls++
		first := g.calls == 1
		if g.observe != nil {
			g.seen = append(g.seen, g.observe())
		}
		g.mu.Unlock()
		if first {
			select {
			case <-g.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return done(in, "answer to: "+content.TextOf(in.GetMessage()), "0"), nil
	}
}

func sessionInput(session, text string) *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{Message: content.Text(text), SessionId: &session}
}

func TestBusySession(t *testing.T) { backends(t, testBusySession) }

// testBusySession: a second message for a session whose workflow has not
// ended follows the agent's busy_session policy, on both engines.
func testBusySession(t *testing.T, start starter) {
	stateAddr, _, _ := startState(t)
	gates := map[string]*gate{"rej": newGate(), "enq": newGate(), "int": newGate(), "sig": newGate(), "free": newGate()}
	agents := map[string]behaviour{}
	for id, g := range gates {
		agents[id] = g.behaviour()
	}
	f, opAddr := startFake(t, agents)
	reg := agentsAt(opAddr, "rej", "enq", "int", "sig", "free")
	for i, policy := range []string{"reject", "enqueue", "interrupt", "signal"} {
		reg[i]["busy_session"] = policy
	}
	o := start(t, registryYAML(t, reg...), stateAddr, orchOptions{})
	ctx := ctxT(t)
	begin := func(agent, session, text string) string {
		t.Helper()
		id := must[*orchestratorv1.StartWorkflowResponse](t)(o.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{AgentId: agent,
			Input: sessionInput(session, text)})).GetWorkflowId()
		for deadline := time.Now().Add(10 * time.Second); len(f.inputs(agent)) == 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("agent %s was never called", agent)
			}
		}
		return id
	}
	dispatch := func(agent, session, text string) (*orchestratorv1.DispatchResponse, error) {
		return o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: agent, Input: sessionInput(session, text)})
	}

	t.Run("reject", func(t *testing.T) {
		first := begin("rej", "s-rej", "one")
		_, err := dispatch("rej", "s-rej", "two")
		wantCode(t, err, codes.FailedPrecondition, "is busy with workflow "+first)
		// Another session of the agent is not busy.
		close(gates["rej"].release)
		if r, err := dispatch("rej", "s-other", "three"); err != nil || content.TextOf(r.GetOutput().GetMessage()) != "answer to: three" {
			t.Fatalf("another session: %v %v", r, err)
		}
		waitStatus(t, o, first, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
		r, err := dispatch("rej", "s-rej", "four")
		if err != nil || r.GetWorkflowId() == first || content.TextOf(r.GetOutput().GetMessage()) != "answer to: four" {
			t.Fatalf("after the first ended: %v %v", r, err)
		}
	})

	t.Run("enqueue", func(t *testing.T) {
		g := gates["enq"]
		first := begin("enq", "s-enq", "one")
		g.mu.Lock()
		g.observe = func() string {
			r, err := o.client.GetWorkflow(context.Background(), &orchestratorv1.GetWorkflowRequest{WorkflowId: first})
			if err != nil {
				return err.Error()
			}
			return r.GetWorkflow().GetStatus().String()
		}
		g.mu.Unlock()
		type res struct {
			r   *orchestratorv1.DispatchResponse
			err error
		}
		second := make(chan res, 1)
		go func() {
			r, err := dispatch("enq", "s-enq", "two")
			second <- res{r, err}
		}()
		// The queued message is not run while the first workflow runs.
		time.Sleep(200 * time.Millisecond)
		if n := len(f.inputs("enq")); n != 1 {
			t.Fatalf("operator calls of enq while the first runs = %d, want 1", n)
		}
		close(g.release)
		got := <-second
		if got.err != nil || got.r.GetWorkflowId() == first || content.TextOf(got.r.GetOutput().GetMessage()) != "answer to: two" {
			t.Fatalf("queued message: %v %v", got.r, got.err)
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.seen) != 1 || g.seen[0] != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED.String() {
			t.Fatalf("the queued message's call saw the first workflow %v, want it COMPLETED", g.seen)
		}
	})

	t.Run("interrupt", func(t *testing.T) {
		first := begin("int", "s-int", "one")
		r, err := dispatch("int", "s-int", "two")
		if err != nil {
			t.Fatal(err)
		}
		if got := content.TextOf(r.GetOutput().GetMessage()); !strings.Contains(got, "one") || !strings.Contains(got, "two") || r.GetWorkflowId() == first {
			t.Fatalf("the interrupting workflow answered %q in %s: want both messages, in a new workflow", got, r.GetWorkflowId())
		}
		wf := waitStatus(t, o, first, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED)
		if !strings.Contains(wf.GetFailure().GetMessage(), "interrupted by a newer message") {
			t.Fatalf("the interrupted workflow's failure = %v", wf.GetFailure())
		}
	})

	t.Run("signal", func(t *testing.T) {
		first := begin("sig", "s-sig", "one")
		type res struct {
			r   *orchestratorv1.DispatchResponse
			err error
		}
		second := make(chan res, 1)
		go func() {
			r, err := dispatch("sig", "s-sig", "two")
			second <- res{r, err}
		}()
		for deadline := time.Now().Add(10 * time.Second); waitStatus(t, o, first, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING).GetPendingSignals() == 0; {
			if time.Now().After(deadline) {
				t.Fatalf("the second message never reached workflow %s as a signal", first)
			}
			time.Sleep(5 * time.Millisecond)
		}
		// A StartWorkflow with the same session is answered with the
		// running workflow too.
		sw := must[*orchestratorv1.StartWorkflowResponse](t)(o.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{AgentId: "sig",
			Input: sessionInput("s-sig", "three")}))
		if sw.GetWorkflowId() != first || !sw.GetAlreadyStarted() {
			t.Fatalf("StartWorkflow in the busy session = %v, want the running %s", sw, first)
		}
		close(gates["sig"].release)
		got := <-second
		if got.err != nil || got.r.GetWorkflowId() != first {
			t.Fatalf("the signaled message's Dispatch: %v %v, want workflow %s's answer", got.r, got.err, first)
		}
		wf := waitStatus(t, o, first, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
		ins := f.inputs("sig")
		if len(ins) < 2 || !strings.Contains(content.TextOf(ins[1].GetMessage()), "[signal message #") || !strings.Contains(content.TextOf(ins[1].GetMessage()), "two") {
			t.Fatalf("the running workflow's next call got %v, want the message as a signal", ins)
		}
		_ = wf
	})

	t.Run("no policy", func(t *testing.T) {
		begin("free", "s-free", "one")
		r, err := dispatch("free", "s-free", "two")
		if err != nil || content.TextOf(r.GetOutput().GetMessage()) != "answer to: two" {
			t.Fatalf("an agent without busy_session runs messages side by side: %v %v", r, err)
		}
		close(gates["free"].release)
	})
}
