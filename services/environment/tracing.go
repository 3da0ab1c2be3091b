package environment

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/telemetry"
)

// Spans and metrics of a run. Each run gets a "sandbox {backend}" span
// under the Run call's; its context goes to the one-shot operator in the
// input's DispatchContext.trace_context, and the spans the operator hands
// back on its stderr (telemetry.SpansPrefix) are checked
// (telemetry.SandboxSpans: bounded, of the run's trace only, fresh ids,
// scrubbed of the invocation's credentials) and exported under it, as
// service neuron-operator. The sandbox's peak memory and CPU time are
// recorded per invocation, by agent and backend.

// instrumentation is the environment's tracer and meter name.
const instrumentation = "github.com/secbear/neuron/services/environment"

// Attribute keys.
const (
	attrBackend    = "neuron.sandbox.backend"
	attrInvocation = "neuron.invocation.id"
	attrAgent      = "gen_ai.agent.name"
	attrPeakMemory = "neuron.sandbox.memory.peak_bytes"
	attrCPUTime    = "neuron.sandbox.cpu_time_s"
	attrSpansKept  = "neuron.sandbox.spans.kept"
	attrSpansDrop  = "neuron.sandbox.spans.dropped"
	attrSpansError = "neuron.sandbox.spans.error"
)

// sandboxMeters are the environment's metrics.
var sandboxMeters = func() (m struct {
	memory metric.Int64Histogram
	cpu    metric.Float64Histogram
}) {
	meter := otel.Meter(instrumentation)
	m.memory, _ = meter.Int64Histogram("neuron.sandbox.memory.peak", metric.WithUnit("By"),
		metric.WithDescription("peak memory of a sandboxed invocation, by agent and backend"),
		metric.WithExplicitBucketBoundaries(1<<20, 4<<20, 16<<20, 64<<20, 128<<20, 256<<20, 512<<20, 1<<30, 2<<30, 4<<30, 8<<30))
	m.cpu, _ = meter.Float64Histogram("neuron.sandbox.cpu.time", metric.WithUnit("s"),
		metric.WithDescription("CPU time of a sandboxed invocation, by agent and backend"),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900))
	return m
}()

// agentOf is the agent an invocation runs as: its dispatch's agent id,
// else "operator".
func agentOf(in *operatorv1.OperatorInput) string {
	if a := in.GetDispatch().GetAgentId(); a != "" {
		return a
	}
	return "operator"
}

// traceRun starts the run's span and gives the operator its context (in
// inv.Input and inv.InputJSON); end takes the spans the operator handed
// back out of res.Logs, exports them, records the usage and ends the
// span.
func traceRun(ctx context.Context, inv *Invocation, backend string) (context.Context, func(res *Result, err error)) {
	start := time.Now()
	agent := agentOf(inv.Input)
	ctx, span := otel.Tracer(instrumentation).Start(ctx, "sandbox "+backend, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String(attrBackend, backend), attribute.String(attrInvocation, inv.ID), attribute.String(attrAgent, agent)))
	recording := span.IsRecording() && span.SpanContext().IsSampled()
	if recording || len(inv.Input.GetDispatch().GetTraceContext()) > 0 {
		// The operator's spans go under this span; without one, it is
		// given no trace context and records nothing.
		in := proto.Clone(inv.Input).(*operatorv1.OperatorInput)
		if in.Dispatch == nil {
			in.Dispatch = &operatorv1.DispatchContext{}
		}
		in.Dispatch.TraceContext = nil
		if recording {
			tc := map[string]string{}
			propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(tc))
			in.Dispatch.TraceContext = tc
		}
		if b, err := protojson.Marshal(in); err == nil {
			inv.Input, inv.InputJSON = in, b
		}
	}
	return ctx, func(res *Result, err error) {
		defer span.End()
		attrs := metric.WithAttributes(attribute.String(attrAgent, agent), attribute.String(attrBackend, backend))
		if res != nil {
			payload, rest := telemetry.CutSpans(res.Logs)
			res.Logs = rest
			if payload != nil && recording {
				importSpans(inv, span, payload, start)
			}
			if u := res.Usage; u != nil {
				if u.GetPeakMemoryBytes() > 0 {
					sandboxMeters.memory.Record(ctx, int64(min(u.GetPeakMemoryBytes(), 1<<62)), attrs)
					span.SetAttributes(attribute.Int64(attrPeakMemory, int64(min(u.GetPeakMemoryBytes(), 1<<62))))
				}
				if u.GetCpuTime() != nil {
					sec := u.GetCpuTime().AsDuration().Seconds()
					sandboxMeters.cpu.Record(ctx, sec, attrs)
					span.SetAttributes(attribute.Float64(attrCPUTime, sec))
				}
			}
		}
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.String("error.type", errs.Code(err).String()))
		}
	}
}

// importSpans exports the spans the sandbox handed back under span.
func importSpans(inv *Invocation, span trace.Span, payload []byte, start time.Time) {
	res := resource.NewSchemaless(
		attribute.String("service.name", telemetry.ServiceName("operator")),
		attribute.String(attrInvocation, inv.ID),
		attribute.Bool("neuron.sandboxed", true),
	)
	spans, rep, err := telemetry.SandboxSpans(payload, telemetry.SandboxRun{
		Parent:   span.SpanContext(),
		Start:    start,
		End:      time.Now(),
		Resource: res,
		Scrub:    inv.scrubber.String,
	})
	if err != nil {
		inv.Log.Warn("the operator's spans were dropped", "error", err.Error())
		span.SetAttributes(attribute.String(attrSpansError, err.Error()))
		return
	}
	telemetry.Reexport(spans)
	span.SetAttributes(attribute.Int(attrSpansKept, rep.Kept))
	if dropped := rep.Got - rep.Kept; dropped > 0 || rep.Reparented > 0 {
		inv.Log.Warn("some of the operator's spans were dropped or re-parented", "handed_back", rep.Got, "kept", rep.Kept,
			"other_trace", rep.ForeignTrace, "too_many", rep.TooMany, "reparented", rep.Reparented)
		span.SetAttributes(attribute.Int(attrSpansDrop, dropped))
	}
}
