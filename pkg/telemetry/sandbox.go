package telemetry

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkinstrumentation "go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Spans of a sandboxed one-shot operator. The sandbox has no network, so
// the operator records its spans in memory (Recorder) and writes them on
// its stderr, on one line (SpansPrefix, then an OTLP TracesData in binary
// protobuf, base64), before its last line. The environment service cuts
// that line out of the operator's diagnostics (CutSpans), checks the
// spans as the untrusted input they are (SandboxSpans) and exports them
// under its own span of the run (Reexport).

// SpansPrefix starts the stderr line that carries a one-shot operator's
// spans.
const SpansPrefix = "neuron-otlp-spans: "

// Bounds of the spans one sandboxed invocation hands back. The operator
// keeps within them (the latest spans win, so the invocation's own span,
// which ends last, is kept); the environment drops what is past them.
const (
	// MaxSandboxSpans is the most spans of one invocation.
	MaxSandboxSpans = 512
	// MaxSandboxSpanBytes bounds the spans line (base64 included).
	MaxSandboxSpanBytes = 1 << 20
	// maxAttrs, maxEvents bound one span's attributes and events.
	maxAttrs  = 64
	maxEvents = 32
	// maxString bounds a string attribute, a name or a status message.
	maxString = 8 << 10
	maxName   = 256
)

// Recorder keeps the spans of a one-shot operator in memory, at most
// MaxSandboxSpans (the latest), for WriteSpans. Its TracerProvider
// records only spans whose parent is sampled: an invocation that was
// given no trace context (DispatchContext.trace_context) records nothing.
type Recorder struct {
	tp *sdktrace.TracerProvider

	mu      sync.Mutex
	spans   []sdktrace.ReadOnlySpan
	dropped int
}

// NewRecorder returns a recorder whose spans carry service's resource.
func NewRecorder(service string) *Recorder {
	r := &Recorder{}
	res, err := Resource(context.Background(), service)
	if err != nil {
		res = resource.Default()
	}
	r.tp = sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())),
		sdktrace.WithSyncer(r),
	)
	return r
}

// TracerProvider is the provider whose spans the recorder keeps.
func (r *Recorder) TracerProvider() *sdktrace.TracerProvider { return r.tp }

// ExportSpans keeps spans (sdktrace.SpanExporter).
func (r *Recorder) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, spans...)
	if n := len(r.spans) - MaxSandboxSpans; n > 0 {
		r.dropped += n
		r.spans = append(r.spans[:0:0], r.spans[n:]...)
	}
	return nil
}

// Shutdown does nothing (sdktrace.SpanExporter).
func (r *Recorder) Shutdown(context.Context) error { return nil }

// Spans are the spans kept so far.
func (r *Recorder) Spans() []sdktrace.ReadOnlySpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sdktrace.ReadOnlySpan(nil), r.spans...)
}

// WriteSpans writes the ended spans kept so far on w as one line
// (SpansPrefix, the encoded spans, a newline), the earliest left out
// until the line is under MaxSandboxSpanBytes. With no span it writes
// nothing. It returns how many spans were left out.
func (r *Recorder) WriteSpans(w io.Writer) (int, error) {
	spans := r.Spans()
	r.mu.Lock()
	dropped := r.dropped
	r.mu.Unlock()
	for len(spans) > 0 {
		line, err := EncodeSpans(spans)
		if err != nil {
			return dropped + len(spans), err
		}
		if len(line) <= MaxSandboxSpanBytes {
			_, err := w.Write(line)
			return dropped, err
		}
		cut := max(1, len(spans)/4)
		spans, dropped = spans[cut:], dropped+cut
	}
	return dropped, nil
}

// EncodeSpans is the stderr line of spans: SpansPrefix, an OTLP
// TracesData in binary protobuf as standard base64, and a newline.
func EncodeSpans(spans []sdktrace.ReadOnlySpan) ([]byte, error) {
	td := &tracepb.TracesData{}
	rs := &tracepb.ResourceSpans{}
	scopes := map[string]*tracepb.ScopeSpans{}
	for _, s := range spans {
		sc := s.InstrumentationScope()
		ss := scopes[sc.Name+"\x00"+sc.Version]
		if ss == nil {
			ss = &tracepb.ScopeSpans{Scope: &commonpb.InstrumentationScope{Name: sc.Name, Version: sc.Version}}
			scopes[sc.Name+"\x00"+sc.Version] = ss
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ss.Spans = append(ss.Spans, toOTLP(s))
	}
	td.ResourceSpans = []*tracepb.ResourceSpans{rs}
	b, err := proto.Marshal(td)
	if err != nil {
		return nil, fmt.Errorf("encoding spans: %w", err)
	}
	out := make([]byte, 0, len(SpansPrefix)+base64.StdEncoding.EncodedLen(len(b))+1)
	out = append(out, SpansPrefix...)
	out = base64.StdEncoding.AppendEncode(out, b)
	return append(out, '\n'), nil
}

func toOTLP(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc, parent := s.SpanContext(), s.Parent()
	tid, sid := sc.TraceID(), sc.SpanID()
	p := &tracepb.Span{
		TraceId:           tid[:],
		SpanId:            sid[:],
		Name:              s.Name(),
		Kind:              tracepb.Span_SpanKind(s.SpanKind()), // the same numbers
		StartTimeUnixNano: uint64(s.StartTime().UnixNano()),
		EndTimeUnixNano:   uint64(s.EndTime().UnixNano()),
		Attributes:        attrsToOTLP(s.Attributes()),
		Status:            &tracepb.Status{Message: s.Status().Description},
	}
	if parent.SpanID().IsValid() {
		pid := parent.SpanID()
		p.ParentSpanId = pid[:]
	}
	switch s.Status().Code {
	case codes.Ok:
		p.Status.Code = tracepb.Status_STATUS_CODE_OK
	case codes.Error:
		p.Status.Code = tracepb.Status_STATUS_CODE_ERROR
	}
	for _, e := range s.Events() {
		p.Events = append(p.Events, &tracepb.Span_Event{Name: e.Name, TimeUnixNano: uint64(e.Time.UnixNano()), Attributes: attrsToOTLP(e.Attributes)})
	}
	return p
}

func attrsToOTLP(kvs []attribute.KeyValue) []*commonpb.KeyValue {
	out := make([]*commonpb.KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		var v *commonpb.AnyValue
		switch kv.Value.Type() {
		case attribute.BOOL:
			v = &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: kv.Value.AsBool()}}
		case attribute.INT64:
			v = &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: kv.Value.AsInt64()}}
		case attribute.FLOAT64:
			v = &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: kv.Value.AsFloat64()}}
		case attribute.STRING:
			v = &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: kv.Value.AsString()}}
		case attribute.STRINGSLICE:
			arr := &commonpb.ArrayValue{}
			for _, s := range kv.Value.AsStringSlice() {
				arr.Values = append(arr.Values, &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s}})
			}
			v = &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: arr}}
		case attribute.INT64SLICE:
			arr := &commonpb.ArrayValue{}
			for _, n := range kv.Value.AsInt64Slice() {
				arr.Values = append(arr.Values, &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: n}})
			}
			v = &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: arr}}
		default:
			v = &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: kv.Value.Emit()}}
		}
		out = append(out, &commonpb.KeyValue{Key: string(kv.Key), Value: v})
	}
	return out
}

// CutSpans splits a one-shot operator's stderr into its spans line (its
// payload after SpansPrefix, nil when there is none) and the rest. Only
// the last such line counts; every one is removed.
func CutSpans(stderr []byte) (spans, rest []byte) {
	if !bytes.Contains(stderr, []byte(SpansPrefix)) {
		return nil, stderr
	}
	rest = make([]byte, 0, len(stderr))
	for len(stderr) > 0 {
		line := stderr
		if i := bytes.IndexByte(stderr, '\n'); i >= 0 {
			line, stderr = stderr[:i+1], stderr[i+1:]
		} else {
			stderr = nil
		}
		if p, ok := bytes.CutPrefix(line, []byte(SpansPrefix)); ok {
			spans = bytes.TrimSpace(p)
			continue
		}
		rest = append(rest, line...)
	}
	return spans, rest
}

// SandboxRun is the trusted side of a sandboxed invocation's spans: the
// environment's own span of the run, which every handed-back span ends
// up under, and what to stamp on them.
type SandboxRun struct {
	// Parent is the environment's span of the run, whose context the
	// operator was given.
	Parent trace.SpanContext
	// Start and End bound the spans' times: a span is clamped into them.
	Start, End time.Time
	// Resource replaces whatever resource the sandbox claimed.
	Resource *resource.Resource
	// Scrub, when set, is applied to every string (names, attribute
	// values, status messages): the invocation's credentials must not
	// leave through a span.
	Scrub func(string) string
}

// SandboxReport says what SandboxSpans did with the spans it was given.
type SandboxReport struct {
	// Got is how many spans the line held (up to MaxSandboxSpans+1).
	Got int
	// Kept is how many are exported.
	Kept int
	// ForeignTrace were dropped for naming another trace than the run's.
	ForeignTrace int
	// Reparented named a parent that is neither the run's span nor one
	// of the spans handed back; they were put under the run's span.
	Reparented int
	// TooMany were past MaxSandboxSpans, dropped.
	TooMany int
}

// SandboxSpans decodes the spans a sandboxed operator handed back (the
// payload CutSpans returned) and makes them safe to export, treating
// them as untrusted input: a payload over MaxSandboxSpanBytes or that
// does not decode is an error (nothing is exported); past
// MaxSandboxSpans spans the rest are dropped; a span of another trace
// than the run's is dropped; every span gets a fresh span id (so none can
// pose as a span of another service), its parent is mapped to match, and
// one whose parent is unknown is put under the run's span; times are
// clamped into the run, names, attributes and events bounded and made
// valid UTF-8, links dropped, and the resource replaced by run.Resource.
func SandboxSpans(payload []byte, run SandboxRun) ([]sdktrace.ReadOnlySpan, SandboxReport, error) {
	var rep SandboxReport
	if len(payload) > MaxSandboxSpanBytes {
		return nil, rep, fmt.Errorf("the sandbox handed back %d bytes of spans, more than %d", len(payload), MaxSandboxSpanBytes)
	}
	raw, err := base64.StdEncoding.DecodeString(string(payload))
	if err != nil {
		return nil, rep, fmt.Errorf("the sandbox's spans are not base64: %v", err)
	}
	td := &tracepb.TracesData{}
	if err := proto.Unmarshal(raw, td); err != nil {
		return nil, rep, fmt.Errorf("the sandbox's spans are not an OTLP TracesData: %v", err)
	}
	type item struct {
		scope *commonpb.InstrumentationScope
		span  *tracepb.Span
	}
	var items []item
	for _, rs := range td.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				rep.Got++
				if len(items) >= MaxSandboxSpans {
					rep.TooMany++
					continue
				}
				items = append(items, item{ss.GetScope(), sp})
			}
		}
	}
	tid := run.Parent.TraceID()
	// Fresh ids for every span of the run's trace; the first of a
	// duplicated id wins.
	ids := map[trace.SpanID]trace.SpanID{}
	keep := items[:0]
	for _, it := range items {
		if !bytes.Equal(it.span.GetTraceId(), tid[:]) {
			rep.ForeignTrace++
			continue
		}
		old, ok := spanID(it.span.GetSpanId())
		if !ok {
			rep.ForeignTrace++ // not a span id at all
			continue
		}
		if _, dup := ids[old]; dup {
			continue
		}
		ids[old] = newSpanID()
		keep = append(keep, it)
	}
	clean := func(s string, n int) string {
		if run.Scrub != nil {
			s = run.Scrub(s)
		}
		return bound(s, n)
	}
	res := run.Resource
	if res == nil {
		res = resource.Empty()
	}
	// Parents: the run's span, or a span handed back (mapped to its new
	// id); anything else, and any link of a cycle, is put under the run.
	runID := run.Parent.SpanID()
	parents := make(map[trace.SpanID]trace.SpanID, len(keep)) // old id: old parent (runID: the run)
	for _, it := range keep {
		old, _ := spanID(it.span.GetSpanId())
		p, ok := spanID(it.span.GetParentSpanId())
		if _, known := ids[p]; ok && (p == runID || (known && p != old)) {
			parents[old] = p
		} else {
			parents[old] = runID
			rep.Reparented++
		}
	}
	for _, it := range keep {
		old, _ := spanID(it.span.GetSpanId())
		p := parents[old]
		for steps := 0; p != runID; steps++ {
			if p == old || steps > len(keep) {
				parents[old] = runID // a cycle
				rep.Reparented++
				break
			}
			p = parents[p]
		}
	}
	out := make([]sdktrace.ReadOnlySpan, 0, len(keep))
	for _, it := range keep {
		sp := it.span
		old, _ := spanID(sp.GetSpanId())
		parent := runID
		if p := parents[old]; p != runID {
			parent = ids[p]
		}
		start, end := clampTime(sp.GetStartTimeUnixNano(), run), clampTime(sp.GetEndTimeUnixNano(), run)
		if end.Before(start) {
			end = start
		}
		stub := tracetest.SpanStub{
			Name: clean(sp.GetName(), maxName),
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: tid, SpanID: ids[old], TraceFlags: trace.FlagsSampled,
			}),
			Parent: trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: tid, SpanID: parent, TraceFlags: trace.FlagsSampled, Remote: parent == runID,
			}),
			SpanKind:   spanKind(sp.GetKind()),
			StartTime:  start,
			EndTime:    end,
			Attributes: attrsFromOTLP(sp.GetAttributes(), clean),
			Resource:   res,
			InstrumentationScope: sdkinstrumentation.Scope{
				Name:    clean(it.scope.GetName(), maxName),
				Version: clean(it.scope.GetVersion(), maxName),
			},
		}
		if n := len(sp.GetAttributes()) - maxAttrs; n > 0 {
			stub.DroppedAttributes = n
		}
		switch sp.GetStatus().GetCode() {
		case tracepb.Status_STATUS_CODE_OK:
			stub.Status = sdktrace.Status{Code: codes.Ok}
		case tracepb.Status_STATUS_CODE_ERROR:
			stub.Status = sdktrace.Status{Code: codes.Error, Description: clean(sp.GetStatus().GetMessage(), maxString)}
		}
		for i, e := range sp.GetEvents() {
			if i >= maxEvents {
				stub.DroppedEvents = len(sp.GetEvents()) - maxEvents
				break
			}
			stub.Events = append(stub.Events, sdktrace.Event{
				Name: clean(e.GetName(), maxName), Time: clampTime(e.GetTimeUnixNano(), run),
				Attributes: attrsFromOTLP(e.GetAttributes(), clean),
			})
		}
		stub.DroppedLinks = len(sp.GetLinks())
		out = append(out, stub.Snapshot())
	}
	rep.Kept = len(out)
	return out, rep, nil
}

func spanID(b []byte) (trace.SpanID, bool) {
	var id trace.SpanID
	if len(b) != len(id) {
		return id, false
	}
	copy(id[:], b)
	return id, id.IsValid()
}

// idGen makes the fresh span ids of re-exported spans.
var idGen = sdktrace.NewTracerProvider() // its default, random generator

func newSpanID() trace.SpanID {
	_, span := idGen.Tracer("").Start(context.Background(), "")
	return span.SpanContext().SpanID()
}

func clampTime(ns uint64, run SandboxRun) time.Time {
	t := time.Unix(0, int64(min(ns, 1<<62)))
	if !run.Start.IsZero() && t.Before(run.Start) {
		return run.Start
	}
	if !run.End.IsZero() && t.After(run.End) {
		return run.End
	}
	return t
}

func spanKind(k tracepb.Span_SpanKind) trace.SpanKind {
	if k < tracepb.Span_SPAN_KIND_INTERNAL || k > tracepb.Span_SPAN_KIND_CONSUMER {
		return trace.SpanKindInternal
	}
	return trace.SpanKind(k)
}

// bound cuts s to at most n bytes, on a rune boundary, and makes it
// valid UTF-8.
func bound(s string, n int) string {
	s = stringsToValid(s)
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

func stringsToValid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string(bytes.ToValidUTF8([]byte(s), []byte("\uFFFD")))
}

func attrsFromOTLP(kvs []*commonpb.KeyValue, clean func(string, int) string) []attribute.KeyValue {
	out := make([]attribute.KeyValue, 0, min(len(kvs), maxAttrs))
	for _, kv := range kvs {
		if len(out) >= maxAttrs {
			break
		}
		k := clean(kv.GetKey(), maxName)
		if k == "" {
			continue
		}
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_BoolValue:
			out = append(out, attribute.Bool(k, v.BoolValue))
		case *commonpb.AnyValue_IntValue:
			out = append(out, attribute.Int64(k, v.IntValue))
		case *commonpb.AnyValue_DoubleValue:
			out = append(out, attribute.Float64(k, v.DoubleValue))
		case *commonpb.AnyValue_StringValue:
			out = append(out, attribute.String(k, clean(v.StringValue, maxString)))
		case *commonpb.AnyValue_ArrayValue:
			var strs []string
			var ints []int64
			for i, e := range v.ArrayValue.GetValues() {
				if i >= maxAttrs {
					break
				}
				switch ev := e.GetValue().(type) {
				case *commonpb.AnyValue_StringValue:
					strs = append(strs, clean(ev.StringValue, maxName))
				case *commonpb.AnyValue_IntValue:
					ints = append(ints, ev.IntValue)
				}
			}
			if len(strs) > 0 {
				out = append(out, attribute.StringSlice(k, strs))
			} else if len(ints) > 0 {
				out = append(out, attribute.Int64Slice(k, ints))
			}
		}
	}
	return out
}

// reexport is the span processor Setup installed, through which
// Reexport sends spans; nil: none.
var reexport atomic.Pointer[sdktrace.SpanProcessor]

// Reexport hands finished spans (SandboxSpans's) to the queue of the
// exporter Setup installed, as if this process had recorded them; with
// no exporter it drops them. It never blocks: a full queue drops them.
func Reexport(spans []sdktrace.ReadOnlySpan) {
	p := reexport.Load()
	if p == nil {
		return
	}
	for _, s := range spans {
		(*p).OnEnd(s)
	}
}

// processResource is the resource Setup gave the process's spans.
var processResource atomic.Pointer[resource.Resource]

// EmitSpan exports a span this process did not record live, such as one
// whose ids were chosen long before it ended (a workflow's, which may
// outlive the process that started it): s with the process's resource
// when it has none. Like Reexport, it never blocks.
func EmitSpan(s tracetest.SpanStub) {
	if s.Resource == nil {
		s.Resource = processResource.Load()
	}
	Reexport([]sdktrace.ReadOnlySpan{s.Snapshot()})
}

// SetReexporter makes Reexport send spans to p (nil: nowhere) and
// returns a function restoring the one before. For tests.
func SetReexporter(p sdktrace.SpanProcessor) (restore func()) {
	var old *sdktrace.SpanProcessor
	if p == nil {
		old = reexport.Swap(nil)
	} else {
		old = reexport.Swap(&p)
	}
	return func() { reexport.Store(old) }
}
