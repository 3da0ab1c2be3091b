package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// canWatch reports whether the orchestrator serves WatchWorkflow: false
// for one that does not (UNIMPLEMENTED) or cannot be asked (unreachable:
// the caller's other path reports that as before).
func canWatch(ctx context.Context, client orchestratorv1.OrchestratorServiceClient, id string) bool {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, OmitProgress: true})
	if err == nil {
		_, err = stream.Recv()
	}
	switch status.Code(err) {
	case codes.OK, codes.NotFound:
		return true
	}
	return false
}

// dispatchResult is what a Dispatch call returned.
type dispatchResult struct {
	resp *orchestratorv1.DispatchResponse
	err  error
}

// watchEnd is what a watcher returned.
type watchEnd struct {
	wf  *orchestratorv1.Workflow
	err error
}

// suspendedOutput reports whether out stopped to wait for a person.
func suspendedOutput(out *operatorv1.OperatorOutput) bool {
	return out.GetExitReason().GetKind() == operatorv1.ExitKind_EXIT_KIND_SUSPENDED
}

// pendingApprovals are the calls workflow id waits on: the workflow's
// list, else those of its suspension event or output.
func pendingApprovals(ctx context.Context, client orchestratorv1.OrchestratorServiceClient, id string, ev *lifecyclev1.LifecycleEvent, out *operatorv1.OperatorOutput) []*orchestratorv1.PendingApproval {
	if resp, err := client.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id}); err == nil && len(resp.GetWorkflow().GetPendingApprovals()) > 0 {
		return resp.GetWorkflow().GetPendingApprovals()
	} else if r := resp.GetWorkflow().GetLimitRequest(); err == nil && r != nil {
		return []*orchestratorv1.PendingApproval{{WorkflowId: id, AgentId: r.GetAgentId(), LimitRequest: r}}
	}
	if ev != nil {
		if a := approvalsFromEvent(ev); len(a) > 0 {
			return a
		}
	}
	var list []*orchestratorv1.PendingApproval
	for _, tc := range out.GetExitReason().GetSuspension().GetToolCalls() {
		list = append(list, &orchestratorv1.PendingApproval{WorkflowId: id, ToolCall: tc})
	}
	return list
}

// runStream runs req through Dispatch while it watches the workflow with
// WatchWorkflow: the model's text as it arrives, the tool calls, the
// durable events, then the result as `neuron run` always printed it. It
// returns streamed false (and no error) when the orchestrator has no
// WatchWorkflow, for the caller to follow the lifecycle events instead.
func (c *cli) runStream(ctx context.Context, cc grpc.ClientConnInterface, req *orchestratorv1.DispatchRequest, f *runFlags) (bool, error) {
	client := orchestratorv1.NewOrchestratorServiceClient(cc)
	if !canWatch(ctx, client, req.GetWorkflowId()) {
		return false, nil
	}
	id := req.GetWorkflowId()
	// Who asked for the run, on the lifecycle bus (`neuron events`); the
	// watch itself needs no marker: the workflow's log is replayed whole.
	_, _ = markRun(ctx, lifecyclev1.NewLifecycleServiceClient(cc), req)
	text := !f.quiet && !f.conn.json
	view := newStreamView(c.stdout, c.terminal, text, text)
	var js *jsonStream
	if f.conn.json {
		js = &jsonStream{w: c.stdout}
	}
	if text {
		fmt.Fprintf(c.stdout, "dispatching %s in workflow %s\n", req.GetAgentId(), id)
	}

	var (
		started, dispatched, waiting atomic.Bool
		suspendedEv                  atomic.Pointer[lifecyclev1.LifecycleEvent]
	)
	suspendedSeen := make(chan struct{}, 1)
	w := &watcher{client: client, id: id, pending: func() bool { return !dispatched.Load() }}
	w.onEvent = func(ev *lifecyclev1.LifecycleEvent) {
		if js != nil {
			js.print("event", ev)
		}
		view.event(ev)
		switch ev.GetObservable().GetEventType() {
		case "orchestrator.workflow.started":
			started.Store(true)
		case eventSuspended:
			suspendedEv.Store(ev)
			if waiting.Load() && text {
				// Waiting through a decision, and asked again.
				view.approvals(id, f.conn.addr, pendingApprovals(ctx, client, id, ev, nil))
			}
			select {
			case suspendedSeen <- struct{}{}:
			default:
			}
		}
	}
	w.onProgress = func(p *orchestratorv1.StepProgress, restarted bool) {
		if js != nil {
			js.print("progress", p)
		}
		view.progress(p, restarted)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	ends := make(chan watchEnd, 1)
	go func() {
		wf, err := w.run(wctx)
		ends <- watchEnd{wf, err}
	}()
	results := make(chan dispatchResult, 1)
	go func() {
		resp, err := client.Dispatch(ctx, req)
		dispatched.Store(true)
		results <- dispatchResult{resp, err}
	}()

	// end waits for the watch to end, at most until timeout (nil: no
	// bound); later calls return the same.
	var end *watchEnd
	awaitEnd := func(timeout <-chan time.Time) *watchEnd {
		if end != nil {
			return end
		}
		select {
		case e := <-ends:
			end = &e
		case <-timeout:
			stopWatch()
			e := <-ends
			end = &e
		}
		return end
	}
	fail := func(err error) (bool, error) {
		awaitEnd(nil)
		view.finish()
		if js != nil {
			(&jsonProgress{w: c.stdout}).fail(err)
		}
		return true, f.conn.wrap(err)
	}

	r := <-results
	if r.err != nil {
		if !started.Load() {
			// Refused before it started (unknown agent, bad request):
			// there are no events to wait for.
			stopWatch()
		}
		awaitEnd(time.After(drainWait))
		return fail(r.err)
	}
	resp := r.resp
	if suspendedOutput(resp.GetOutput()) {
		select {
		case <-suspendedSeen:
		case <-time.After(drainWait):
		}
		calls := pendingApprovals(ctx, client, id, suspendedEv.Load(), resp.GetOutput())
		if !f.waitApproval {
			stopWatch()
			awaitEnd(nil)
			view.finish()
			if js != nil {
				list := make([]any, 0, len(calls))
				for _, a := range calls {
					list = append(list, rawProto(a))
				}
				printJSONLine(c.stdout, map[string]any{"approvals": list})
				printJSONLine(c.stdout, map[string]any{"result": rawProto(resp)})
			} else {
				printApprovals(c.stdout, id, f.conn.addr, calls)
			}
			return true, &exitError{code: exitAwaitingApproval, msg: fmt.Sprintf(
				"workflow %s waits for approval of %d tool call(s); decide with `neuron approve %s`, then follow it with `neuron workflows watch %s`", id, len(calls), id, id)}
		}
		if text {
			view.approvals(id, f.conn.addr, calls)
			view.mu.Lock()
			fmt.Fprintf(c.stdout, "waiting for the decision (Ctrl-C stops waiting; the workflow goes on waiting)...\n")
			view.mu.Unlock()
		}
		waiting.Store(true)
		e := awaitEnd(nil)
		if e.err != nil {
			if ctx.Err() != nil {
				e.err = status.FromContextError(ctx.Err()).Err()
			}
			return fail(e.err)
		}
		wf := e.wf
		switch wf.GetStatus() {
		case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
			err := status.Error(codes.Code(uint32(wf.GetFailure().GetCode())), wf.GetFailure().GetMessage())
			if wf.GetFailure() == nil {
				err = status.Errorf(codes.Canceled, "workflow %s %s", id, statusName(wf.GetStatus()))
			}
			return fail(err)
		}
		view.mu.Lock()
		effects := append([]*orchestratorv1.EffectOutcome(nil), view.effects...)
		view.mu.Unlock()
		resp = &orchestratorv1.DispatchResponse{WorkflowId: id, Output: wf.GetLastOutput(), TotalCost: wf.GetSpent(), Effects: effects}
		if resp.TotalCost == nil {
			resp.TotalCost = &typesv1.Money{}
		}
	} else {
		awaitEnd(time.After(drainWait))
	}
	view.finish()
	switch {
	case js != nil:
		(&jsonProgress{w: c.stdout}).done(resp)
	case f.quiet:
		(&textProgress{w: c.stdout, quiet: true}).done(resp)
	default:
		view.mu.Lock()
		printResult(c.stdout, req.GetAgentId(), resp, view.kinds)
		view.mu.Unlock()
	}
	if k := resp.GetOutput().GetExitReason().GetKind(); k != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		return true, &exitError{code: exitNotCompleted, msg: fmt.Sprintf("workflow %s ended without completing: exit %s", resp.GetWorkflowId(), strings.TrimPrefix(k.String(), "EXIT_KIND_"))}
	}
	return true, nil
}
