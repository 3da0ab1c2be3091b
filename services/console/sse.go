package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
)

// Live updates are server-sent events: one long GET per page, which the
// browser's EventSource reconnects by itself (sending the last event id,
// a workflow sequence, which becomes WatchWorkflow's after_sequence).

// heartbeat is how often an idle stream sends a comment, so proxies and
// the browser keep it open.
const heartbeat = 15 * time.Second

// livePoll is how often the live workflows list reads ListWorkflows.
const livePoll = 2 * time.Second

// sseWriter writes server-sent events.
type sseWriter struct {
	w http.ResponseWriter
	f http.Flusher
}

// startSSE answers with an event stream; false (and a 500) when w
// cannot stream.
func startSSE(w http.ResponseWriter) (*sseWriter, bool) {
	f, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "INTERNAL", "streaming unsupported")
		return nil, false
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f.Flush()
	return &sseWriter{w: w, f: f}, true
}

// send writes one event; id is left out when empty. data must be one
// line (compact JSON is).
func (s *sseWriter) send(event, id string, data []byte) error {
	var b bytes.Buffer
	if id != "" {
		fmt.Fprintf(&b, "id: %s\n", id)
	}
	fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", event, bytes.ReplaceAll(data, []byte("\n"), nil))
	if _, err := s.w.Write(b.Bytes()); err != nil {
		return err
	}
	s.f.Flush()
	return nil
}

// comment writes a keep-alive.
func (s *sseWriter) comment() error {
	if _, err := s.w.Write([]byte(": keep-alive\n\n")); err != nil {
		return err
	}
	s.f.Flush()
	return nil
}

// sendError writes an "error" event with the API's error body; the page
// closes its EventSource on it (reconnecting would fail the same way).
func (s *sseWriter) sendError(sess *session, capName string, err error) {
	code, e := toAPIError(err)
	if code == http.StatusForbidden {
		sess.setCan(capName, false)
	}
	b, _ := json.Marshal(e)
	_ = s.send("failure", "", b)
}

// streamCtx is r's context, also ended when the server closes.
func (s *Server) streamCtx(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	go func() {
		select {
		case <-s.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// watchWorkflow is GET /api/workflows/{id}/watch?after=N: WatchWorkflow
// as server-sent events "event" (a LifecycleEvent, with its workflow
// sequence as the event id), "progress" (a StepProgress: text deltas and
// tool calls of the call running now) and "end" (the Workflow, last).
func (s *Server) watchWorkflow(w http.ResponseWriter, r *http.Request, sess *session) {
	after := r.URL.Query().Get("after")
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		after = id
	}
	var seq uint64
	if after != "" {
		n, err := strconv.ParseUint(after, 10, 64)
		if err != nil {
			badRequest(w, "after %q is not a sequence number", after)
			return
		}
		seq = n
	}
	ctx, cancel := s.streamCtx(r)
	defer cancel()
	stream, err := s.orch.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{WorkflowId: r.PathValue("id"), AfterSequence: seq}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "WatchWorkflow", err)
		return
	}
	type msg struct {
		m   *orchestratorv1.WatchWorkflowResponse
		err error
	}
	msgs := make(chan msg)
	go func() {
		for {
			m, err := stream.Recv()
			select {
			case msgs <- msg{m, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	sse, ok := startSSE(w)
	if !ok {
		return
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if sse.comment() != nil {
				return
			}
		case m := <-msgs:
			if m.err != nil {
				if ctx.Err() == nil {
					sse.sendError(sess, "WatchWorkflow", m.err)
				}
				return
			}
			var err error
			switch k := m.m.Kind.(type) {
			case *orchestratorv1.WatchWorkflowResponse_Event:
				b, _ := marshal.Marshal(k.Event)
				err = sse.send("event", strconv.FormatUint(k.Event.GetWorkflowSequence(), 10), b)
			case *orchestratorv1.WatchWorkflowResponse_Progress:
				b, _ := marshal.Marshal(k.Progress)
				err = sse.send("progress", "", b)
			case *orchestratorv1.WatchWorkflowResponse_End:
				b, _ := marshal.Marshal(k.End)
				_ = sse.send("end", "", b)
				return
			}
			if err != nil {
				return
			}
		}
	}
}

// liveWorkflows is GET /api/workflows/live?status=&agent=: the first page
// of ListWorkflows as a "workflows" event, again whenever it changes
// (read every livePoll).
func (s *Server) liveWorkflows(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := s.streamCtx(r)
	defer cancel()
	first, err := s.listWorkflowsPage(r.WithContext(ctx), sess)
	if bp, ok := err.(errBadParam); ok {
		badRequest(w, "%s", bp.msg)
		return
	}
	if err != nil {
		fail(w, sess, "ListWorkflows", err)
		return
	}
	sse, ok := startSSE(w)
	if !ok {
		return
	}
	var last []byte
	resp := first
	tick := time.NewTicker(livePoll)
	defer tick.Stop()
	idle := time.Now()
	for {
		if resp != nil {
			b, _ := marshal.Marshal(resp)
			if !bytes.Equal(b, last) {
				if sse.send("workflows", "", b) != nil {
					return
				}
				last, idle = b, time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if time.Since(idle) > heartbeat {
			if sse.comment() != nil {
				return
			}
			idle = time.Now()
		}
		resp, err = s.listWorkflowsPage(r.WithContext(ctx), sess)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			sse.sendError(sess, "ListWorkflows", err)
			return
		}
	}
}
