package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// MCP tool names besides the agents'.
const (
	ToolDecide      = "decide_approval"
	ToolStateSearch = "state_search"
)

// AgentInput is the input of an agent's MCP tool.
type AgentInput struct {
	Message string `json:"message" jsonschema:"the message or task for the agent"`
	Session string `json:"session,omitempty" jsonschema:"go on with this session (its earlier messages are the agent's history); empty: a new one"`
}

// AgentOutput is the result of an agent's MCP tool.
type AgentOutput struct {
	Answer     string `json:"answer"`
	WorkflowID string `json:"workflow_id"`
	Session    string `json:"session"`
	// Status is the workflow's: completed, failed, canceled, or
	// suspended when it waits for approval (then PendingApprovals lists
	// the calls, and decide_approval answers them).
	Status           string           `json:"status"`
	PendingApprovals []map[string]any `json:"pending_approvals,omitempty"`
}

// DecideInput is the input of the decide_approval tool.
type DecideInput struct {
	WorkflowID string `json:"workflow_id" jsonschema:"the workflow waiting for approval"`
	Approved   bool   `json:"approved" jsonschema:"true runs every waiting tool call, false rejects them"`
	Reason     string `json:"reason,omitempty" jsonschema:"why they are rejected, told to the model"`
}

// SearchInput is the input of the state_search tool.
type SearchInput struct {
	Query   string `json:"query" jsonschema:"words to look for"`
	Session string `json:"session,omitempty" jsonschema:"search this session's state; empty: the global scope"`
	Limit   int    `json:"limit,omitempty" jsonschema:"at most this many results (default 10)"`
}

// SearchOutput is the result of the state_search tool.
type SearchOutput struct {
	Results []SearchHit `json:"results"`
}

// SearchHit is one state_search result.
type SearchHit struct {
	Key     string  `json:"key"`
	Score   float64 `json:"score"`
	Snippet string  `json:"snippet"`
}

// mcpTools keeps the MCP server's agent tools in step with the agents.
type mcpTools struct {
	h      *httpServer
	server *mcp.Server
	mu     sync.Mutex
	have   map[string]bool
}

// mcpHandler is the MCP server over streamable HTTP: one tool per agent,
// decide_approval, and state_search when a State service is configured.
func (h *httpServer) mcpHandler() http.Handler {
	s := mcp.NewServer(&mcp.Implementation{Name: "neuron-gateway", Version: "1"}, nil)
	t := &mcpTools{h: h, server: s, have: map[string]bool{}}
	mcp.AddTool(s, &mcp.Tool{Name: ToolDecide, Description: "Approve or reject the tool calls a workflow waits on (an agent tool's result with status suspended), then wait for its answer."}, t.decide)
	if h.state != nil {
		mcp.AddTool(s, &mcp.Tool{Name: ToolStateSearch, Description: "Full-text search of the State service: a session's state, or the global scope."}, t.search)
	}
	return mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		if err := t.sync(r.Context()); err != nil {
			h.log.Warn("mcp: listing the agents failed; tools may be stale", "error", err)
		}
		return s
	}, nil)
}

// sync adds a tool for every agent and removes those of agents gone.
func (t *mcpTools) sync(ctx context.Context) error {
	list, err := t.h.g.agents.List(ctx)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := map[string]bool{}
	for _, a := range list {
		seen[a.Name] = true
		if t.have[a.Name] || a.Name == ToolDecide || a.Name == ToolStateSearch {
			continue
		}
		desc := a.Description
		if desc == "" {
			desc = "Ask the neuron agent " + a.Name + "."
		}
		mcp.AddTool(t.server, &mcp.Tool{Name: a.Name, Description: desc + " Returns its answer and the workflow id; long runs report progress."}, t.agentTool(a.Name))
		t.have[a.Name] = true
	}
	for name := range t.have {
		if !seen[name] {
			t.server.RemoveTools(name)
			delete(t.have, name)
		}
	}
	return nil
}

// agentTool runs agent for a tool call: the message goes through its
// session's lane, the run's progress is reported when the client asked
// for it, and a call the client cancels cancels the workflow.
func (t *mcpTools) agentTool(agent string) mcp.ToolHandlerFor[AgentInput, AgentOutput] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in AgentInput) (*mcp.CallToolResult, AgentOutput, error) {
		g := t.h.g
		acc, err := g.Submit(ctx, Message{Agent: agent, Session: in.Session, Text: in.Message})
		if err != nil {
			return nil, AgentOutput{}, mcpError(err)
		}
		select {
		case <-acc.Started:
		case <-ctx.Done():
			if !g.CancelQueued(acc.ID) {
				<-acc.Started
				t.cancel(acc.ID)
			}
			return nil, AgentOutput{}, ctx.Err()
		}
		if err := acc.StartErr(); err != nil {
			return nil, AgentOutput{}, mcpError(err)
		}
		wf, err := t.follow(ctx, req, acc.ID, 0)
		if err != nil {
			return nil, AgentOutput{}, err
		}
		return nil, outputOf(wf), nil
	}
}

// follow follows workflow id, reporting progress to the client, and
// cancels it when the client cancels the call.
func (t *mcpTools) follow(ctx context.Context, req *mcp.CallToolRequest, id string, afterDecision uint64) (*orchestratorv1.Workflow, error) {
	token := req.Params.GetProgressToken()
	n := 0.0
	notify := func(msg string) {
		if token == nil {
			return
		}
		n++
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: n, Message: msg})
	}
	wf, err := t.h.g.Follow(ctx, id, FollowOptions{Progress: token != nil, AfterDecision: afterDecision}, func(u Update) bool {
		switch {
		case u.Text != "":
			notify(u.Text)
		case u.ToolStarted != "":
			notify("running " + u.ToolStarted)
		case u.ToolFinished != "":
			notify("finished " + u.ToolFinished)
		case u.Event.GetObservable().GetEventType() == eventDispatchCompleted:
			// From the workflow's durable log, so a client that joins
			// after the text has streamed still hears of each step.
			notify("step finished: " + u.Event.GetAgentId())
		}
		return true
	})
	if err != nil {
		if ctx.Err() != nil {
			t.cancel(id)
			return nil, ctx.Err()
		}
		return nil, mcpError(err)
	}
	return wf, nil
}

// cancel cancels workflow id after its caller went away.
func (t *mcpTools) cancel(id string) {
	if _, err := t.h.g.orch.CancelWorkflow(context.WithoutCancel(t.h.g.ctx), &orchestratorv1.CancelWorkflowRequest{WorkflowId: id, Reason: "the MCP client canceled the tool call"}); err != nil {
		t.h.log.Warn("mcp: canceling the workflow of a canceled call failed", "workflow_id", id, "error", err)
	}
}

func (t *mcpTools) decide(ctx context.Context, req *mcp.CallToolRequest, in DecideInput) (*mcp.CallToolResult, AgentOutput, error) {
	if in.WorkflowID == "" {
		return nil, AgentOutput{}, mcpError(fmt.Errorf("workflow_id is required: %w", errs.InvalidArgument))
	}
	seq, err := t.h.g.Decide(ctx, in.WorkflowID, in.Approved, in.Reason, "mcp")
	if err != nil {
		return nil, AgentOutput{}, mcpError(err)
	}
	wf, err := t.follow(ctx, req, in.WorkflowID, seq)
	if err != nil {
		return nil, AgentOutput{}, err
	}
	return nil, outputOf(wf), nil
}

func (t *mcpTools) search(ctx context.Context, _ *mcp.CallToolRequest, in SearchInput) (*mcp.CallToolResult, SearchOutput, error) {
	if strings.TrimSpace(in.Query) == "" {
		return nil, SearchOutput{}, mcpError(fmt.Errorf("query is empty: %w", errs.InvalidArgument))
	}
	sc := scope.Global()
	if in.Session != "" {
		sc = scope.Session(in.Session)
	}
	limit := in.Limit
	if limit <= 0 || limit > 100 {
		limit = 10
	}
	resp, err := t.h.state.Search(ctx, &statev1.SearchRequest{Scope: sc, Query: in.Query, Limit: int32(limit)})
	if err != nil {
		return nil, SearchOutput{}, mcpError(err)
	}
	out := SearchOutput{Results: []SearchHit{}}
	for _, r := range resp.GetResults() {
		out.Results = append(out.Results, SearchHit{Key: r.GetKey(), Score: r.GetScore(), Snippet: r.GetSnippet()})
	}
	return nil, out, nil
}

// outputOf is a settled workflow as an agent tool's result.
func outputOf(wf *orchestratorv1.Workflow) AgentOutput {
	out := AgentOutput{Answer: Answer(wf), WorkflowID: wf.GetWorkflowId(), Session: SessionOf(wf.GetWorkflowId()), Status: StateName(wf.GetStatus())}
	if wf.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED {
		out.Answer = wf.GetFailure().GetMessage()
	}
	for _, p := range wf.GetPendingApprovals() {
		tc := p.GetToolCall()
		out.PendingApprovals = append(out.PendingApprovals, map[string]any{"tool_use_id": tc.GetToolUseId(), "name": tc.GetName(), "input": tc.GetInput().AsInterface()})
	}
	return out
}

// mcpError is err as a tool error the client reads (the status code and
// message).
func mcpError(err error) error {
	st := errs.ToStatus(err)
	return fmt.Errorf("%s: %s", st.Code(), st.Message())
}
