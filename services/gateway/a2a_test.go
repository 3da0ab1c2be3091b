package gateway_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/a2a"
	"github.com/a2aproject/a2a-go/a2aclient"
	"github.com/a2aproject/a2a-go/a2aclient/agentcard"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/services/gateway"
)

// agentHeader sets the x-neuron-agent header on every call: the agent a
// message is for on the gRPC transport.
type agentHeader struct {
	a2aclient.PassthroughInterceptor
	agent string
}

func (h agentHeader) Before(ctx context.Context, req *a2aclient.Request) (context.Context, error) {
	req.Meta[gateway.AgentHeader] = []string{h.agent}
	return ctx, nil
}

// a2aClients returns a client of agent over each transport: JSON-RPC
// from the agent's card, and gRPC from the card's gRPC interface.
func a2aClients(t testing.TB, s *stack, agent string) map[string]*a2aclient.Client {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	card, err := agentcard.NewResolver(nil).Resolve(ctx, s.httpURL+"/a2a/"+agent)
	if err != nil {
		t.Fatalf("resolving the agent card of %s: %v", agent, err)
	}
	if card.Name != agent || card.ProtocolVersion != gateway.A2AProtocolVersion || !card.Capabilities.Streaming {
		t.Fatalf("card = %+v", card)
	}
	jsonrpc, err := a2aclient.NewFromCard(ctx, card)
	if err != nil {
		t.Fatal(err)
	}
	var grpcURL string
	for _, i := range card.AdditionalInterfaces {
		if i.Transport == a2a.TransportProtocolGRPC {
			grpcURL = i.URL
		}
	}
	if grpcURL != s.grpcAddr {
		t.Fatalf("the card's gRPC interface is %q, want %q", grpcURL, s.grpcAddr)
	}
	grpcClient, err := a2aclient.NewFromEndpoints(ctx, []a2a.AgentInterface{{Transport: a2a.TransportProtocolGRPC, URL: grpcURL}},
		a2aclient.WithGRPCTransport(grpc.WithTransportCredentials(insecure.NewCredentials())),
		a2aclient.WithInterceptors(agentHeader{agent: agent}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = jsonrpc.Destroy(); _ = grpcClient.Destroy() })
	return map[string]*a2aclient.Client{"jsonrpc": jsonrpc, "grpc": grpcClient}
}

func userText(contextID, text string) *a2a.MessageSendParams {
	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.TextPart{Text: text})
	m.ContextID = contextID
	return &a2a.MessageSendParams{Message: m}
}

func artifactText(t *a2a.Task) string {
	var b strings.Builder
	for _, a := range t.Artifacts {
		for _, p := range a.Parts {
			if tp, ok := p.(a2a.TextPart); ok {
				b.WriteString(tp.Text)
			}
		}
	}
	return b.String()
}

func asTask(t *testing.T) func(r a2a.SendMessageResult, err error) *a2a.Task {
	return func(r a2a.SendMessageResult, err error) *a2a.Task {
		t.Helper()
		if err != nil {
			t.Fatalf("SendMessage: %v", err)
		}
		task, ok := r.(*a2a.Task)
		if !ok {
			t.Fatalf("SendMessage returned %T, want a task", r)
		}
		return task
	}
}

// An A2A client runs an agent over both transports: a task is a
// workflow of the orchestrator, the context id its session.
func TestA2ASendMessage(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOptions{}, echoAgent("echo"))
	for name, c := range a2aClients(t, s, "echo") {
		t.Run(name, func(t *testing.T) {
			ctx := ctxFor(t, 60*time.Second)
			task := asTask(t)(c.SendMessage(ctx, userText("", "hello "+name)))
			if task.Status.State != a2a.TaskStateCompleted || artifactText(task) != "[scripted model] You said: hello "+name {
				t.Fatalf("task = %s %q", task.Status.State, artifactText(task))
			}
			if gateway.SessionOf(string(task.ID)) != task.ContextID || task.ContextID == "" {
				t.Fatalf("task %q has context %q", task.ID, task.ContextID)
			}
			wf, err := s.orch.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: string(task.ID)})
			if err != nil || wf.GetWorkflow().GetRootAgentId() != "echo" || wf.GetWorkflow().GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
				t.Fatalf("the task's workflow: %v %v", wf, err)
			}
			// The same context goes on with the session; GetTask reads the
			// workflow.
			next := asTask(t)(c.SendMessage(ctx, userText(task.ContextID, "again")))
			if next.ContextID != task.ContextID || next.ID == task.ID {
				t.Fatalf("second task %q in context %q", next.ID, next.ContextID)
			}
			got, err := c.GetTask(ctx, &a2a.TaskQueryParams{ID: task.ID})
			if err != nil || got.Status.State != a2a.TaskStateCompleted || artifactText(got) != artifactText(task) {
				t.Fatalf("GetTask = %+v, %v", got, err)
			}
			if _, err := c.GetTask(ctx, &a2a.TaskQueryParams{ID: "no-such-task"}); err == nil {
				t.Fatal("GetTask of an unknown task succeeded")
			}
		})
	}
}

// SendStreamingMessage streams the task: submitted, working, the
// answer's text as it is written, then the final status.
func TestA2AStream(t *testing.T) {
	t.Parallel()
	// The stream carries the deltas of the call running when it starts
	// watching (from that call's start), not those of a call already
	// finished (its answer comes in one piece): the delay keeps the call
	// running until the stream watches.
	s := startStack(t, stackOptions{}, scriptedAgent("writer", map[string]any{"text": "one two three four five", "delay": "2s"}))
	for name, c := range a2aClients(t, s, "writer") {
		t.Run(name, func(t *testing.T) {
			ctx := ctxFor(t, 60*time.Second)
			var states []a2a.TaskState
			var text strings.Builder
			chunks := 0
			var final *a2a.TaskStatusUpdateEvent
			for ev, err := range c.SendStreamingMessage(ctx, userText("", "write")) {
				if err != nil {
					t.Fatalf("stream: %v", err)
				}
				switch e := ev.(type) {
				case *a2a.Task:
					states = append(states, e.Status.State)
				case *a2a.TaskStatusUpdateEvent:
					states = append(states, e.Status.State)
					if e.Final {
						final = e
					}
				case *a2a.TaskArtifactUpdateEvent:
					chunks++
					for _, p := range e.Artifact.Parts {
						if tp, ok := p.(a2a.TextPart); ok {
							text.WriteString(tp.Text)
						}
					}
				}
			}
			if final == nil || final.Status.State != a2a.TaskStateCompleted {
				t.Fatalf("no final completed status: %v", states)
			}
			if states[0] != a2a.TaskStateSubmitted || states[1] != a2a.TaskStateWorking {
				t.Fatalf("states = %v, want submitted, working, ...", states)
			}
			if text.String() != "one two three four five" || chunks < 2 {
				t.Fatalf("streamed %q in %d chunks, want the answer in several", text.String(), chunks)
			}
		})
	}
}

// CancelTask cancels the workflow; a task waiting for approval is
// INPUT_REQUIRED and the client's reply is the decision.
func TestA2ACancelAndApproval(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOptions{}, scriptedAgent("slow", map[string]any{"text": "late", "delay": "1h"}), carefulAgent("careful"))
	slow := a2aClients(t, s, "slow")
	careful := a2aClients(t, s, "careful")
	for _, name := range []string{"jsonrpc", "grpc"} {
		t.Run(name, func(t *testing.T) {
			ctx := ctxFor(t, 60*time.Second)
			c := slow[name]
			p := userText("", "take your time")
			p.Config = &a2a.MessageSendConfig{Blocking: new(bool)}
			task := asTask(t)(c.SendMessage(ctx, p))
			if task.Status.State.Terminal() {
				t.Fatalf("a non-blocking send came back %s", task.Status.State)
			}
			waitState(t, ctx, c, task.ID, a2a.TaskStateWorking)
			canceled, err := c.CancelTask(ctx, &a2a.TaskIDParams{ID: task.ID})
			if err != nil || canceled.Status.State != a2a.TaskStateCanceled {
				t.Fatalf("CancelTask = %+v, %v", canceled, err)
			}
			wf, err := s.orch.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: string(task.ID)})
			if err != nil || wf.GetWorkflow().GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED {
				t.Fatalf("the workflow after CancelTask: %v %v", wf, err)
			}

			c = careful[name]
			task = asTask(t)(c.SendMessage(ctx, userText("", "keep notes "+name)))
			if task.Status.State != a2a.TaskStateInputRequired || task.Status.Message == nil || !strings.Contains(textOfParts(task.Status.Message.Parts), "write(") {
				t.Fatalf("task = %s %+v, want input-required naming the write", task.Status.State, task.Status.Message)
			}
			notes := filepath.Join(s.workspace, "notes.md")
			_ = os.Remove(notes) // the other transport's run wrote it
			if _, err := c.SendMessage(ctx, replyTo(task, "maybe")); err == nil {
				t.Fatal("an answer that is no decision was accepted")
			}
			done := asTask(t)(c.SendMessage(ctx, replyTo(task, "approve")))
			if done.ID != task.ID || done.Status.State != a2a.TaskStateCompleted || artifactText(done) != "The notes are written." {
				t.Fatalf("after the approval: %s %s %q", done.ID, done.Status.State, artifactText(done))
			}
			if b, err := os.ReadFile(notes); err != nil || string(b) != "hello notes" {
				t.Fatalf("notes.md = %q, %v: the approved write did not run", b, err)
			}
		})
	}
}

// A rejected call does not run, and streaming the reply streams the
// rest of the run.
func TestA2AStreamRejection(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOptions{}, carefulAgent("careful"))
	c := a2aClients(t, s, "careful")["jsonrpc"]
	ctx := ctxFor(t, 60*time.Second)
	var last *a2a.TaskStatusUpdateEvent
	var id a2a.TaskID
	for ev, err := range c.SendStreamingMessage(ctx, userText("", "keep notes")) {
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := ev.(*a2a.TaskStatusUpdateEvent); ok {
			last, id = e, e.TaskID
		}
	}
	if last == nil || !last.Final || last.Status.State != a2a.TaskStateInputRequired {
		t.Fatalf("the stream ended with %+v, want a final input-required", last)
	}
	var states []a2a.TaskState
	for ev, err := range c.SendStreamingMessage(ctx, replyTo(&a2a.Task{ID: id, ContextID: last.ContextID}, "reject not today")) {
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := ev.(*a2a.TaskStatusUpdateEvent); ok {
			states = append(states, e.Status.State)
		}
	}
	if len(states) == 0 || states[len(states)-1] != a2a.TaskStateCompleted {
		t.Fatalf("the reply's stream: %v, want it to end completed", states)
	}
	if _, err := os.Stat(filepath.Join(s.workspace, "notes.md")); err == nil {
		t.Fatal("the rejected write ran")
	}
}

func replyTo(task *a2a.Task, text string) *a2a.MessageSendParams {
	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.TextPart{Text: text})
	m.TaskID, m.ContextID = task.ID, task.ContextID
	return &a2a.MessageSendParams{Message: m}
}

func textOfParts(parts a2a.ContentParts) string {
	var b strings.Builder
	for _, p := range parts {
		if tp, ok := p.(a2a.TextPart); ok {
			b.WriteString(tp.Text)
		}
	}
	return b.String()
}

// waitState polls GetTask until the task is in state.
func waitState(t *testing.T, ctx context.Context, c *a2aclient.Client, id a2a.TaskID, want a2a.TaskState) *a2a.Task {
	t.Helper()
	for {
		task, err := c.GetTask(ctx, &a2a.TaskQueryParams{ID: id})
		if err != nil {
			t.Fatalf("GetTask: %v", err)
		}
		if task.Status.State == want {
			return task
		}
		if task.Status.State.Terminal() {
			t.Fatalf("task %s ended %s waiting for %s", id, task.Status.State, want)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("task %s is %s, waited for %s", id, task.Status.State, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
