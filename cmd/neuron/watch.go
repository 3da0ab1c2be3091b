package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// Event types of a workflow waiting for, and getting, a decision.
const (
	eventSuspended      = "orchestrator.workflow.suspended"
	eventSignalAccepted = "orchestrator.signal.accepted"
	eventDispatchFailed = "orchestrator.dispatch.failed"
)

// watchRetries bounds the reconnects in a row that fail before a watch
// gives up; watchBackoff is the longest pause between two.
const (
	watchRetries = 30
	watchBackoff = time.Second
)

// watcher follows one workflow's WatchWorkflow stream to its end,
// reconnecting after the last durable event it delivered when the stream
// breaks (UNAVAILABLE, RESOURCE_EXHAUSTED, an early end), so that no event
// is delivered twice or lost. Live progress, which the server does not
// keep, is replayed from the running call's start on a reconnect: what was
// already delivered is recognised and left out.
type watcher struct {
	client orchestratorv1.OrchestratorServiceClient
	id     string
	// omitProgress asks for the durable events only.
	omitProgress bool
	// pending, when set, says NOT_FOUND means "not created yet": it is
	// retried while pending returns true (a Dispatch creating it runs).
	pending func() bool
	// onEvent and onProgress receive what the stream delivers, in order,
	// on the watcher's goroutine. restarted is true for the first event
	// of an operator call made again (a retry, or after a restart).
	onEvent    func(ev *lifecyclev1.LifecycleEvent)
	onProgress func(p *orchestratorv1.StepProgress, restarted bool)

	// last is the workflow_sequence of the last durable event delivered.
	last uint64
	// gen counts the streams opened; calls are the progress delivered per
	// operator call (dispatch id).
	gen   int
	calls map[string]*seenCall
	// reconnects counts the streams reopened after a break.
	reconnects int
}

// seenCall is the progress of one operator call delivered so far: a
// fingerprint per index, and the stream (gen) that delivered the last.
type seenCall struct {
	gen    int
	prints []uint64
}

// run watches until the workflow ends and returns it, or until ctx ends
// or the stream fails in a way a reconnect does not fix.
func (w *watcher) run(ctx context.Context) (*orchestratorv1.Workflow, error) {
	if w.calls == nil {
		w.calls = map[string]*seenCall{}
	}
	backoff, failures, connected := 50*time.Millisecond, 0, false
	poll := 5 * time.Millisecond
	for {
		w.gen++
		var (
			end *orchestratorv1.Workflow
			got bool
		)
		stream, err := w.client.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{
			WorkflowId: w.id, AfterSequence: w.last, OmitProgress: w.omitProgress,
		})
		if err == nil {
			end, got, err = w.read(stream)
		}
		if end != nil {
			return end, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if got {
			connected, failures, backoff = true, 0, 50*time.Millisecond
		}
		var pause time.Duration
		switch code := status.Code(err); {
		case code == codes.NotFound && w.pending != nil && w.pending():
			// Not created yet: its Dispatch is on its way. Asked often,
			// so that little of its first call's progress is missed.
			pause, poll = poll, min(2*poll, 100*time.Millisecond)
		case (code == codes.Unavailable || code == codes.ResourceExhausted) && connected && failures < watchRetries:
			failures++
			w.reconnects++
			pause, backoff = backoff, min(2*backoff, watchBackoff)
		default:
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pause):
		}
	}
}

// read delivers one stream's messages until it ends; got says whether it
// delivered anything (even a duplicate).
func (w *watcher) read(stream orchestratorv1.OrchestratorService_WatchWorkflowClient) (*orchestratorv1.Workflow, bool, error) {
	got := false
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, got, status.Error(codes.Unavailable, "the watch stream ended before the workflow did")
		}
		if err != nil {
			return nil, got, err
		}
		got = true
		switch k := resp.GetKind().(type) {
		case *orchestratorv1.WatchWorkflowResponse_Event:
			ev := k.Event
			if seq := ev.GetWorkflowSequence(); seq != 0 {
				if seq <= w.last {
					continue // delivered before the reconnect
				}
				w.last = seq
			}
			switch ev.GetObservable().GetEventType() {
			case eventDispatchDone, eventDispatchFailed:
				// Its progress is never sent again.
				if d, ok := dataMap(ev.GetObservable())["dispatch_id"].(string); ok {
					delete(w.calls, d)
				}
			}
			if w.onEvent != nil {
				w.onEvent(ev)
			}
		case *orchestratorv1.WatchWorkflowResponse_Progress:
			fresh, restarted := w.fresh(k.Progress)
			if fresh && w.onProgress != nil {
				w.onProgress(k.Progress, restarted)
			}
		case *orchestratorv1.WatchWorkflowResponse_End:
			return k.End, true, nil
		}
	}
}

// fresh reports whether p was not delivered yet, and whether it begins a
// new attempt of its call. After a reconnect the running call's progress
// comes again from index 1: an event equal to the one delivered at its
// index is a replay. On one stream, an index that goes back is a new
// attempt of the call.
func (w *watcher) fresh(p *orchestratorv1.StepProgress) (fresh, restarted bool) {
	id, i := p.GetDispatchId(), int(p.GetIndex())
	fp := fingerprint(p.GetEvent())
	s := w.calls[id]
	if s == nil {
		s = &seenCall{gen: w.gen}
		w.calls[id] = s
	}
	if i >= 1 && i <= len(s.prints) {
		if s.gen != w.gen && s.prints[i-1] == fp {
			return false, false
		}
		s.prints, restarted = s.prints[:i-1], true
	}
	for i > len(s.prints)+1 {
		s.prints = append(s.prints, 0) // a gap: positions stay aligned
	}
	s.gen = w.gen
	s.prints = append(s.prints, fp)
	return true, restarted
}

// dataMap is an observable event's data as a map (nil when it is not an
// object).
func dataMap(o *lifecyclev1.ObservableEvent) map[string]any {
	d, _ := o.GetData().AsInterface().(map[string]any)
	return d
}

// fingerprint is a hash of an event's deterministic encoding.
func fingerprint(m proto.Message) uint64 {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64()
}

// ANSI styles of the stream view on a terminal.
const (
	styleDim   = "\033[2m"
	styleReset = "\033[0m"
)

// streamView shows a workflow's stream for a person: the model's text as
// it arrives, a dim line per tool call and result, and (with events) a
// line per durable event. Delegated agents' lines are indented by depth.
// Its methods are safe to call from several goroutines.
type streamView struct {
	w io.Writer
	// color: dim tool lines (a terminal); events: print the durable
	// events; text: stream the text deltas and tool calls.
	color, events, text bool

	mu      sync.Mutex
	began   time.Time
	first   time.Time // the time of the first event shown
	waiting bool      // the last event shown was the workflow suspending
	mid     bool      // the last line written has no newline yet
	speaker string    // the dispatch id whose text was written last
	kinds   effectKinds
	effects []*orchestratorv1.EffectOutcome
	spent   string
	// streamed is whether any text was written.
	streamed bool
}

// newStreamView returns a view writing to w.
func newStreamView(w io.Writer, color, events, text bool) *streamView {
	return &streamView{w: w, color: color, events: events, text: text, began: time.Now(), kinds: effectKinds{}}
}

// dim wraps s in the dim style on a terminal.
func (v *streamView) dim(s string) string {
	if v.color {
		return styleDim + s + styleReset
	}
	return s
}

// newline ends a line of streamed text; callers hold v.mu.
func (v *streamView) newline() {
	if v.mid {
		fmt.Fprintln(v.w)
		v.mid = false
	}
}

// line writes one whole line; callers hold v.mu.
func (v *streamView) line(s string) {
	v.newline()
	fmt.Fprintln(v.w, s)
}

// event shows a durable event and learns what the result needs from it.
func (v *streamView) event(ev *lifecyclev1.LifecycleEvent) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.kinds.learn(ev)
	o := ev.GetObservable()
	if strings.HasPrefix(o.GetEventType(), eventEffectPfx) {
		d := dataMap(o)
		key, _ := d["idempotency_key"].(string)
		detail, _ := d["detail"].(string)
		v.effects = append(v.effects, &orchestratorv1.EffectOutcome{
			IdempotencyKey: key, Applied: o.GetEventType() == "orchestrator.effect.applied", Detail: detail,
		})
	}
	if c := ev.GetBudget().GetCostIncurred(); c != nil {
		v.spent = c.GetCumulative().GetAmount()
	}
	if !v.events {
		return
	}
	agent := ev.GetAgentId()
	if agent == "" {
		agent = "-"
	}
	// Times are the events' own, from the first one shown: a replayed
	// log keeps its pace.
	at := time.Now()
	if ev.GetTime() != nil {
		at = ev.GetTime().AsTime()
	}
	if v.first.IsZero() {
		v.first = at
	}
	v.line(fmt.Sprintf("  %-7s %-12s %s", elapsed(at.Sub(v.first)), agent, v.describe(ev)))
}

// describe is describe(ev), with an approval decision named as such;
// callers hold v.mu.
func (v *streamView) describe(ev *lifecyclev1.LifecycleEvent) string {
	o := ev.GetObservable()
	waiting := v.waiting
	switch o.GetEventType() {
	case eventSuspended:
		v.waiting = true
	case eventSignalAccepted:
		v.waiting = false
	case eventDispatchDone, eventDispatchFailed:
		v.waiting = false
	}
	if o.GetEventType() == eventSignalAccepted {
		d := dataMap(o)
		t, _ := d["signal_type"].(string)
		switch {
		case t == "approval":
			return fmt.Sprintf("approval decision accepted (sequence %v): the workflow resumes", d["sequence"])
		case t != "":
			return fmt.Sprintf("signal %s accepted (sequence %v)", t, d["sequence"])
		case waiting:
			// A journal that does not name the signal's type: the one a
			// suspended workflow gets is, in practice, the decision.
			return fmt.Sprintf("signal %v accepted while waiting for approval: the workflow resumes", d["sequence"])
		}
	}
	if o.GetEventType() == eventSuspended {
		n := len(o.GetData().GetStructValue().GetFields()["approvals"].GetListValue().GetValues())
		if n > 0 {
			return describe(ev) + fmt.Sprintf(", %d tool call(s) wait for approval", n)
		}
	}
	return describe(ev)
}

// progress shows one progress event of an operator call.
func (v *streamView) progress(p *orchestratorv1.StepProgress, restarted bool) {
	if !v.text {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	indent := strings.Repeat("  │ ", int(p.GetDepth()))
	if restarted {
		v.line(indent + v.dim(fmt.Sprintf("↻ %s's operator call %s started again", p.GetAgentId(), p.GetDispatchId())))
	}
	switch e := p.GetEvent().GetEvent().(type) {
	case *operatorv1.ExecuteStreamResponse_TextDelta:
		if v.speaker != p.GetDispatchId() {
			v.newline()
			if p.GetDepth() > 0 {
				fmt.Fprintln(v.w, indent+v.dim(p.GetAgentId()+":"))
			}
			v.speaker = p.GetDispatchId()
		}
		v.writeText(indent, e.TextDelta.GetText())
	case *operatorv1.ExecuteStreamResponse_ToolCallStarted:
		v.line(indent + v.dim("→ "+e.ToolCallStarted.GetName()+"("+clip(jsonText(e.ToolCallStarted.GetInput()), 80)+")"))
		v.speaker = ""
	case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
		f := e.ToolCallFinished
		res := clip(firstLine(f.GetResult()), 80)
		if f.GetIsError() {
			res = "error: " + res
		}
		v.line(indent + v.dim(fmt.Sprintf("← %s (%d bytes)", res, len(f.GetResult()))))
		v.speaker = ""
	}
}

// writeText writes streamed text, each new line indented; callers hold
// v.mu.
func (v *streamView) writeText(indent, s string) {
	if s == "" {
		return
	}
	v.streamed = true
	for i, part := range strings.Split(s, "\n") {
		if i > 0 {
			fmt.Fprintln(v.w)
			v.mid = false
		}
		if part == "" {
			continue
		}
		if !v.mid {
			fmt.Fprint(v.w, indent)
		}
		fmt.Fprint(v.w, part)
		v.mid = true
	}
}

// finish ends the streamed text's last line.
func (v *streamView) finish() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.newline()
}

// approvals shows the calls a workflow waits on and the commands that
// decide them; addr is the --addr to repeat when it is not the default.
func (v *streamView) approvals(wfID, addr string, calls []*orchestratorv1.PendingApproval) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.newline()
	printApprovals(v.w, wfID, addr, calls)
}

// printApprovals writes the pending calls of wfID and how to decide them.
func printApprovals(w io.Writer, wfID, addr string, calls []*orchestratorv1.PendingApproval) {
	if len(calls) == 1 && calls[0].GetLimitRequest() != nil {
		r := calls[0].GetLimitRequest()
		hint := limitHint(wfID, r)
		if addr != "" && addr != defaultOrchestratorAddr {
			hint += " --addr " + addr
		}
		fmt.Fprintf(w, "\nworkflow %s reached a limit (%s) and waits for a raise:\n  %s\n", wfID, limitLine(r), hint)
		return
	}
	fmt.Fprintf(w, "\nworkflow %s waits for approval of %d tool call(s):\n", wfID, len(calls))
	for _, a := range calls {
		tc := a.GetToolCall()
		line := fmt.Sprintf("  %s  %s(%s)", tc.GetToolUseId(), tc.GetName(), clip(jsonText(tc.GetInput()), 100))
		var why []string
		if a.GetAgentId() != "" {
			why = append(why, "agent "+a.GetAgentId())
		}
		if r := tc.GetReason(); r != "" {
			why = append(why, "reason: "+oneLine(r))
		}
		if len(why) > 0 {
			line += "  [" + strings.Join(why, ", ") + "]"
		}
		fmt.Fprintln(w, line)
	}
	cmd := "neuron approve " + wfID
	if addr != "" && addr != defaultOrchestratorAddr {
		cmd += " --addr " + addr
	}
	fmt.Fprintf(w, "approve:  %s\n", cmd)
	fmt.Fprintf(w, "reject:   %s --reject --reason \"why\"\n", cmd)
	if len(calls) > 1 {
		fmt.Fprintf(w, "mixed:    %s --call %s --reject-call %s\n", cmd, calls[0].GetToolCall().GetToolUseId(), calls[1].GetToolCall().GetToolUseId())
	}
}

// approvalsFromEvent reads the pending calls an orchestrator.workflow.
// suspended event lists (for a server that does not list them in the
// workflow).
func approvalsFromEvent(ev *lifecyclev1.LifecycleEvent) []*orchestratorv1.PendingApproval {
	var out []*orchestratorv1.PendingApproval
	for _, item := range ev.GetObservable().GetData().GetStructValue().GetFields()["approvals"].GetListValue().GetValues() {
		f := item.GetStructValue().GetFields()
		out = append(out, &orchestratorv1.PendingApproval{
			WorkflowId: ev.GetWorkflowId(), AgentId: ev.GetAgentId(),
			ToolCall: &operatorv1.PendingToolCall{
				ToolUseId: f["tool_use_id"].GetStringValue(), Name: f["name"].GetStringValue(),
				Input: f["input"], Reason: f["reason"].GetStringValue(),
			},
		})
	}
	return out
}

// jsonText is v as compact JSON ("" for none).
func jsonText(v *structpb.Value) string {
	if v == nil {
		return ""
	}
	b, err := json.Marshal(v.AsInterface())
	if err != nil {
		return string(protoLine(v))
	}
	return string(b)
}

// clip cuts s to at most n runes, marking a cut with "…".
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// firstLine is s's first non-empty line, with "…" when more follows.
func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[:i]) + " …"
	}
	return s
}

// jsonStream prints a watch as one protojson object per line:
// {"event": LifecycleEvent}, {"progress": StepProgress}, {"end": Workflow}.
type jsonStream struct {
	mu sync.Mutex
	w  io.Writer
}

func (j *jsonStream) print(key string, m proto.Message) {
	j.mu.Lock()
	defer j.mu.Unlock()
	printJSONLine(j.w, map[string]any{key: rawProto(m)})
}

const watchHelp = `Follow a workflow as it runs: every durable event (operator calls, effects,
costs, approvals requested and decided), the model's text as it arrives and
each tool call with its result, until the workflow ends. A broken stream is
reconnected after the last event seen: nothing is shown twice. A workflow
waiting for approval is shown with the commands that decide it, and the
watch goes on until it ends.

--json prints one protojson object per line: {"event": LifecycleEvent},
{"progress": StepProgress}, and last {"end": Workflow}.

Exit codes: 0 completed, 3 ended without completing (failed, canceled, or
not COMPLETE), 10+N a gRPC status code N.`

// watchWorkflow is `neuron workflows watch ID`.
func (c *cli) watchWorkflow(ctx context.Context, client orchestratorv1.OrchestratorServiceClient, cn *conn, id string, after uint64, events bool) error {
	w := &watcher{client: client, id: id, last: after}
	var view *streamView
	if cn.json {
		js := &jsonStream{w: c.stdout}
		w.onEvent = func(ev *lifecyclev1.LifecycleEvent) { js.print("event", ev) }
		w.onProgress = func(p *orchestratorv1.StepProgress, _ bool) { js.print("progress", p) }
	} else {
		view = newStreamView(c.stdout, c.terminal, events, true)
		w.onEvent = func(ev *lifecyclev1.LifecycleEvent) {
			view.event(ev)
			if ev.GetObservable().GetEventType() == eventSuspended {
				view.approvals(id, cn.addr, approvalsFromEvent(ev))
			}
		}
		w.onProgress = view.progress
	}
	wf, err := w.run(ctx)
	if err != nil {
		return cn.wrap(err)
	}
	if cn.json {
		printJSONLine(c.stdout, map[string]any{"end": rawProto(wf)})
	} else {
		view.finish()
		printEnd(c.stdout, wf)
	}
	return endError(wf)
}

// printEnd writes how a watched workflow ended and its last answer.
func printEnd(w io.Writer, wf *orchestratorv1.Workflow) {
	fmt.Fprintf(w, "\nworkflow %s %s: %d operator call(s), spent %s\n", wf.GetWorkflowId(), statusName(wf.GetStatus()), wf.GetSteps(), money(wf.GetSpent()))
	if out := wf.GetLastOutput(); out != nil {
		agent := wf.GetCurrentAgentId()
		if agent == "" {
			agent = wf.GetRootAgentId()
		}
		fmt.Fprintf(w, "answer (%s):\n", agent)
		text := strings.TrimSpace(content.TextOf(out.GetMessage()))
		if text == "" {
			text = "(no text)"
		}
		for _, l := range strings.Split(text, "\n") {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
}

// endError is the result of a workflow that ended: nil for COMPLETED with
// a COMPLETE exit, else exit 3 saying why.
func endError(wf *orchestratorv1.Workflow) error {
	st := wf.GetStatus()
	if st == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		if k := wf.GetLastOutput().GetExitReason().GetKind(); k == operatorv1.ExitKind_EXIT_KIND_COMPLETE || k == operatorv1.ExitKind_EXIT_KIND_UNSPECIFIED {
			return nil
		}
		return &exitError{code: exitNotCompleted, msg: fmt.Sprintf("workflow %s ended without completing: exit %s",
			wf.GetWorkflowId(), strings.TrimPrefix(wf.GetLastOutput().GetExitReason().GetKind().String(), "EXIT_KIND_"))}
	}
	msg := fmt.Sprintf("workflow %s ended %s", wf.GetWorkflowId(), statusName(st))
	if f := wf.GetFailure(); f != nil {
		msg += ": " + codeName(codes.Code(uint32(f.GetCode()))) + ": " + oneLine(f.GetMessage())
	}
	return &exitError{code: exitNotCompleted, msg: msg}
}
