package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
)

// StreamerText is the text delta the Streamer agent sends at the start
// of every call.
const StreamerText = "conformance streaming"

// testWatch checks WatchWorkflow: the durable event log in order and
// once, reconnecting after a sequence, the live progress of the running
// call and omit_progress.
func testWatch(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"EventsInOrderThenEnd", testWatchLive},
		{"EndedWorkflowDeliversEverything", testWatchEnded},
		{"ReconnectGetsExactlyTheRest", testWatchReconnect},
		{"ProgressOfTheRunningCall", testWatchProgress},
		{"OmitProgressSendsNone", testWatchOmitProgress},
		{"StaysOpenWhileWaitingForApproval", testWatchApproval},
		{"UnknownWorkflowIsNotFound", testWatchUnknown},
		{"WithoutWorkflowIDIsInvalidArgument", testWatchNoID},
	})
}

// watcher reads one WatchWorkflow stream in the background, so a case
// can act on the workflow while the stream is open.
type watcher struct {
	s    *suite
	req  *orchestratorv1.WatchWorkflowRequest
	ch   chan watchItem // closed once the stream has ended
	done bool
	// What it received so far.
	events   []*lifecyclev1.LifecycleEvent
	progress []*orchestratorv1.StepProgress
	end      *orchestratorv1.Workflow
}

// watchItem is a message of the stream, or the error that ended it
// (none when it ended OK).
type watchItem struct {
	msg *orchestratorv1.WatchWorkflowResponse
	err error
}

// watch opens a WatchWorkflow stream. The stream is bounded by the
// suite's wait bound plus the call bound, and closed when the test ends.
func (s *suite) watch(t *testing.T, req *orchestratorv1.WatchWorkflowRequest) *watcher {
	t.Helper()
	c, cancel := context.WithTimeout(t.Context(), s.wait+callTimeout)
	t.Cleanup(cancel)
	w := &watcher{s: s, req: req, ch: make(chan watchItem)}
	stream, err := s.c.WatchWorkflow(c, req)
	go func() {
		defer close(w.ch)
		put := func(it watchItem) bool {
			select {
			case w.ch <- it:
				return true
			case <-c.Done():
				return false
			}
		}
		if err != nil {
			put(watchItem{err: err})
			return
		}
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if !put(watchItem{msg: msg, err: err}) || err != nil {
				return
			}
		}
	}()
	return w
}

// what names the stream in messages.
func (w *watcher) what() string {
	return fmt.Sprintf("WatchWorkflow(%q, after_sequence %d, omit_progress %v)", w.req.GetWorkflowId(), w.req.GetAfterSequence(), w.req.GetOmitProgress())
}

// next receives the next message and records it; false when the stream
// ended OK. It fails t on an error, a message after the end, or no
// message within the suite's wait bound.
func (w *watcher) next(t *testing.T) (*orchestratorv1.WatchWorkflowResponse, bool) {
	t.Helper()
	if w.done {
		return nil, false
	}
	timer := time.NewTimer(w.s.wait)
	defer timer.Stop()
	var it watchItem
	var ok bool
	select {
	case it, ok = <-w.ch:
	case <-timer.C:
		t.Fatalf("%s: nothing received within %v; so far %s", w.what(), w.s.wait, w.summary())
	}
	if !ok {
		w.done = true
		return nil, false
	}
	if it.err != nil {
		t.Fatalf("%s: %v (after %s)", w.what(), it.err, w.summary())
	}
	if w.end != nil {
		t.Fatalf("%s: a message %v after the end; the end must be the stream's last message", w.what(), it.msg)
	}
	switch k := it.msg.GetKind().(type) {
	case *orchestratorv1.WatchWorkflowResponse_Event:
		w.events = append(w.events, k.Event)
	case *orchestratorv1.WatchWorkflowResponse_Progress:
		w.progress = append(w.progress, k.Progress)
	case *orchestratorv1.WatchWorkflowResponse_End:
		if k.End == nil {
			t.Fatalf("%s: an end without its workflow", w.what())
		}
		w.end = k.End
	default:
		t.Fatalf("%s: a message with none of event, progress and end set: %v", w.what(), it.msg)
	}
	return it.msg, true
}

// until receives messages until ok holds for one; what says what is
// awaited.
func (w *watcher) until(t *testing.T, what string, ok func(*orchestratorv1.WatchWorkflowResponse) bool) *orchestratorv1.WatchWorkflowResponse {
	t.Helper()
	for {
		msg, more := w.next(t)
		if !more {
			t.Fatalf("%s ended (%s) before %s", w.what(), w.summary(), what)
		}
		if ok(msg) {
			return msg
		}
	}
}

// rest receives until the stream ends, which it must do with an end.
func (w *watcher) rest(t *testing.T) *watcher {
	t.Helper()
	for {
		if _, more := w.next(t); !more {
			break
		}
	}
	if w.end == nil {
		t.Fatalf("%s ended without an end message (%s); the workflow must come last", w.what(), w.summary())
	}
	return w
}

// seqs returns the workflow_sequence of each event received.
func (w *watcher) seqs() []uint64 {
	out := make([]uint64, len(w.events))
	for i, e := range w.events {
		out[i] = e.GetWorkflowSequence()
	}
	return out
}

func (w *watcher) summary() string {
	end := "no end"
	if w.end != nil {
		end = "end " + describe(w.end)
	}
	return fmt.Sprintf("events %v, %d progress, %s", w.seqs(), len(w.progress), end)
}

// wantLog fails t unless the stream's events are those of workflow id
// numbered after+1, after+2, ... without a gap or a repeat, and at least
// least of them.
func (w *watcher) wantLog(t *testing.T, id string, after uint64, least int) {
	t.Helper()
	if len(w.events) < least {
		t.Fatalf("%s sent %d events; want at least %d (%s)", w.what(), len(w.events), least, w.summary())
	}
	for i, e := range w.events {
		if want := after + uint64(i) + 1; e.GetWorkflowSequence() != want {
			t.Fatalf("%s: event %d has workflow_sequence %d; want %d (in order, from after_sequence+1, no gap, no repeat): %v",
				w.what(), i, e.GetWorkflowSequence(), want, w.seqs())
		}
		if e.GetWorkflowId() != id {
			t.Fatalf("%s: event %d (workflow_sequence %d) is of workflow %q", w.what(), i, e.GetWorkflowSequence(), e.GetWorkflowId())
		}
	}
}

// wantEnd fails t unless the stream ended with workflow id in status
// want, agreeing with GetWorkflow.
func (w *watcher) wantEnd(t *testing.T, id string, want orchestratorv1.WorkflowStatus) {
	t.Helper()
	if w.end.GetWorkflowId() != id || w.end.GetStatus() != want {
		t.Fatalf("%s ended with workflow %q: %s; want %q %v", w.what(), w.end.GetWorkflowId(), describe(w.end), id, want)
	}
	wf := w.s.get(t, id)
	if wf.GetStatus() != w.end.GetStatus() || wf.GetSteps() != w.end.GetSteps() || !proto.Equal(wf.GetLastOutput(), w.end.GetLastOutput()) {
		t.Fatalf("%s ended with %s, last_output %v; GetWorkflow says %s, last_output %v", w.what(), describe(w.end), w.end.GetLastOutput(), describe(wf), wf.GetLastOutput())
	}
}

// watchAll watches workflow id from after to its end.
func (s *suite) watchAll(t *testing.T, id string, after uint64) *watcher {
	t.Helper()
	return s.watch(t, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, AfterSequence: after}).rest(t)
}

// testWatchLive watches an Answer workflow from its start.
func testWatchLive(t *testing.T, s *suite) {
	id := s.id("watch")
	s.start(t, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: s.agents.Answer, Input: input("Stream your answer.")})
	w := s.watchAll(t, id, 0)
	w.wantLog(t, id, 0, 1)
	w.wantEnd(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
}

// testWatchEnded watches a workflow that has already ended: it gets the
// whole log and the end, the same each time.
func testWatchEnded(t *testing.T, s *suite) {
	id := s.completed(t)
	w := s.watchAll(t, id, 0)
	w.wantLog(t, id, 0, 1)
	w.wantEnd(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	again := s.watchAll(t, id, 0)
	if len(again.events) != len(w.events) {
		t.Fatalf("watching ended workflow %q twice: events %v, then %v; want the same log", id, w.seqs(), again.seqs())
	}
	for i := range w.events {
		if !proto.Equal(w.events[i], again.events[i]) {
			t.Fatalf("watching ended workflow %q twice: event %d is %v, then %v; want the same log", id, i, w.events[i], again.events[i])
		}
	}
}

// testWatchReconnect: a watch from after_sequence gets exactly the
// events after it (the same events), and one from the last gets only
// the end.
func testWatchReconnect(t *testing.T, s *suite) {
	id := s.completed(t)
	all := s.watchAll(t, id, 0)
	all.wantLog(t, id, 0, 2)
	mid := len(all.events) / 2
	after := all.events[mid-1].GetWorkflowSequence()
	rest := s.watchAll(t, id, after)
	rest.wantLog(t, id, after, len(all.events)-mid)
	if len(rest.events) != len(all.events)-mid {
		t.Fatalf("%s sent events %v; the whole log is %v: want exactly the ones after %d", rest.what(), rest.seqs(), all.seqs(), after)
	}
	for i, e := range rest.events {
		if !proto.Equal(e, all.events[mid+i]) {
			t.Fatalf("%s: event %d is %v; the whole log has %v there", rest.what(), e.GetWorkflowSequence(), e, all.events[mid+i])
		}
	}
	rest.wantEnd(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)

	last := all.events[len(all.events)-1].GetWorkflowSequence()
	tail := s.watchAll(t, id, last)
	if len(tail.events) != 0 {
		t.Fatalf("%s sent events %v; the log ends at %d: want none, then the end", tail.what(), tail.seqs(), last)
	}
	tail.wantEnd(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
}

// streaming starts the Streamer agent and returns its workflow's id.
func (s *suite) streaming(t *testing.T) string {
	t.Helper()
	id := s.id("stream")
	s.start(t, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: s.agents.Streamer, Input: input("Stream and take your time.")})
	return id
}

func isProgress(m *orchestratorv1.WatchWorkflowResponse) bool { return m.GetProgress() != nil }
func isEvent(m *orchestratorv1.WatchWorkflowResponse) bool    { return m.GetEvent() != nil }

// testWatchProgress: a watch of a workflow whose call is running gets
// that call's progress from its start, then, once it is cancelled, the
// end.
func testWatchProgress(t *testing.T, s *suite) {
	id := s.streaming(t)
	w := s.watch(t, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id})
	p := w.until(t, "the Streamer's progress", isProgress).GetProgress()
	if p.GetAgentId() != s.agents.Streamer || p.GetStep() < 1 || p.GetDispatchId() == "" || p.GetDepth() != 0 || p.GetIndex() != 1 {
		t.Fatalf("%s: first progress %v; want agent_id %q, step >= 1, a dispatch_id, depth 0 and index 1 (a watcher gets the running call's progress from its start)",
			w.what(), p, s.agents.Streamer)
	}
	if got := p.GetEvent().GetTextDelta().GetText(); got != StreamerText {
		t.Fatalf("%s: first progress event %v; want the Streamer's text delta %q", w.what(), p.GetEvent(), StreamerText)
	}
	if p.GetEvent().GetOutput() != nil {
		t.Fatalf("%s: progress carries the output %v; progress never does", w.what(), p.GetEvent())
	}
	s.cancel(t, id, "conformance: watched enough")
	w.rest(t)
	w.wantLog(t, id, 0, 1)
	w.wantEnd(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED)
	for i := 1; i < len(w.progress); i++ {
		a, b := w.progress[i-1], w.progress[i]
		if a.GetDispatchId() == b.GetDispatchId() && b.GetIndex() <= a.GetIndex() {
			t.Fatalf("%s: progress of call %q has index %d after %d; want increasing", w.what(), b.GetDispatchId(), b.GetIndex(), a.GetIndex())
		}
	}
}

// testWatchOmitProgress: with omit_progress a watch open while the call
// runs (and has progress) gets the events and the end, and no progress.
func testWatchOmitProgress(t *testing.T, s *suite) {
	id := s.streaming(t)
	full := s.watch(t, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id})
	full.until(t, "the Streamer's progress", isProgress)
	quiet := s.watch(t, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, OmitProgress: true})
	quiet.until(t, "an event of the running workflow (its step started)", func(m *orchestratorv1.WatchWorkflowResponse) bool {
		return isEvent(m) || isProgress(m)
	})
	s.cancel(t, id, "conformance: watched enough")
	quiet.rest(t)
	if len(quiet.progress) != 0 {
		t.Fatalf("%s sent %d progress messages, the first %v; want none", quiet.what(), len(quiet.progress), quiet.progress[0])
	}
	quiet.wantLog(t, id, 0, 1)
	quiet.wantEnd(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED)
}

// testWatchApproval: a watch of a workflow waiting for approval stays
// open through the decision and ends when the workflow completes.
func testWatchApproval(t *testing.T, s *suite) {
	id := s.awaitingApproval(t).GetWorkflowId()
	w := s.watch(t, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, OmitProgress: true})
	w.until(t, "an event of the suspended workflow", isEvent)
	s.decide(t, id, approveFirst()...)
	w.rest(t)
	if st := w.end.GetStatus(); st != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Fatalf("%s ended with the workflow %v; want the stream open while it waits for approval, and the end once the decision completed it", w.what(), st)
	}
	w.wantEnd(t, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	w.wantLog(t, id, 0, 2)
}

func testWatchUnknown(t *testing.T, s *suite) {
	ghost := s.ns + "-no-such-workflow"
	w := s.watch(t, &orchestratorv1.WatchWorkflowRequest{WorkflowId: ghost})
	wantCode(t, w.what(), w.err(t), codes.NotFound, ghost)
}

func testWatchNoID(t *testing.T, s *suite) {
	w := s.watch(t, &orchestratorv1.WatchWorkflowRequest{})
	wantCode(t, w.what(), w.err(t), codes.InvalidArgument)
}

// err returns the error that ends a stream that must fail before its
// first message.
func (w *watcher) err(t *testing.T) error {
	t.Helper()
	timer := time.NewTimer(w.s.wait)
	defer timer.Stop()
	select {
	case it, ok := <-w.ch:
		switch {
		case !ok:
			return nil
		case it.err == nil:
			t.Fatalf("%s sent %v; want it to fail", w.what(), it.msg)
		}
		return it.err
	case <-timer.C:
		t.Fatalf("%s: neither a message nor an error within %v", w.what(), w.s.wait)
	}
	return nil
}
