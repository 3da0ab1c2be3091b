package orchestrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/orchestrator"
)

// streamBehaviour answers one streamed operator call: it may send
// progress with emit before returning the output.
type streamBehaviour func(ctx context.Context, in *operatorv1.OperatorInput, emit func(*operatorv1.ExecuteStreamResponse)) (*operatorv1.OperatorOutput, error)

// streamingFake is an OperatorService that streams: its answers are
// chosen per agent; every input is recorded.
type streamingFake struct {
	operatorv1.UnimplementedOperatorServiceServer
	mu     sync.Mutex
	agents map[string]streamBehaviour
	calls  []*operatorv1.OperatorInput
}

func startStreamingFake(t *testing.T, agents map[string]streamBehaviour) (*streamingFake, string) {
	f := &streamingFake{agents: agents}
	addr := harness.ServeFake(t, "test", func(s *grpcserver.Server) { operatorv1.RegisterOperatorServiceServer(s, f) })
	return f, addr
}

func (f *streamingFake) behaviour(in *operatorv1.OperatorInput) (streamBehaviour, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, proto.CloneOf(in))
	b := f.agents[in.GetDispatch().GetAgentId()]
	if b == nil {
		return nil, fmt.Errorf("fake operator: no behaviour for agent %q", in.GetDispatch().GetAgentId())
	}
	return b, nil
}

func (f *streamingFake) Execute(ctx context.Context, req *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	b, err := f.behaviour(req.GetInput())
	if err != nil {
		return nil, err
	}
	out, err := b(ctx, req.GetInput(), func(*operatorv1.ExecuteStreamResponse) {})
	if err != nil {
		return nil, err
	}
	return &operatorv1.ExecuteResponse{Output: out}, nil
}

func (f *streamingFake) ExecuteStream(req *operatorv1.ExecuteStreamRequest, stream grpc.ServerStreamingServer[operatorv1.ExecuteStreamResponse]) error {
	b, err := f.behaviour(req.GetInput())
	if err != nil {
		return err
	}
	out, err := b(stream.Context(), req.GetInput(), func(ev *operatorv1.ExecuteStreamResponse) { _ = stream.Send(ev) })
	if err != nil {
		return err
	}
	return stream.Send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: out}})
}

func (f *streamingFake) inputs(agent string) []*operatorv1.OperatorInput {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*operatorv1.OperatorInput
	for _, in := range f.calls {
		if in.GetDispatch().GetAgentId() == agent {
			out = append(out, in)
		}
	}
	return out
}

func delta(text string) *operatorv1.ExecuteStreamResponse {
	return &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{TextDelta: &operatorv1.TextDelta{Turn: 1, Text: text}}}
}

func toolStarted(id, name string, input map[string]any) *operatorv1.ExecuteStreamResponse {
	v, _ := structpb.NewValue(input)
	return &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallStarted{
		ToolCallStarted: &operatorv1.ToolCallStarted{Turn: 1, ToolUseId: id, Name: name, Input: v}}}
}

func toolFinished(id, name, result string) *operatorv1.ExecuteStreamResponse {
	return &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallFinished{
		ToolCallFinished: &operatorv1.ToolCallFinished{Turn: 1, ToolUseId: id, Name: name, Result: result, Duration: durationpb.New(time.Millisecond)}}}
}

// suspendFor is an output that stops for approval of calls.
func suspendFor(in *operatorv1.OperatorInput, token string, calls ...*operatorv1.PendingToolCall) *operatorv1.OperatorOutput {
	out := done(in, "", "0.01")
	out.ExitReason = &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_SUSPENDED, Suspension: &operatorv1.Suspension{
		ResumeToken: token, Prompt: "approve?", ToolCalls: calls}}
	return out
}

func pendingCall(id, name string, input map[string]any) *operatorv1.PendingToolCall {
	v, _ := structpb.NewValue(input)
	return &operatorv1.PendingToolCall{ToolUseId: id, Name: name, Input: v, Reason: "policy", Turn: 1}
}

func wantCode(t *testing.T, err error, code codes.Code, substr string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), substr) {
		t.Fatalf("got %v, want %v containing %q", err, code, substr)
	}
}

// approvalAgent suspends on its first call for two tool calls and, once
// resumed, answers with what it was told.
func approvalAgent(in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	r := in.GetResume()
	if r == nil {
		return suspendFor(in, "tok-"+in.GetDispatch().GetDispatchId(),
			pendingCall("call-1", "write_file", map[string]any{"path": "a.txt"}),
			pendingCall("call-2", "shell", map[string]any{"cmd": "rm -rf /"})), nil
	}
	var parts []string
	for _, d := range r.GetToolDecisions() {
		parts = append(parts, fmt.Sprintf("%s:%v:%s:%s", d.GetToolUseId(), d.GetApproved(), jsonOfValue(d.GetEditedInput()), d.GetDecidedBy()))
	}
	return done(in, "decided "+strings.Join(parts, " "), "0.01"), nil
}

func jsonOfValue(v *structpb.Value) string {
	if v == nil {
		return "-"
	}
	b, _ := json.Marshal(v.AsInterface()) // protojson's spacing varies
	return string(b)
}

func TestApprovals(t *testing.T) { backends(t, testApprovals) }

func testApprovals(t *testing.T, startOrch starter) {
	stateAddr, _, _ := startState(t)
	f, opAddr := startStreamingFake(t, map[string]streamBehaviour{
		"careful": func(_ context.Context, in *operatorv1.OperatorInput, _ func(*operatorv1.ExecuteStreamResponse)) (*operatorv1.OperatorOutput, error) {
			return approvalAgent(in)
		},
	})
	o := startOrch(t, registryYAML(t, agentsAt(opAddr, "careful")...), stateAddr, orchOptions{})
	ctx := ctxT(t)
	start := must[*orchestratorv1.StartWorkflowResponse](t)(o.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{
		AgentId: "careful", Input: &operatorv1.OperatorInput{Message: content.Text("tidy up")}}))
	id := start.GetWorkflowId()
	wf := waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED)
	if got := len(wf.GetPendingApprovals()); got != 2 {
		t.Fatalf("pending approvals = %d, want 2: %v", got, wf.GetPendingApprovals())
	}
	p := wf.GetPendingApprovals()[1]
	if p.GetAgentId() != "careful" || p.GetToolCall().GetName() != "shell" || jsonOfValue(p.GetToolCall().GetInput()) != `{"cmd":"rm -rf /"}` ||
		p.GetRequestTime() == nil || p.GetDeadline() != nil {
		t.Fatalf("pending approval = %v", p)
	}
	// The suspended event lists the calls, with their (small) inputs.
	stream, err := o.client.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, OmitProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("the watch ended before the suspended event: %v", err)
		}
		if ev := resp.GetEvent().GetObservable(); ev.GetEventType() == "orchestrator.workflow.suspended" {
			if got := jsonOfValue(ev.GetData().GetStructValue().GetFields()["approvals"]); got != `[{"input":{"path":"a.txt"},"name":"write_file","reason":"policy","tool_use_id":"call-1"},{"input":{"cmd":"rm -rf /"},"name":"shell","reason":"policy","tool_use_id":"call-2"}]` {
				t.Fatalf("the suspended event's approvals = %s", got)
			}
			break
		}
	}
	// Listings may trail the workflow (Temporal's visibility store).
	var list *orchestratorv1.ListApprovalsResponse
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		list = must[*orchestratorv1.ListApprovalsResponse](t)(o.client.ListApprovals(ctx, &orchestratorv1.ListApprovalsRequest{}))
		if len(list.GetApprovals()) == 2 || time.Now().After(deadline) {
			break
		}
	}
	if len(list.GetApprovals()) != 2 || list.GetApprovals()[0].GetWorkflowId() != id {
		t.Fatalf("ListApprovals = %v", list.GetApprovals())
	}
	page := must[*orchestratorv1.ListApprovalsResponse](t)(o.client.ListApprovals(ctx, &orchestratorv1.ListApprovalsRequest{PageSize: 1}))
	if len(page.GetApprovals()) != 1 || page.GetNextPageToken() == "" {
		t.Fatalf("page of 1 = %v, next %q", page.GetApprovals(), page.GetNextPageToken())
	}
	_, err = o.client.ListApprovals(ctx, &orchestratorv1.ListApprovalsRequest{PageToken: "bogus"})
	wantCode(t, err, codes.InvalidArgument, "page_token")

	edited, _ := structpb.NewValue(map[string]any{"path": "b.txt"})
	approve1 := &operatorv1.ToolDecision{ToolUseId: "call-1", Approved: true, EditedInput: edited, DecidedBy: "alice"}
	reject2 := &operatorv1.ToolDecision{ToolUseId: "call-2", Reason: "no", DecidedBy: "alice"}
	decide := func(ds ...*operatorv1.ToolDecision) (*orchestratorv1.DecideApprovalsResponse, error) {
		return o.client.DecideApprovals(ctx, &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: ds})
	}
	_, err = decide(approve1)
	wantCode(t, err, codes.InvalidArgument, "undecided: call-2 (shell)")
	_, err = decide(approve1, reject2, &operatorv1.ToolDecision{ToolUseId: "call-9", Approved: true})
	wantCode(t, err, codes.InvalidArgument, `"call-9" is not a call this workflow waits on`)
	_, err = decide(approve1, approve1, reject2)
	wantCode(t, err, codes.InvalidArgument, "decided twice")
	_, err = decide(approve1, &operatorv1.ToolDecision{ToolUseId: "call-2", EditedInput: edited})
	wantCode(t, err, codes.InvalidArgument, "edited_input is for an approval")
	_, err = o.client.DecideApprovals(ctx, &orchestratorv1.DecideApprovalsRequest{WorkflowId: "wf-nope", Decisions: []*operatorv1.ToolDecision{approve1}})
	wantCode(t, err, codes.NotFound, "")

	first := must[*orchestratorv1.DecideApprovalsResponse](t)(decide(approve1, reject2))
	if first.GetDuplicate() {
		t.Fatal("the first decision was answered duplicate")
	}
	again := must[*orchestratorv1.DecideApprovalsResponse](t)(decide(approve1, reject2))
	if !again.GetDuplicate() || again.GetSequence() != first.GetSequence() {
		t.Fatalf("a retried decision = %v, want duplicate of %d", again, first.GetSequence())
	}
	_, err = decide(&operatorv1.ToolDecision{ToolUseId: "call-1"}, reject2)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a different decision afterwards: %v, want FAILED_PRECONDITION", err)
	}
	wf = waitStatus(t, o, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	want := `decided call-1:true:{"path":"b.txt"}:alice call-2:false:-:alice`
	if got := content.TextOf(wf.GetLastOutput().GetMessage()); got != want {
		t.Fatalf("the resumed operator answered %q, want %q", got, want)
	}
	// The decision is in the log as an accepted signal of type approval.
	all, err := o.client.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, OmitProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	var accepted string
	for {
		resp, err := all.Recv()
		if err != nil {
			break
		}
		if ev := resp.GetEvent().GetObservable(); ev.GetEventType() == "orchestrator.signal.accepted" {
			accepted = jsonOfValue(ev.GetData())
		}
	}
	if want := fmt.Sprintf(`{"sequence":%d,"signal_type":"approval"}`, first.GetSequence()); accepted != want {
		t.Fatalf("the signal.accepted event = %s, want %s", accepted, want)
	}
	ins := f.inputs("careful")
	if len(ins) != 2 || ins[1].GetResume().GetResumeToken() != "tok-"+ins[0].GetDispatch().GetDispatchId() {
		t.Fatalf("inputs = %v", ins)
	}
	if got := content.TextOf(ins[1].GetMessage()); !strings.HasPrefix(got, "[signal approval #") || !strings.HasSuffix(got, "] 2 tool call(s) decided") {
		t.Fatalf("the resuming input's message = %q, want a line saying the calls were decided (not their JSON)", got)
	}
	_, err = decide(approve1, reject2)
	if err != nil { // still a retry of the decision taken
		t.Fatalf("a retry after the workflow ended: %v", err)
	}
}

func TestApprovalTimeout(t *testing.T) { backends(t, testApprovalTimeout) }

func testApprovalTimeout(t *testing.T, startOrch starter) {
	stateAddr, _, _ := startState(t)
	_, opAddr := startStreamingFake(t, map[string]streamBehaviour{
		"careful": func(_ context.Context, in *operatorv1.OperatorInput, _ func(*operatorv1.ExecuteStreamResponse)) (*operatorv1.OperatorOutput, error) {
			return approvalAgent(in)
		},
	})
	o := startOrch(t, registryYAML(t, agentsAt(opAddr, "careful")...), stateAddr, orchOptions{approvalTimeout: 300 * time.Millisecond})
	ctx := ctxT(t)
	start := must[*orchestratorv1.StartWorkflowResponse](t)(o.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{
		AgentId: "careful", Input: &operatorv1.OperatorInput{Message: content.Text("tidy up")}}))
	wf := waitStatus(t, o, start.GetWorkflowId(), orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	want := "decided call-1:false:-:timeout call-2:false:-:timeout"
	if got := content.TextOf(wf.GetLastOutput().GetMessage()); got != want {
		t.Fatalf("after the timeout the operator answered %q, want %q", got, want)
	}
}

// watchAll reads a WatchWorkflow stream to its end.
func watchAll(t *testing.T, c orchestratorv1.OrchestratorServiceClient, req *orchestratorv1.WatchWorkflowRequest, onProgress func(*orchestratorv1.StepProgress)) (events []uint64, types []string, end *orchestratorv1.Workflow) {
	t.Helper()
	stream, err := c.WatchWorkflow(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return events, types, end
		}
		if err != nil {
			t.Fatal(err)
		}
		switch k := resp.GetKind().(type) {
		case *orchestratorv1.WatchWorkflowResponse_Event:
			events = append(events, k.Event.GetWorkflowSequence())
			types = append(types, k.Event.GetObservable().GetEventType())
		case *orchestratorv1.WatchWorkflowResponse_Progress:
			if onProgress != nil {
				onProgress(k.Progress)
			}
		case *orchestratorv1.WatchWorkflowResponse_End:
			if end != nil {
				t.Fatal("two ends")
			}
			end = k.End
		}
	}
}

func TestWatchWorkflow(t *testing.T) { backends(t, testWatchWorkflow) }

func testWatchWorkflow(t *testing.T, startOrch starter) {
	stateAddr, _, _ := startState(t)
	release := make(chan struct{})
	_, opAddr := startStreamingFake(t, map[string]streamBehaviour{
		"talker": func(ctx context.Context, in *operatorv1.OperatorInput, emit func(*operatorv1.ExecuteStreamResponse)) (*operatorv1.OperatorOutput, error) {
			emit(delta("Hel"))
			emit(delta("lo"))
			emit(toolStarted("t1", "search", map[string]any{"q": "layer0"}))
			emit(toolFinished("t1", "search", "found it"))
			select { // the call stays in flight until the test has seen its progress
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return done(in, "Hello", "0.02"), nil
		},
	})
	o := startOrch(t, registryYAML(t, agentsAt(opAddr, "talker")...), stateAddr, orchOptions{})
	ctx := ctxT(t)
	_, err := o.client.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{WorkflowId: "wf-unknown"})
	if err == nil {
		stream, _ := o.client.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{WorkflowId: "wf-unknown"})
		_, err = stream.Recv()
	}
	wantCode(t, err, codes.NotFound, "")

	start := must[*orchestratorv1.StartWorkflowResponse](t)(o.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{
		AgentId: "talker", Input: &operatorv1.OperatorInput{Message: content.Text("hi")}}))
	id := start.GetWorkflowId()
	var (
		mu   sync.Mutex
		seen []string
	)
	var once sync.Once
	events, types, end := watchAll(t, o.client, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id}, func(p *orchestratorv1.StepProgress) {
		mu.Lock()
		defer mu.Unlock()
		if p.GetStep() != 1 || p.GetAgentId() != "talker" || p.GetIndex() != uint64(len(seen)+1) {
			t.Errorf("progress %v after %d", p, len(seen))
		}
		switch e := p.GetEvent().GetEvent().(type) {
		case *operatorv1.ExecuteStreamResponse_TextDelta:
			seen = append(seen, "text:"+e.TextDelta.GetText())
		case *operatorv1.ExecuteStreamResponse_ToolCallStarted:
			seen = append(seen, "start:"+e.ToolCallStarted.GetName())
		case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
			seen = append(seen, "finish:"+e.ToolCallFinished.GetResult())
		}
		if len(seen) == 4 {
			once.Do(func() { close(release) }) // seen live, while the call ran
		}
	})
	if want := []string{"text:Hel", "text:lo", "start:search", "finish:found it"}; !slices.Equal(seen, want) {
		t.Fatalf("progress = %v, want %v", seen, want)
	}
	if end.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || end.GetWorkflowId() != id {
		t.Fatalf("end = %v", end)
	}
	if !slices.Contains(types, "orchestrator.workflow.completed") || !slices.Contains(types, "orchestrator.dispatch.completed") {
		t.Fatalf("event types = %v", types)
	}
	for i := 1; i < len(events); i++ {
		if events[i] != events[i-1]+1 {
			t.Fatalf("event sequences not contiguous: %v", events)
		}
	}
	// A client that reconnects after an event gets exactly the rest.
	mid := events[len(events)/2]
	rest, _, end2 := watchAll(t, o.client, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, AfterSequence: mid}, nil)
	if want := events[len(events)/2+1:]; !slices.Equal(rest, want) {
		t.Fatalf("after %d: %v, want %v", mid, rest, want)
	}
	if end2.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Fatalf("end after reconnect = %v", end2)
	}
}

func TestTranscript(t *testing.T) { backends(t, testTranscript) }

func testTranscript(t *testing.T, startOrch starter) {
	stateAddr, _, _ := startState(t)
	_, opAddr := startStreamingFake(t, map[string]streamBehaviour{
		"boss": func(_ context.Context, in *operatorv1.OperatorInput, emit func(*operatorv1.ExecuteStreamResponse)) (*operatorv1.OperatorOutput, error) {
			if _, ok := in.GetMetadata().GetFields()["delegations"]; ok {
				return done(in, "all done", "0.01"), nil
			}
			emit(toolStarted("t1", "lookup", map[string]any{"k": "v"}))
			emit(toolFinished("t1", "lookup", strings.Repeat("r", orchestrator.MaxToolResult+10)))
			return done(in, "delegating", "0.01", delegateTo("worker", "do the work")(in)), nil
		},
		"worker": func(_ context.Context, in *operatorv1.OperatorInput, _ func(*operatorv1.ExecuteStreamResponse)) (*operatorv1.OperatorOutput, error) {
			return done(in, "the work is done", "0.01"), nil
		},
	})
	o := startOrch(t, registryYAML(t, agentsAt(opAddr, "boss", "worker")...), stateAddr, orchOptions{})
	ctx := ctxT(t)
	resp := must[*orchestratorv1.DispatchResponse](t)(o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{
		AgentId: "boss", Input: &operatorv1.OperatorInput{Message: content.Text("go")}}))
	id := resp.GetWorkflowId()
	var steps []*orchestratorv1.TranscriptStep
	token := ""
	for {
		page := must[*orchestratorv1.GetTranscriptResponse](t)(o.client.GetTranscript(ctx, &orchestratorv1.GetTranscriptRequest{WorkflowId: id, PageSize: 1, PageToken: token}))
		steps = append(steps, page.GetSteps()...)
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(steps) != 3 {
		t.Fatalf("transcript has %d steps, want 3: %v", len(steps), steps)
	}
	boss, worker, last := steps[0], steps[1], steps[2]
	if boss.GetStep() != 1 || boss.GetAgentId() != "boss" || content.TextOf(boss.GetInput().GetMessage()) != "go" ||
		content.TextOf(boss.GetOutput().GetMessage()) != "delegating" || boss.GetStartTime() == nil || boss.GetEndTime() == nil {
		t.Fatalf("step 1 = %v", boss)
	}
	if len(boss.GetToolCalls()) != 1 {
		t.Fatalf("step 1 tool calls = %v", boss.GetToolCalls())
	}
	tc := boss.GetToolCalls()[0]
	if tc.GetName() != "lookup" || jsonOfValue(tc.GetInput()) != `{"k":"v"}` || !tc.GetTruncated() ||
		len(tc.GetResult()) != orchestrator.MaxToolResult || tc.GetResultBytes() != orchestrator.MaxToolResult+10 {
		t.Fatalf("tool call = name %q input %s truncated %v result %d of %d", tc.GetName(), jsonOfValue(tc.GetInput()), tc.GetTruncated(), len(tc.GetResult()), tc.GetResultBytes())
	}
	if worker.GetAgentId() != "worker" || worker.GetDepth() != 1 || worker.GetParentDispatchId() != boss.GetDispatchId() ||
		content.TextOf(worker.GetOutput().GetMessage()) != "the work is done" {
		t.Fatalf("step 2 = %v", worker)
	}
	if last.GetAgentId() != "boss" || content.TextOf(last.GetOutput().GetMessage()) != "all done" {
		t.Fatalf("step 3 = %v", last)
	}
	_, err := o.client.GetTranscript(ctx, &orchestratorv1.GetTranscriptRequest{WorkflowId: "wf-none"})
	wantCode(t, err, codes.NotFound, "")
}
