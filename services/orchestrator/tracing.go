package orchestrator

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkinstrumentation "go.opentelemetry.io/otel/sdk/instrumentation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/telemetry"
)

// Traces and metrics of workflows. A workflow's trace is the one of the
// call that started it (the engines journal its W3C trace context and
// run every step under it, across restarts). In it, each operator call
// a step makes is a "dispatch {agent}" span (Tracer, around the Caller:
// a step replayed from the journal after a crash makes no call, so it is
// never reported as a new execution), each effect the call declared an
// "effect {kind}" span under it, and the call to the operator or
// environment service under that (otelgrpc), where the operator's
// invoke_agent span goes on. Workflows by status and approvals waiting
// are counted from the lifecycle bus (ObserveWorkflows).

const instrumentation = "github.com/secbear/neuron/services/orchestrator"

// instrumentationName is instrumentation, for a scope built by hand.
const instrumentationName = instrumentation

// Span attribute keys.
const (
	attrAgent      = "gen_ai.agent.name"
	attrWorkflow   = "neuron.workflow_id"
	attrDispatch   = "neuron.dispatch_id"
	attrParent     = "neuron.parent_dispatch_id"
	attrStep       = "neuron.step"
	attrDepth      = "neuron.depth"
	attrOutcome    = "neuron.outcome"
	attrExit       = "neuron.exit_kind"
	attrCost       = "neuron.gen_ai.cost_usd"
	attrTokensIn   = "gen_ai.usage.input_tokens"
	attrTokensOut  = "gen_ai.usage.output_tokens"
	attrModel      = "gen_ai.response.model"
	attrEffectKind = "neuron.effect.kind"
	attrEffectKey  = "neuron.effect.idempotency_key"
	attrStatus     = "neuron.workflow.status"
	attrErrorType  = "error.type"
)

type orchMetrics struct {
	dispatchTime metric.Float64Histogram
	dispatches   metric.Int64Counter
	workflows    metric.Int64Counter
	waiting      metric.Int64UpDownCounter
}

var orchMeters = func() *orchMetrics {
	m := otel.Meter(instrumentation)
	var o orchMetrics
	o.dispatchTime, _ = m.Float64Histogram("neuron.dispatch.duration", metric.WithUnit("s"),
		metric.WithDescription("latency of an operator call a workflow step makes, by agent and outcome"))
	o.dispatches, _ = m.Int64Counter("neuron.dispatch.calls", metric.WithUnit("{call}"),
		metric.WithDescription("operator calls workflow steps make, by agent and outcome (the operator's exit kind, or the error's class)"))
	o.workflows, _ = m.Int64Counter("neuron.workflows", metric.WithUnit("{workflow}"),
		metric.WithDescription("workflows started and ended, by neuron.workflow.status (started, completed, failed, canceled)"))
	o.waiting, _ = m.Int64UpDownCounter("neuron.approvals.waiting", metric.WithUnit("{workflow}"),
		metric.WithDescription("workflows suspended, waiting for a person's decision"))
	return &o
}()

// Tracer is a Caller that reports each call as a span and in the
// dispatch metrics, around the Caller that makes it.
type Tracer struct {
	Next Caller
}

// Traced wraps next with a Tracer.
func Traced(next Caller) Caller { return &Tracer{Next: next} }

// Call implements Caller.
func (t *Tracer) Call(ctx context.Context, agent *Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	dc := in.GetDispatch()
	attrs := []attribute.KeyValue{
		attribute.String(attrAgent, agent.ID),
		attribute.String(attrWorkflow, dc.GetWorkflowId()),
		attribute.String(attrDispatch, dc.GetDispatchId()),
		attribute.Int64(attrDepth, int64(dc.GetDepth())),
	}
	if n := StepOf(dc.GetDispatchId()); n > 0 {
		attrs = append(attrs, attribute.Int64(attrStep, int64(n)))
	}
	if p := dc.GetParentDispatchId(); p != "" {
		attrs = append(attrs, attribute.String(attrParent, p))
	}
	start := time.Now()
	ctx, span := otel.Tracer(instrumentation).Start(ctx, "dispatch "+agent.ID,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	out, err := t.Next.Call(ctx, agent, in)
	outcome := outcomeOf(out, err)
	orchMeters.dispatchTime.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attribute.String(attrAgent, agent.ID), attribute.String(attrOutcome, outcome)))
	orchMeters.dispatches.Add(ctx, 1, metric.WithAttributes(attribute.String(attrAgent, agent.ID), attribute.String(attrOutcome, outcome)))
	if span.IsRecording() {
		span.SetAttributes(attribute.String(attrOutcome, outcome))
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.String(attrErrorType, outcome))
		} else {
			md := out.GetMetadata()
			span.SetAttributes(
				attribute.String(attrExit, out.GetExitReason().GetKind().String()),
				attribute.Int64(attrTokensIn, int64(md.GetTokensIn())),
				attribute.Int64(attrTokensOut, int64(md.GetTokensOut())),
				attribute.String(attrModel, md.GetModel()),
			)
			if c := md.GetCost().GetAmount(); c != "" {
				span.SetAttributes(attribute.String(attrCost, c))
			}
			effectSpans(ctx, out.GetEffects())
		}
	}
	span.End()
	return out, err
}

// effectSpans records a span per effect the call declared, under the
// dispatch span: the engine applies them once the step is journaled.
func effectSpans(ctx context.Context, effects []*typesv1.Effect) {
	tr := otel.Tracer(instrumentation)
	for _, e := range effects {
		kind := effectKind(e)
		_, s := tr.Start(ctx, "effect "+kind, trace.WithAttributes(
			attribute.String(attrEffectKind, kind),
			attribute.String(attrEffectKey, e.GetIdempotencyKey()),
		))
		switch {
		case e.GetDelegate() != nil:
			s.SetAttributes(attribute.String(attrAgent, e.GetDelegate().GetAgentId()))
		case e.GetHandoff() != nil:
			s.SetAttributes(attribute.String(attrAgent, e.GetHandoff().GetAgentId()))
		}
		s.End()
	}
}

// effectKind is the effect's kind as the proto names it: write_memory,
// delegate, handoff, ...
func effectKind(e *typesv1.Effect) string {
	m := e.ProtoReflect()
	if od := m.Descriptor().Oneofs().ByName("kind"); od != nil {
		if fd := m.WhichOneof(od); fd != nil {
			return string(fd.Name())
		}
	}
	return "unknown"
}

// outcomeOf is a call's outcome: the operator's exit kind, lower case
// without its prefix (complete, max_turns, suspended...), or the error's
// class.
func outcomeOf(out *operatorv1.OperatorOutput, err error) string {
	if err != nil {
		if r := errs.Reason(err); r != "" {
			return strings.ToLower(r)
		}
		if errors.Is(err, context.Canceled) {
			return "canceled"
		}
		return "error"
	}
	return strings.ToLower(strings.TrimPrefix(out.GetExitReason().GetKind().String(), "EXIT_KIND_"))
}

// ObserveWorkflows counts workflows by status and the workflows waiting
// for approval from bus's events, until ctx ends. The counts are of this
// process's life: a restart starts them again (the journal's workflows
// resumed are not started again).
func ObserveWorkflows(ctx context.Context, bus *lifecycle.Bus) error {
	if bus == nil {
		return nil
	}
	sub, err := bus.Subscribe(lifecycle.Filter{}, nil)
	if err != nil {
		return err
	}
	go func() {
		defer sub.Close()
		waiting := map[string]bool{}
		for {
			select {
			case d := <-sub.C():
				if d.Event != nil {
					observe(ctx, d.Event, waiting)
				}
			case <-sub.Done():
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return nil
}

// observe counts one lifecycle event; waiting holds the workflows counted
// as waiting for approval.
func observe(ctx context.Context, ev *lifecyclev1.LifecycleEvent, waiting map[string]bool) {
	t := ev.GetObservable().GetEventType()
	status, ok := strings.CutPrefix(t, "orchestrator.workflow.")
	if !ok {
		if t == "orchestrator.signal.accepted" && waiting[ev.GetWorkflowId()] {
			delete(waiting, ev.GetWorkflowId())
			orchMeters.waiting.Add(ctx, -1)
		}
		return
	}
	wf := ev.GetWorkflowId()
	switch status {
	case "started", "completed", "failed", "canceled":
		orchMeters.workflows.Add(ctx, 1, metric.WithAttributes(attribute.String(attrStatus, status)))
		if waiting[wf] {
			delete(waiting, wf)
			orchMeters.waiting.Add(ctx, -1)
		}
	case "suspended":
		if !waiting[wf] {
			waiting[wf] = true
			orchMeters.waiting.Add(ctx, 1)
		}
	}
}

// Workflow spans. A workflow's "workflow {agent}" span covers it from
// start to end, its steps' dispatch spans under it. A workflow may
// outlive the process that started it (a restart resumes it from the
// journal), so the span is not recorded live: WorkflowTrace chooses its
// ids when the workflow starts, the engine journals them as the
// workflow's trace context (every step, replayed or not, runs under it),
// and EndWorkflowSpan reports the span once, when the workflow ends,
// with those ids and its start time. A resumed workflow therefore has
// one workflow span, never a second root for its replayed steps.

// parentSpanKey is the trace-context entry that keeps the workflow
// span's own parent (the span of the call that started it).
const parentSpanKey = "neuron-workflow-parent"

// WorkflowTrace is the trace context a new workflow journals: ctx's
// trace, with a fresh span id for the workflow's span, whose parent is
// ctx's span. When ctx's span is not sampled, it is ctx's trace context
// as it is (no workflow span).
func WorkflowTrace(ctx context.Context) map[string]string {
	tc := map[string]string{}
	parent := trace.SpanContextFromContext(ctx)
	if !parent.IsSampled() {
		propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(tc))
		return tc
	}
	_, s := idTracer.Start(ctx, "")
	wf := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: parent.TraceID(), SpanID: s.SpanContext().SpanID(),
		TraceFlags: parent.TraceFlags(), TraceState: parent.TraceState(),
	})
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(ctx, wf), propagation.MapCarrier(tc))
	tc[parentSpanKey] = parent.SpanID().String()
	return tc
}

// idTracer only makes span ids.
var idTracer = sdktrace.NewTracerProvider().Tracer("")

// EndWorkflowSpan reports the span of a workflow that ended: the one
// WorkflowTrace chose for it (tc is its journaled trace context), from
// created to ended, with its status. A trace context WorkflowTrace did
// not make reports nothing.
func EndWorkflowSpan(tc map[string]string, id, agent string, status orchestratorv1.WorkflowStatus, created, ended time.Time) {
	parent, err := trace.SpanIDFromHex(tc[parentSpanKey])
	if err != nil {
		return
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(tc)))
	if !sc.IsValid() || !sc.IsSampled() {
		return
	}
	st := strings.ToLower(strings.TrimPrefix(status.String(), "WORKFLOW_STATUS_"))
	stub := tracetest.SpanStub{
		Name:        "workflow " + agent,
		SpanContext: sc.WithRemote(false),
		Parent: trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: sc.TraceID(), SpanID: parent, TraceFlags: sc.TraceFlags(), Remote: true,
		}),
		SpanKind:  trace.SpanKindInternal,
		StartTime: created,
		EndTime:   ended,
		Attributes: []attribute.KeyValue{
			attribute.String(attrWorkflow, id),
			attribute.String(attrAgent, agent),
			attribute.String(attrStatus, st),
		},
		InstrumentationScope: sdkinstrumentation.Scope{Name: instrumentationName},
	}
	if status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		stub.Status = sdktrace.Status{Code: codes.Error, Description: "workflow " + st}
	}
	telemetry.EmitSpan(stub)
}
