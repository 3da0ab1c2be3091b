package gateway_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/services/gateway"
)

// mcpSession connects the MCP Go SDK's client to the gateway's /mcp;
// progress collects the progress notifications it gets.
func mcpSession(t *testing.T, s *stack, progress func(*mcp.ProgressNotificationParams)) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{}
	if progress != nil {
		opts.ProgressNotificationHandler = func(_ context.Context, r *mcp.ProgressNotificationClientRequest) { progress(r.Params) }
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts)
	cs, err := c.Connect(ctxFor(t, 30*time.Second), &mcp.StreamableClientTransport{Endpoint: s.httpURL + "/mcp"}, nil)
	if err != nil {
		t.Fatalf("connecting to /mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// agentResult decodes an agent tool's structured result.
func agentResult(t *testing.T) func(r *mcp.CallToolResult, err error) gateway.AgentOutput {
	return func(r *mcp.CallToolResult, err error) gateway.AgentOutput {
		t.Helper()
		if err != nil {
			t.Fatalf("CallTool: %v", err)
		}
		if r.IsError {
			t.Fatalf("the tool failed: %v", r.Content)
		}
		b, _ := json.Marshal(r.StructuredContent)
		var out gateway.AgentOutput
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("structured content %s: %v", b, err)
		}
		return out
	}
}

// An MCP client lists the agents as tools, runs one with progress, goes
// on in its session, and answers an approval with decide_approval.
func TestMCPAgentTools(t *testing.T) {
	t.Parallel()
	// The delay keeps the writer's call running until the tool follows
	// it, so its text comes as progress (see TestChatSSE).
	s := startStack(t, stackOptions{}, scriptedAgent("writer", map[string]any{"text": "one two three four", "delay": "2s"}), carefulAgent("careful"))
	var mu sync.Mutex
	var notes []string
	cs := mcpSession(t, s, func(p *mcp.ProgressNotificationParams) {
		mu.Lock()
		notes = append(notes, p.Message)
		mu.Unlock()
	})
	ctx := ctxFor(t, 60*time.Second)
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, ","); !strings.Contains(got, "writer") || !strings.Contains(got, "careful") || !strings.Contains(got, gateway.ToolDecide) || !strings.Contains(got, gateway.ToolStateSearch) {
		t.Fatalf("tools = %s", got)
	}

	params := &mcp.CallToolParams{Name: "writer", Arguments: map[string]any{"message": "write"}}
	params.SetProgressToken("p1")
	out := agentResult(t)(cs.CallTool(ctx, params))
	if out.Answer != "one two three four" || out.Status != "completed" || out.WorkflowID == "" || out.Session == "" {
		t.Fatalf("result = %+v", out)
	}
	// The client hands notifications to its handler apart from the
	// result: the step's note, sent just before the result, may be
	// handled after it.
	for wait := time.Now(); time.Since(wait) < 10*time.Second; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(notes)
		last := n > 0 && notes[n-1] == "step finished: writer"
		mu.Unlock()
		if last {
			break
		}
	}
	mu.Lock()
	var text []string
	steps := 0
	for _, n := range notes {
		if n == "step finished: writer" {
			steps++
			continue
		}
		text = append(text, n)
	}
	mu.Unlock()
	if streamed := strings.Join(text, ""); streamed != "one two three four" || steps != 1 {
		t.Fatalf("progress messages %q and %d step notes, want the answer's text as it was written and one step", streamed, steps)
	}
	wf, err := s.orch.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: out.WorkflowID})
	if err != nil || wf.GetWorkflow().GetRootAgentId() != "writer" {
		t.Fatalf("the tool's workflow: %v %v", wf, err)
	}
	again := agentResult(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "writer", Arguments: map[string]any{"message": "more", "session": out.Session}}))
	if again.Session != out.Session || again.WorkflowID == out.WorkflowID {
		t.Fatalf("the second call in session %s: %+v", out.Session, again)
	}

	waiting := agentResult(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "careful", Arguments: map[string]any{"message": "keep notes"}}))
	if waiting.Status != "suspended" || len(waiting.PendingApprovals) != 1 || waiting.PendingApprovals[0]["name"] != "write" {
		t.Fatalf("careful = %+v, want suspended on the write", waiting)
	}
	if _, err := os.Stat(filepath.Join(s.workspace, "notes.md")); err == nil {
		t.Fatal("the write ran before its approval")
	}
	done := agentResult(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: gateway.ToolDecide, Arguments: map[string]any{"workflow_id": waiting.WorkflowID, "approved": true}}))
	if done.Status != "completed" || done.Answer != "The notes are written." {
		t.Fatalf("after the approval: %+v", done)
	}
	if b, err := os.ReadFile(filepath.Join(s.workspace, "notes.md")); err != nil || string(b) != "hello notes" {
		t.Fatalf("notes.md = %q, %v", b, err)
	}
	bad, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "writer", Arguments: map[string]any{"message": "  "}})
	if err == nil && (bad == nil || !bad.IsError) {
		t.Fatal("an empty message was accepted")
	}
}

// A tool call the client cancels cancels its workflow.
func TestMCPCancel(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOptions{}, scriptedAgent("slow", map[string]any{"text": "late", "delay": "1h"}))
	cs := mcpSession(t, s, nil)
	ctx := ctxFor(t, 60*time.Second)
	callCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"message": "wait", "session": "mcp-cancel"}})
		done <- err
	}()
	// The call's workflow, once it runs.
	var id string
	for id == "" {
		list, err := s.orch.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING})
		if err != nil {
			t.Fatal(err)
		}
		for _, wf := range list.GetWorkflows() {
			if gateway.SessionOf(wf.GetWorkflowId()) == "mcp-cancel" {
				id = wf.GetWorkflowId()
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal("the tool call's workflow never ran")
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the canceled call returned no error")
	}
	if wf := waitEnded(t, ctx, s, id); wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED {
		t.Fatalf("the workflow of the canceled call is %s", wf.GetStatus())
	}
}
