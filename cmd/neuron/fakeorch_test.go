package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
)

// fakeOrch is an in-memory OrchestratorService with the streaming and
// approval RPCs of the contract. A workflow's behaviour depends on its
// message: "approve" asks approval for a write call first, "slow" waits
// after its first words until canceled, "tool" calls a tool; every one
// answers "Hello, world" in four text deltas.
//
// With lockstep, a workflow goes on to its next event only once a watch
// stream is open and has sent everything so far: what a watch shows does
// not depend on timing.
type fakeOrch struct {
	orchestratorv1.UnimplementedOrchestratorServiceServer
	lockstep bool
	// breakAfter > 0: a workflow's first watch stream fails UNAVAILABLE
	// after sending that many messages.
	breakAfter int

	mu        sync.Mutex
	cond      *sync.Cond
	wfs       map[string]*fakeWF
	order     []string
	watches   int
	decisions map[string][]*operatorv1.ToolDecision
	cancels   []string
	starts    []*orchestratorv1.StartWorkflowRequest
}

// fakeWF is one workflow of fakeOrch.
type fakeWF struct {
	wf       *orchestratorv1.Workflow
	log      []*lifecyclev1.LifecycleEvent
	call     int // the running operator call (0: none)
	progress []*orchestratorv1.StepProgress
	ended    bool
	streams  map[*fakeStream]bool
	opened   int
	// broke: the first stream was broken and no other opened since.
	broke   bool
	decided []*operatorv1.ToolDecision
	cancel  bool
}

// fakeStream is one open WatchWorkflow stream: what it sent.
type fakeStream struct {
	log, prog, call, sent int
}

func newFakeOrch() *fakeOrch {
	f := &fakeOrch{wfs: map[string]*fakeWF{}, decisions: map[string][]*operatorv1.ToolDecision{}}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// serveOrch serves f on a loopback port and returns its address.
func serveOrch(t *testing.T, f *fakeOrch) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	orchestratorv1.RegisterOrchestratorServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// caughtUp reports whether a stream is open and every open one sent all
// of w; callers hold f.mu.
func (w *fakeWF) caughtUp() bool {
	if len(w.streams) == 0 {
		return false
	}
	for s := range w.streams {
		if s.log < len(w.log) || s.call != w.call || s.prog < len(w.progress) {
			return false
		}
	}
	return true
}

// emit adds a durable event; callers hold f.mu.
func (f *fakeOrch) emit(w *fakeWF, typ string, data map[string]any) {
	v, err := structpb.NewValue(data)
	if err != nil {
		panic(err)
	}
	w.log = append(w.log, &lifecyclev1.LifecycleEvent{
		WorkflowId: w.wf.GetWorkflowId(), AgentId: w.wf.GetRootAgentId(), WorkflowSequence: uint64(len(w.log) + 1),
		Event: &lifecyclev1.LifecycleEvent_Observable{Observable: &lifecyclev1.ObservableEvent{EventType: typ, Data: v}},
	})
	f.step(w)
}

// progressEv adds a progress event of the running call; callers hold f.mu.
func (f *fakeOrch) progressEv(w *fakeWF, ev *operatorv1.ExecuteStreamResponse) {
	w.progress = append(w.progress, &orchestratorv1.StepProgress{
		Step: uint64(w.call), DispatchId: fmt.Sprintf("%s#%d", w.wf.GetWorkflowId(), w.call),
		AgentId: w.wf.GetRootAgentId(), Index: uint64(len(w.progress) + 1), Event: ev,
	})
	f.step(w)
}

// step wakes the streams and, in lockstep, waits for them; callers hold
// f.mu.
func (f *fakeOrch) step(w *fakeWF) {
	f.cond.Broadcast()
	for f.lockstep && !w.cancel && !w.caughtUp() && (len(w.streams) > 0 || w.opened == 0 || w.broke) {
		f.cond.Wait()
	}
}

func text(s string) *operatorv1.ExecuteStreamResponse {
	return &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{TextDelta: &operatorv1.TextDelta{Turn: 1, Text: s}}}
}

// writeInput is the input of the fake's write call.
var writeInput = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"path": structpb.NewStringValue("notes.txt")}})

// run plays workflow w to its end.
func (f *fakeOrch) run(w *fakeWF, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := w.wf.GetWorkflowId()
	f.emit(w, "orchestrator.workflow.started", map[string]any{"agent_id": w.wf.GetRootAgentId()})
	w.call = 1
	w.progress = nil
	approved := ""
	if strings.Contains(msg, "approve") {
		f.progressEv(w, text("I will write it."))
		tc := &operatorv1.PendingToolCall{ToolUseId: "toolu_1", Name: "write", Input: writeInput, Reason: "policy", Turn: 1}
		w.wf.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED
		w.wf.Steps = 1
		w.wf.LastOutput = &operatorv1.OperatorOutput{ExitReason: &operatorv1.ExitReason{
			Kind: operatorv1.ExitKind_EXIT_KIND_SUSPENDED, Suspension: &operatorv1.Suspension{ToolCalls: []*operatorv1.PendingToolCall{tc}},
		}}
		w.wf.PendingApprovals = []*orchestratorv1.PendingApproval{{WorkflowId: id, AgentId: w.wf.GetRootAgentId(), Step: 1, ToolCall: tc}}
		f.emit(w, eventDispatchDone, map[string]any{"dispatch_id": id + "#1", "exit": "EXIT_KIND_SUSPENDED", "cost": "0", "duration_ms": 1.0, "effects": 0.0})
		w.call, w.progress = 0, nil
		f.emit(w, eventSuspended, map[string]any{"steps": 1.0, "spent": "0", "exit": "EXIT_KIND_SUSPENDED",
			"approvals": []any{map[string]any{"tool_use_id": "toolu_1", "name": "write", "input": map[string]any{"path": "notes.txt"}, "reason": "policy"}}})
		for w.decided == nil && !w.cancel {
			f.cond.Wait()
		}
		if w.cancel {
			f.end(w, nil)
			return
		}
		f.emit(w, eventSignalAccepted, map[string]any{"sequence": float64(len(w.log) + 1), "signal_type": "approval"})
		w.wf.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING
		w.wf.PendingApprovals = nil
		w.call = 2
		d := w.decided[0]
		if d.GetApproved() {
			in := d.GetEditedInput()
			if in == nil {
				in = writeInput
			}
			f.progressEv(w, &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallStarted{ToolCallStarted: &operatorv1.ToolCallStarted{ToolUseId: "toolu_1", Name: "write", Input: in}}})
			f.progressEv(w, &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallFinished{ToolCallFinished: &operatorv1.ToolCallFinished{ToolUseId: "toolu_1", Name: "write", Result: "wrote 5 bytes"}}})
			approved = "approved "
		} else {
			approved = "rejected (" + d.GetReason() + ") "
		}
	} else if strings.Contains(msg, "tool") {
		f.progressEv(w, &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallStarted{ToolCallStarted: &operatorv1.ToolCallStarted{ToolUseId: "toolu_9", Name: "read", Input: writeInput}}})
		f.progressEv(w, &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallFinished{ToolCallFinished: &operatorv1.ToolCallFinished{ToolUseId: "toolu_9", Name: "read", Result: "line one\nline two"}}})
	}
	answer := approved + "Hello, world"
	parts := []string{approved + "Hel", "lo", ", wor", "ld"}
	for i, p := range parts {
		f.progressEv(w, text(p))
		if i == 0 && strings.Contains(msg, "slow") {
			for !w.cancel {
				f.cond.Wait()
			}
			f.end(w, nil)
			return
		}
	}
	out := &operatorv1.OperatorOutput{Message: content.Text(answer), ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE}}
	f.emit(w, eventDispatchDone, map[string]any{"dispatch_id": fmt.Sprintf("%s#%d", id, w.call), "exit": "EXIT_KIND_COMPLETE", "cost": "0.01", "duration_ms": 3.0, "effects": 0.0})
	f.end(w, out)
}

// end finishes w: COMPLETED with out, or CANCELED when out is nil;
// callers hold f.mu.
func (f *fakeOrch) end(w *fakeWF, out *operatorv1.OperatorOutput) {
	w.call, w.progress = 0, nil
	w.wf.Spent = &typesv1.Money{Amount: "0.01"}
	w.wf.PendingApprovals = nil
	if out == nil {
		w.wf.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
		w.wf.Failure = &typesv1.Status{Code: int32(codes.Canceled), Message: "canceled: canceled in neuron chat (Ctrl-C)"}
		f.emit(w, "orchestrator.workflow.canceled", map[string]any{"code": float64(codes.Canceled), "message": "canceled"})
	} else {
		w.wf.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED
		w.wf.LastOutput = out
		w.wf.Steps++
		f.emit(w, "orchestrator.workflow.completed", map[string]any{"steps": float64(w.wf.GetSteps()), "spent": "0.01", "exit": "EXIT_KIND_COMPLETE"})
	}
	w.ended = true
	f.cond.Broadcast()
}

// start creates and runs a workflow (or finds it).
func (f *fakeOrch) start(id, agent string, in *operatorv1.OperatorInput) (*fakeWF, error) {
	if agent == "nobody" {
		return nil, status.Errorf(codes.NotFound, "agent %q is not defined", agent)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if w, ok := f.wfs[id]; ok {
		return w, nil
	}
	w := &fakeWF{streams: map[*fakeStream]bool{}, wf: &orchestratorv1.Workflow{
		WorkflowId: id, Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING, RootAgentId: agent, CurrentAgentId: agent,
	}}
	f.wfs[id] = w
	f.order = append(f.order, id)
	go f.run(w, content.TextOf(in.GetMessage()))
	return w, nil
}

func (f *fakeOrch) Dispatch(ctx context.Context, req *orchestratorv1.DispatchRequest) (*orchestratorv1.DispatchResponse, error) {
	w, err := f.start(req.GetWorkflowId(), req.GetAgentId(), req.GetInput())
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		w.cancel = true
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	defer stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	for !w.ended && w.wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED && ctx.Err() == nil {
		f.cond.Wait()
	}
	if ctx.Err() != nil {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &orchestratorv1.DispatchResponse{WorkflowId: w.wf.GetWorkflowId(), Output: w.wf.GetLastOutput(), TotalCost: w.wf.GetSpent()}, nil
}

func (f *fakeOrch) StartWorkflow(_ context.Context, req *orchestratorv1.StartWorkflowRequest) (*orchestratorv1.StartWorkflowResponse, error) {
	f.mu.Lock()
	f.starts = append(f.starts, proto.Clone(req).(*orchestratorv1.StartWorkflowRequest))
	f.mu.Unlock()
	if _, err := f.start(req.GetWorkflowId(), req.GetAgentId(), req.GetInput()); err != nil {
		return nil, err
	}
	return &orchestratorv1.StartWorkflowResponse{WorkflowId: req.GetWorkflowId()}, nil
}

func (f *fakeOrch) GetWorkflow(_ context.Context, req *orchestratorv1.GetWorkflowRequest) (*orchestratorv1.GetWorkflowResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.wfs[req.GetWorkflowId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "workflow %q not found", req.GetWorkflowId())
	}
	return &orchestratorv1.GetWorkflowResponse{Workflow: proto.Clone(w.wf).(*orchestratorv1.Workflow)}, nil
}

func (f *fakeOrch) CancelWorkflow(_ context.Context, req *orchestratorv1.CancelWorkflowRequest) (*orchestratorv1.CancelWorkflowResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.wfs[req.GetWorkflowId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "workflow %q not found", req.GetWorkflowId())
	}
	f.cancels = append(f.cancels, req.GetWorkflowId())
	w.cancel = true
	f.cond.Broadcast()
	return &orchestratorv1.CancelWorkflowResponse{Workflow: proto.Clone(w.wf).(*orchestratorv1.Workflow)}, nil
}

func (f *fakeOrch) ListApprovals(_ context.Context, req *orchestratorv1.ListApprovalsRequest) (*orchestratorv1.ListApprovalsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &orchestratorv1.ListApprovalsResponse{}
	for _, id := range f.order {
		if req.GetWorkflowId() == "" || req.GetWorkflowId() == id {
			resp.Approvals = append(resp.Approvals, f.wfs[id].wf.GetPendingApprovals()...)
		}
	}
	return resp, nil
}

func (f *fakeOrch) DecideApprovals(_ context.Context, req *orchestratorv1.DecideApprovalsRequest) (*orchestratorv1.DecideApprovalsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.wfs[req.GetWorkflowId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "workflow %q not found", req.GetWorkflowId())
	}
	if w.decided != nil {
		return &orchestratorv1.DecideApprovalsResponse{Sequence: 7, Duplicate: true}, nil
	}
	if len(w.wf.GetPendingApprovals()) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "workflow %q does not wait for approval", req.GetWorkflowId())
	}
	f.decisions[req.GetWorkflowId()] = req.GetDecisions()
	w.decided = req.GetDecisions()
	f.cond.Broadcast()
	return &orchestratorv1.DecideApprovalsResponse{Sequence: uint64(len(w.log) + 1)}, nil
}

// WatchWorkflow sends the durable events after after_sequence, the
// running call's progress from its start, and the workflow at its end.
func (f *fakeOrch) WatchWorkflow(req *orchestratorv1.WatchWorkflowRequest, stream orchestratorv1.OrchestratorService_WatchWorkflowServer) error {
	ctx := stream.Context()
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	defer stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watches++
	w, ok := f.wfs[req.GetWorkflowId()]
	if !ok {
		return status.Errorf(codes.NotFound, "workflow %q not found", req.GetWorkflowId())
	}
	w.opened++
	w.broke = false
	s := &fakeStream{log: int(min(req.GetAfterSequence(), uint64(len(w.log)))), call: -1}
	breaks := w.opened == 1 && f.breakAfter > 0
	w.streams[s] = true
	defer func() {
		delete(w.streams, s)
		f.cond.Broadcast()
	}()
	send := func(r *orchestratorv1.WatchWorkflowResponse) error {
		if breaks && s.sent == f.breakAfter {
			w.broke = true
			return status.Error(codes.Unavailable, "the fake breaks the stream")
		}
		s.sent++
		return stream.Send(r)
	}
	for {
		for s.log < len(w.log) {
			if err := send(&orchestratorv1.WatchWorkflowResponse{Kind: &orchestratorv1.WatchWorkflowResponse_Event{Event: w.log[s.log]}}); err != nil {
				return err
			}
			s.log++
		}
		if s.call != w.call {
			s.call, s.prog = w.call, 0
		}
		for !req.GetOmitProgress() && s.prog < len(w.progress) {
			if err := send(&orchestratorv1.WatchWorkflowResponse{Kind: &orchestratorv1.WatchWorkflowResponse_Progress{Progress: w.progress[s.prog]}}); err != nil {
				return err
			}
			s.prog++
		}
		if req.GetOmitProgress() {
			s.prog = len(w.progress)
		}
		if w.ended {
			return send(&orchestratorv1.WatchWorkflowResponse{Kind: &orchestratorv1.WatchWorkflowResponse_End{End: proto.Clone(w.wf).(*orchestratorv1.Workflow)}})
		}
		f.cond.Broadcast()
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		f.cond.Wait()
	}
}

// Query answers "steps" with no steps.
func (f *fakeOrch) Query(_ context.Context, req *orchestratorv1.QueryRequest) (*orchestratorv1.QueryResponse, error) {
	return &orchestratorv1.QueryResponse{Result: structpb.NewListValue(&structpb.ListValue{})}, nil
}

// addEnded adds a completed workflow that runs nothing.
func (f *fakeOrch) addEnded(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wfs[id] = &fakeWF{ended: true, streams: map[*fakeStream]bool{}, wf: &orchestratorv1.Workflow{
		WorkflowId: id, Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED, RootAgentId: "assistant", Steps: 3,
		LastOutput: &operatorv1.OperatorOutput{Message: content.Text("the end"), ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE}},
	}}
	f.order = append(f.order, id)
}

// GetTranscript pages through a fixed transcript of three steps, one of
// a delegated agent, two steps a page.
func (f *fakeOrch) GetTranscript(_ context.Context, req *orchestratorv1.GetTranscriptRequest) (*orchestratorv1.GetTranscriptResponse, error) {
	if req.GetWorkflowId() != "wf-t" {
		return nil, status.Errorf(codes.NotFound, "no transcript for workflow %q", req.GetWorkflowId())
	}
	steps := []*orchestratorv1.TranscriptStep{
		{Step: 1, DispatchId: "wf-t#1", AgentId: "assistant", Input: &operatorv1.OperatorInput{Message: content.Text("what is layer0?"), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER},
			ToolCalls: []*orchestratorv1.TranscriptToolCall{{ToolUseId: "toolu_a", Name: "read", Input: writeInput, Result: strings.Repeat("row\n", 30), ResultBytes: 120}},
			Output:    &operatorv1.OperatorOutput{Message: content.Text("asking the researcher"), ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE}}},
		{Step: 2, DispatchId: "wf-t#2", AgentId: "researcher", Depth: 1, ParentDispatchId: "wf-t#1",
			Input:  &operatorv1.OperatorInput{Message: content.Text("find out"), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK},
			Output: &operatorv1.OperatorOutput{Message: content.Text("the researcher's answer"), ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE}}},
		{Step: 3, DispatchId: "wf-t#3", AgentId: "assistant", Input: &operatorv1.OperatorInput{Message: content.Text("the child answered"), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL},
			Error: &typesv1.Status{Code: int32(codes.Unavailable), Message: "the model is down"}},
	}
	from := 0
	if req.GetPageToken() == "p2" {
		from = 2
	} else if req.GetPageToken() != "" {
		return nil, status.Error(codes.InvalidArgument, "bad page token")
	}
	to := min(from+2, len(steps))
	resp := &orchestratorv1.GetTranscriptResponse{Steps: steps[from:to]}
	if to < len(steps) {
		resp.NextPageToken = "p2"
	}
	return resp, nil
}
