package orchestrator

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
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
	v, err := valueOf(rec.ProtoReflect())
	if err != nil {
		return fmt.Errorf("encode the transcript of step %d: %v: %w", rec.Step, err, errs.Internal)
	}
	_, err = state.Write(ctx, &statev1.WriteRequest{Scope: scope.Workflow(wf), Key: TranscriptKey(rec.Step), Value: v, Unindexed: true})
	return errs.FromGRPC(err)
}

// valueOf returns m as the google.protobuf.Value that protojson's
// encoding of m (default options) decodes to, built directly from the
// message instead of through JSON text: the transcript entry is written
// once per operator call, and the text round trip was most of its cost
// in the orchestrator. Struct, Value and ListValue fields are shared,
// not copied; Any and FieldMask, which the transcript's messages do not
// hold, go through protojson. It fails where protojson would: invalid
// UTF-8, a Timestamp or Duration out of range, a Value without a kind or
// with a number JSON cannot hold.
func valueOf(m protoreflect.Message) (*structpb.Value, error) {
	switch m.Descriptor().FullName() {
	case "google.protobuf.Value", "google.protobuf.Struct", "google.protobuf.ListValue",
		"google.protobuf.Timestamp", "google.protobuf.Duration":
		return knownValue(m)
	case "google.protobuf.Empty":
		return structpb.NewStructValue(&structpb.Struct{}), nil
	case "google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue",
		"google.protobuf.Int32Value", "google.protobuf.UInt32Value", "google.protobuf.Int64Value",
		"google.protobuf.UInt64Value", "google.protobuf.FloatValue", "google.protobuf.DoubleValue":
		fd := m.Descriptor().Fields().ByNumber(1)
		return singularValue(m.Get(fd), fd)
	case "google.protobuf.Any", "google.protobuf.FieldMask":
		return viaJSON(m)
	}
	fields := map[string]*structpb.Value{}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		var x *structpb.Value
		switch {
		case fd.IsList():
			l := v.List()
			vs := make([]*structpb.Value, l.Len())
			for i := range vs {
				if vs[i], err = singularValue(l.Get(i), fd); err != nil {
					return false
				}
			}
			x = structpb.NewListValue(&structpb.ListValue{Values: vs})
		case fd.IsMap():
			s := &structpb.Struct{Fields: make(map[string]*structpb.Value, v.Map().Len())}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				s.Fields[k.String()], err = singularValue(mv, fd.MapValue())
				return err == nil
			})
			x = structpb.NewStructValue(s)
		default:
			x, err = singularValue(v, fd)
		}
		if err != nil {
			return false
		}
		name := fd.JSONName()
		if fd.IsExtension() {
			name = "[" + string(fd.FullName()) + "]"
		}
		fields[name] = x
		return true
	})
	if err != nil {
		return nil, err
	}
	return structpb.NewStructValue(&structpb.Struct{Fields: fields}), nil
}

// singularValue is one value of field fd as protojson writes it.
func singularValue(v protoreflect.Value, fd protoreflect.FieldDescriptor) (*structpb.Value, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return structpb.NewBoolValue(v.Bool()), nil
	case protoreflect.StringKind:
		if !utf8.ValidString(v.String()) {
			return nil, fmt.Errorf("field %s: invalid UTF-8", fd.FullName())
		}
		return structpb.NewStringValue(v.String()), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return structpb.NewNumberValue(float64(v.Int())), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return structpb.NewNumberValue(float64(v.Uint())), nil
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return structpb.NewStringValue(strconv.FormatInt(v.Int(), 10)), nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return structpb.NewStringValue(strconv.FormatUint(v.Uint(), 10)), nil
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f, bits := v.Float(), 64
		if fd.Kind() == protoreflect.FloatKind {
			bits = 32
		}
		switch {
		case math.IsNaN(f):
			return structpb.NewStringValue("NaN"), nil
		case math.IsInf(f, 1):
			return structpb.NewStringValue("Infinity"), nil
		case math.IsInf(f, -1):
			return structpb.NewStringValue("-Infinity"), nil
		case bits == 32: // the value JSON's shortest float32 text reads back as
			f, _ = strconv.ParseFloat(strconv.FormatFloat(f, 'g', -1, 32), 64)
		}
		return structpb.NewNumberValue(f), nil
	case protoreflect.BytesKind:
		return structpb.NewStringValue(base64.StdEncoding.EncodeToString(v.Bytes())), nil
	case protoreflect.EnumKind:
		if fd.Enum().FullName() == "google.protobuf.NullValue" {
			return structpb.NewNullValue(), nil
		}
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return structpb.NewStringValue(string(ev.Name())), nil
		}
		return structpb.NewNumberValue(float64(v.Enum())), nil
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return valueOf(v.Message())
	}
	return nil, fmt.Errorf("field %s: kind %v", fd.FullName(), fd.Kind())
}

// checkValue fails for what protojson refuses in a Value: no kind, a
// number that is not finite, invalid UTF-8.
func checkValue(v *structpb.Value) error {
	switch k := v.GetKind().(type) {
	case nil:
		return errors.New("google.protobuf.Value: none of the oneof fields is set")
	case *structpb.Value_NumberValue:
		if math.IsNaN(k.NumberValue) || math.IsInf(k.NumberValue, 0) {
			return fmt.Errorf("google.protobuf.Value: invalid %v number", k.NumberValue)
		}
	case *structpb.Value_StringValue:
		if !utf8.ValidString(k.StringValue) {
			return errors.New("google.protobuf.Value: invalid UTF-8")
		}
	case *structpb.Value_StructValue:
		for key, f := range k.StructValue.GetFields() {
			if !utf8.ValidString(key) {
				return errors.New("google.protobuf.Struct: invalid UTF-8 in a key")
			}
			if err := checkValue(f); err != nil {
				return err
			}
		}
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if err := checkValue(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// knownValue is a Value, Struct, ListValue, Timestamp or Duration as
// protojson writes it; one that is not the generated type (a dynamic
// message) goes through protojson.
func knownValue(m protoreflect.Message) (*structpb.Value, error) {
	switch x := m.Interface().(type) {
	case *structpb.Value:
		return x, checkValue(x)
	case *structpb.Struct:
		v := structpb.NewStructValue(x)
		return v, checkValue(v)
	case *structpb.ListValue:
		v := structpb.NewListValue(x)
		return v, checkValue(v)
	case *timestamppb.Timestamp:
		return timestampValue(x)
	case *durationpb.Duration:
		return durationValue(x)
	}
	return viaJSON(m)
}

// viaJSON is valueOf through protojson's text.
func viaJSON(m protoreflect.Message) (*structpb.Value, error) {
	b, err := protojson.Marshal(m.Interface())
	if err != nil {
		return nil, err
	}
	v := &structpb.Value{}
	return v, protojson.Unmarshal(b, v)
}

// timestampValue is a Timestamp as protojson writes it: RFC 3339 in UTC
// with 0, 3, 6 or 9 fractional digits.
func timestampValue(t *timestamppb.Timestamp) (*structpb.Value, error) {
	if err := t.CheckValid(); err != nil {
		return nil, err
	}
	x := t.AsTime().Format("2006-01-02T15:04:05.000000000")
	x = strings.TrimSuffix(x, "000")
	x = strings.TrimSuffix(x, "000")
	x = strings.TrimSuffix(x, ".000")
	return structpb.NewStringValue(x + "Z"), nil
}

// durationValue is a Duration as protojson writes it: seconds with 0,
// 3, 6 or 9 fractional digits, then "s".
func durationValue(d *durationpb.Duration) (*structpb.Value, error) {
	if err := d.CheckValid(); err != nil {
		return nil, err
	}
	secs, nanos, sign := d.GetSeconds(), int64(d.GetNanos()), ""
	if secs < 0 || nanos < 0 {
		sign, secs, nanos = "-", -secs, -nanos
	}
	x := fmt.Sprintf("%s%d.%09d", sign, secs, nanos)
	x = strings.TrimSuffix(x, "000")
	x = strings.TrimSuffix(x, "000")
	x = strings.TrimSuffix(x, ".000")
	return structpb.NewStringValue(x + "s"), nil
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
