package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// ChatRequest is the body of POST /v1/chat.
type ChatRequest struct {
	// Agent answers the message.
	Agent string `json:"agent"`
	// Message is the user's message (a new run).
	Message string `json:"message,omitempty"`
	// Session (AG-UI's thread) groups a conversation; empty: a new one.
	Session string `json:"session,omitempty"`
	// Decision answers a run waiting for approval instead of sending a
	// message: the workflow id (the run id of the earlier stream).
	Decision *ChatDecision `json:"decision,omitempty"`
}

// ChatDecision approves or rejects the calls a run waits on.
type ChatDecision struct {
	WorkflowID string `json:"workflow_id"`
	Approved   bool   `json:"approved"`
	Reason     string `json:"reason,omitempty"`
}

// maxChatBody bounds a chat request.
const maxChatBody = 1 << 20

// chat runs a message (or answers an approval) and streams the run as
// server-sent events of the AG-UI protocol: RUN_STARTED, then
// TEXT_MESSAGE_START/CONTENT/END for the answer as it is written,
// TOOL_CALL_START/END for tool calls, a CUSTOM "approval_required" event
// when the run waits for a person, and RUN_FINISHED (or RUN_ERROR).
// Errors before the stream starts are JSON with their HTTP status (429
// for a full lane).
func (h *httpServer) chat(w http.ResponseWriter, r *http.Request) {
	var req ChatRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxChatBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpError(w, fmt.Errorf("the body must be JSON {\"agent\", \"message\", \"session\"} or {\"decision\": {...}}: %v: %w", err, errs.InvalidArgument))
		return
	}
	ctx := r.Context()
	var id string
	var seq uint64
	if d := req.Decision; d != nil {
		var err error
		if seq, err = h.g.Decide(ctx, d.WorkflowID, d.Approved, d.Reason, "chat"); err != nil {
			httpError(w, err)
			return
		}
		id = d.WorkflowID
	} else {
		acc, err := h.g.Submit(ctx, Message{Agent: req.Agent, Session: req.Session, Text: req.Message})
		if err != nil {
			httpError(w, err)
			return
		}
		select {
		case <-acc.Started:
		case <-ctx.Done():
			h.g.CancelQueued(acc.ID)
			return
		}
		if err := acc.StartErr(); err != nil {
			httpError(w, err)
			return
		}
		id = acc.ID
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(ev map[string]any) bool {
		b, _ := json.Marshal(ev)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	thread := contextOf(id)
	msgID := id + "/answer"
	send(map[string]any{"type": "RUN_STARTED", "threadId": thread, "runId": id})
	open := false
	wf, err := h.g.Follow(ctx, id, FollowOptions{Progress: true, AfterDecision: seq}, func(u Update) bool {
		switch {
		case u.Text != "":
			if !open {
				open = true
				if !send(map[string]any{"type": "TEXT_MESSAGE_START", "messageId": msgID, "role": "assistant"}) {
					return false
				}
			}
			return send(map[string]any{"type": "TEXT_MESSAGE_CONTENT", "messageId": msgID, "delta": u.Text})
		case u.ToolStarted != "":
			return send(map[string]any{"type": "TOOL_CALL_START", "toolCallId": u.ToolID, "toolCallName": u.ToolStarted, "parentMessageId": msgID})
		case u.ToolFinished != "":
			return send(map[string]any{"type": "TOOL_CALL_END", "toolCallId": u.ToolID})
		}
		return true
	})
	if err != nil {
		st := errs.ToStatus(err)
		send(map[string]any{"type": "RUN_ERROR", "message": st.Message(), "code": st.Code().String()})
		return
	}
	if !open {
		if a := Answer(wf); a != "" && wf.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
			open = true
			send(map[string]any{"type": "TEXT_MESSAGE_START", "messageId": msgID, "role": "assistant"})
			send(map[string]any{"type": "TEXT_MESSAGE_CONTENT", "messageId": msgID, "delta": a})
		}
	}
	if open {
		send(map[string]any{"type": "TEXT_MESSAGE_END", "messageId": msgID})
	}
	out := outputOf(wf)
	switch wf.GetStatus() {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED:
		send(map[string]any{"type": "CUSTOM", "name": "approval_required", "value": map[string]any{"workflow_id": id, "pending_approvals": out.PendingApprovals}})
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
		send(map[string]any{"type": "RUN_ERROR", "message": fmt.Sprintf("run %s %s: %s", id, out.Status, wf.GetFailure().GetMessage()), "code": out.Status})
		return
	}
	send(map[string]any{"type": "RUN_FINISHED", "threadId": thread, "runId": id, "result": out})
}
