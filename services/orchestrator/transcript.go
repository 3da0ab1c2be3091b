package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// The transcript: every operator call's input, output and tool calls,
// kept in the State service under the workflow's scope, one value per
// step at TranscriptKey(n). The key is a function of the step, so the
// journal (or Temporal's history) references it by the step number it
// already records, and a call made again after a crash overwrites what
// the interrupted attempt left. Nothing of it enters Temporal's history.

// TranscriptPrefix is the State key prefix of a workflow's transcript.
const TranscriptPrefix = "orchestrator/transcript/"

// TranscriptKey is the State key of step n's transcript entry; keys sort
// in step order.
func TranscriptKey(n uint64) string { return fmt.Sprintf("%s%020d", TranscriptPrefix, n) }

// MaxToolResult is the most of a tool result a transcript keeps.
const MaxToolResult = 64 << 10

// Recorder is a Caller that records each call's transcript in the State
// service and hands its progress to a Hub for WatchWorkflow, around the
// Caller that makes the call. A call whose input names no workflow
// step passes through unrecorded.
type Recorder struct {
	Next  Caller
	State statev1.StateServiceClient
	Hub   *Hub
	Log   *slog.Logger
	// WriteTimeout bounds the transcript write, retries included; 0: 5s.
	// The step waits for it, so it is short: a State service that stays
	// away costs the transcript entry (logged), not the workflow's
	// progress (its effects wait for State by themselves).
	WriteTimeout time.Duration
}

// StepOf returns the step number of a dispatch id made by DispatchID; 0
// when it has none.
func StepOf(dispatchID string) uint64 {
	i := strings.LastIndexByte(dispatchID, '#')
	if i < 0 {
		return 0
	}
	n, err := strconv.ParseUint(dispatchID[i+1:], 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Call implements Caller.
func (r *Recorder) Call(ctx context.Context, agent *Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	dc := in.GetDispatch()
	wf, step := dc.GetWorkflowId(), StepOf(dc.GetDispatchId())
	if wf == "" || step == 0 {
		return r.Next.Call(ctx, agent, in)
	}
	rec := &orchestratorv1.TranscriptStep{Step: step, DispatchId: dc.GetDispatchId(), AgentId: agent.ID, Depth: dc.GetDepth(),
		ParentDispatchId: dc.GetParentDispatchId(), Input: in, StartTime: timestamppb.Now()}
	var live *liveCall
	if r.Hub != nil {
		live = r.Hub.begin(wf, &orchestratorv1.StepProgress{Step: step, DispatchId: dc.GetDispatchId(), AgentId: agent.ID, Depth: dc.GetDepth()})
	}
	tools := toolLog{}
	outer := ProgressFrom(ctx)
	out, err := r.Next.Call(WithProgress(ctx, func(ev *operatorv1.ExecuteStreamResponse) {
		if live != nil {
			r.Hub.add(live, ev)
		}
		tools.add(ev)
		if outer != nil {
			outer(ev)
		}
	}), agent, in)
	if live != nil {
		r.Hub.end(live)
	}
	rec.Output, rec.ToolCalls, rec.EndTime = out, tools.calls, timestamppb.Now()
	if err != nil {
		rec.Error = statusOf(err)
	}
	if r.State != nil {
		r.write(ctx, wf, rec)
	}
	return out, err
}

// write stores rec, retrying transient failures for a while even when
// the call's context has ended (a cancelled call is recorded too). A
// record over the State service's value limit is stored again with its
// tool results cut to 1 KiB; one that still does not fit, and one a
// State service with a full disk refuses, are logged and left out.
func (r *Recorder) write(ctx context.Context, wf string, rec *orchestratorv1.TranscriptStep) {
	timeout := r.WriteTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	backoff := 50 * time.Millisecond
	for shrunk := false; ; {
		err := WriteTranscript(wctx, r.State, wf, rec)
		switch {
		case err == nil:
			return
		case errs.Code(err) == errs.Code(errs.ResourceExhausted) && !shrunk:
			shrunk = true
			for _, c := range rec.ToolCalls {
				c.Result, c.Truncated = cut(c.Result, 1<<10)
			}
			continue
		case !Transient(err) || errs.Reason(err) == errs.ReasonStorageFull || Sleep(wctx, backoff) != nil:
			if r.Log != nil {
				r.Log.Warn("the transcript of a step was not kept", "workflow_id", wf, "step", rec.Step, "err", err)
			}
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// WriteTranscript stores one step's transcript entry, unindexed.
func WriteTranscript(ctx context.Context, state statev1.StateServiceClient, wf string, rec *orchestratorv1.TranscriptStep) error {
	b, err := protojson.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode the transcript of step %d: %v: %w", rec.Step, err, errs.Internal)
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(b, v); err != nil {
		return fmt.Errorf("encode the transcript of step %d: %v: %w", rec.Step, err, errs.Internal)
	}
	_, err = state.Write(ctx, &statev1.WriteRequest{Scope: scope.Workflow(wf), Key: TranscriptKey(rec.Step), Value: v, Unindexed: true})
	return errs.FromGRPC(err)
}

// toolLog collects a call's tool calls from its progress.
type toolLog struct {
	calls []*orchestratorv1.TranscriptToolCall
	byID  map[string]*orchestratorv1.TranscriptToolCall
}

func (t *toolLog) add(ev *operatorv1.ExecuteStreamResponse) {
	switch e := ev.GetEvent().(type) {
	case *operatorv1.ExecuteStreamResponse_ToolCallStarted:
		s := e.ToolCallStarted
		c := &orchestratorv1.TranscriptToolCall{ToolUseId: s.GetToolUseId(), Name: s.GetName(), Input: s.GetInput(), Turn: s.GetTurn()}
		t.calls = append(t.calls, c)
		if t.byID == nil {
			t.byID = map[string]*orchestratorv1.TranscriptToolCall{}
		}
		t.byID[s.GetToolUseId()] = c
	case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
		f := e.ToolCallFinished
		c := t.byID[f.GetToolUseId()]
		if c == nil { // finished without a start (skipped or rejected)
			c = &orchestratorv1.TranscriptToolCall{ToolUseId: f.GetToolUseId(), Name: f.GetName(), Turn: f.GetTurn()}
			t.calls = append(t.calls, c)
		}
		c.ResultBytes = uint64(len(f.GetResult()))
		c.Result, c.Truncated = cut(f.GetResult(), MaxToolResult)
		c.IsError, c.Duration = f.GetIsError(), f.GetDuration()
	}
}

// cut returns s cut to at most n bytes on a rune boundary, and whether
// it was cut.
func cut(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// DefaultTranscriptPage is GetTranscript's page size when the request
// says 0.
const DefaultTranscriptPage = 20

// GetTranscript implements OrchestratorService.GetTranscript.
func (s *Server) GetTranscript(ctx context.Context, req *orchestratorv1.GetTranscriptRequest) (*orchestratorv1.GetTranscriptResponse, error) {
	if s.state == nil {
		return nil, fmt.Errorf("this orchestrator keeps no transcripts (no State service): %w", errs.FailedPrecondition)
	}
	size := int32(DefaultTranscriptPage)
	if req.GetPageSize() > 0 {
		size = req.GetPageSize()
	}
	id := req.GetWorkflowId()
	list, err := s.state.List(ctx, &statev1.ListRequest{Scope: scope.Workflow(id), Prefix: TranscriptPrefix, PageSize: size, PageToken: req.GetPageToken(),
		IncludeValues: true})
	if err != nil {
		err = errs.FromGRPC(err)
		if errs.Code(err) == errs.Code(errs.InvalidArgument) {
			return nil, fmt.Errorf("page_token: not one this server issued for workflow %q: %w", id, errs.InvalidArgument)
		}
		return nil, fmt.Errorf("reading the transcript of workflow %q from the State service: %w", id, err)
	}
	if len(list.GetItems()) == 0 && req.GetPageToken() == "" {
		if _, err := s.e.Get(ctx, id); err != nil {
			return nil, err
		}
	}
	resp := &orchestratorv1.GetTranscriptResponse{NextPageToken: list.GetNextPageToken()}
	for _, item := range list.GetItems() {
		// The listing carries the values; a State service that leaves
		// them out (behind a store middleware, or older) is read key by
		// key.
		rec, err := transcriptOf(item.GetValue(), id, item.GetKey())
		if item.GetValue() == nil {
			rec, err = readTranscript(ctx, s.state, id, item.GetKey())
		}
		if err != nil {
			return nil, err
		}
		if rec != nil {
			resp.Steps = append(resp.Steps, rec)
		}
	}
	return resp, nil
}

// readTranscript reads one transcript entry; nil when it was deleted
// meanwhile.
func readTranscript(ctx context.Context, state statev1.StateServiceClient, wf, key string) (*orchestratorv1.TranscriptStep, error) {
	resp, err := state.Read(ctx, &statev1.ReadRequest{Scope: scope.Workflow(wf), Key: key})
	if err = errs.FromGRPC(err); errors.Is(err, errs.NotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s of workflow %q from the State service: %w", key, wf, err)
	}
	return transcriptOf(resp.GetValue(), wf, key)
}

// transcriptOf decodes a stored transcript entry; nil for no value.
func transcriptOf(v *structpb.Value, wf, key string) (*orchestratorv1.TranscriptStep, error) {
	if v == nil {
		return nil, nil
	}
	b, err := protojson.Marshal(v)
	if err != nil {
		return nil, err
	}
	rec := &orchestratorv1.TranscriptStep{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, rec); err != nil {
		return nil, fmt.Errorf("%s of workflow %q is not a transcript entry: %v: %w", key, wf, err, errs.Internal)
	}
	return rec, nil
}
