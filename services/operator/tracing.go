package operator

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// Spans and metrics of an invocation, in the OpenTelemetry GenAI
// semantic conventions: invoke_agent per invocation, "chat {model}" per
// model call, "execute_tool {name}" per tool call. They go to the
// process's providers (pkg/telemetry, installed by --otel-endpoint);
// without them the spans are non-recording and cost next to nothing.
// Message content is recorded only with --otel-capture-content.

// instrumentation is the operator's tracer and meter name.
const instrumentation = "github.com/secbear/neuron/services/operator"

// GenAI attribute keys (semantic conventions, development status: the Go
// semconv package does not carry them yet), and ours.
const (
	attrOperation      = "gen_ai.operation.name"
	attrProvider       = "gen_ai.provider.name"
	attrRequestModel   = "gen_ai.request.model"
	attrResponseModel  = "gen_ai.response.model"
	attrFinishReasons  = "gen_ai.response.finish_reasons"
	attrInputTokens    = "gen_ai.usage.input_tokens"
	attrOutputTokens   = "gen_ai.usage.output_tokens"
	attrCacheRead      = "gen_ai.usage.cache_read.input_tokens"
	attrCacheWrite     = "gen_ai.usage.cache_creation.input_tokens"
	attrAgentName      = "gen_ai.agent.name"
	attrAgentID        = "gen_ai.agent.id"
	attrConversationID = "gen_ai.conversation.id"
	attrToolName       = "gen_ai.tool.name"
	attrToolCallID     = "gen_ai.tool.call.id"
	attrToolType       = "gen_ai.tool.type"
	attrToolArgs       = "gen_ai.tool.call.arguments"
	attrToolResult     = "gen_ai.tool.call.result"
	attrInputMessages  = "gen_ai.input.messages"
	attrOutputMessages = "gen_ai.output.messages"
	attrSystem         = "gen_ai.system_instructions"
	attrTokenType      = "gen_ai.token.type"
	attrErrorType      = "error.type"
	// Ours: a model call's (or an invocation's) cost in USD; a tool
	// call's outcome (ok, error, effect); the invocation's exit kind,
	// dispatch and workflow.
	attrCost       = "neuron.gen_ai.cost_usd"
	attrOutcome    = "neuron.tool.outcome"
	attrExit       = "neuron.exit_kind"
	attrTurns      = "neuron.turns"
	attrDispatchID = "neuron.dispatch_id"
	attrWorkflowID = "neuron.workflow_id"
)

// instruments are the operator's metrics.
type instruments struct {
	tokens    metric.Int64Histogram   // gen_ai.client.token.usage
	duration  metric.Float64Histogram // gen_ai.client.operation.duration
	cost      metric.Float64Counter   // neuron.gen_ai.cost
	toolCalls metric.Int64Counter     // neuron.tool.calls
	toolTime  metric.Float64Histogram // neuron.tool.duration
}

// meters is built on first use, from the global meter provider (which
// delegates to the one pkg/telemetry installs later).
var meters = func() *instruments {
	m := otel.Meter(instrumentation)
	var in instruments
	in.tokens, _ = m.Int64Histogram("gen_ai.client.token.usage", metric.WithUnit("{token}"),
		metric.WithDescription("tokens of a model call, by gen_ai.token.type (input, output), model and agent"),
		metric.WithExplicitBucketBoundaries(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304))
	in.duration, _ = m.Float64Histogram("gen_ai.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("latency of a model call"),
		metric.WithExplicitBucketBoundaries(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92))
	in.cost, _ = m.Float64Counter("neuron.gen_ai.cost", metric.WithUnit("USD"),
		metric.WithDescription("cost of model calls, by model and agent"))
	in.toolCalls, _ = m.Int64Counter("neuron.tool.calls", metric.WithUnit("{call}"),
		metric.WithDescription("tool calls, by tool and outcome (ok, error, effect)"))
	in.toolTime, _ = m.Float64Histogram("neuron.tool.duration", metric.WithUnit("s"),
		metric.WithDescription("latency of a tool call, by tool"))
	return &in
}()

// tracerOr is the invocation's tracer, or the process's when the
// invocation span was never started.
func (r *run) tracerOr() trace.Tracer {
	if r.tracer == nil {
		return otel.Tracer(instrumentation)
	}
	return r.tracer
}

// capture says whether message content goes on spans.
func (r *run) capture() bool { return r.op.cfg.Server.OTel.CaptureContent }

// agentName is the agent the invocation runs as: the dispatch's agent id,
// else "operator".
func (r *run) agentName() string {
	if a := r.in.GetDispatch().GetAgentId(); a != "" {
		return a
	}
	return "operator"
}

// traceInvocation starts the invoke_agent span; end finishes it with the
// invocation's outcome.
func (r *run) traceInvocation(ctx context.Context) (context.Context, func(*operatorv1.OperatorOutput, error)) {
	agent := r.agentName()
	attrs := []attribute.KeyValue{
		attribute.String(attrOperation, "invoke_agent"),
		attribute.String(attrProvider, r.provider.Name()),
		attribute.String(attrRequestModel, r.model),
		attribute.String(attrAgentName, agent),
		attribute.String(attrAgentID, agent),
	}
	d := r.in.GetDispatch()
	if id := d.GetDispatchId(); id != "" {
		attrs = append(attrs, attribute.String(attrDispatchID, id))
	}
	if id := d.GetWorkflowId(); id != "" {
		attrs = append(attrs, attribute.String(attrWorkflowID, id))
	}
	if r.in.SessionId != nil {
		attrs = append(attrs, attribute.String(attrConversationID, r.in.GetSessionId()))
	}
	// The process's tracer provider as it is now (tests install one
	// after the package is loaded).
	r.tracer = otel.Tracer(instrumentation)
	ctx, span := r.tracer.Start(ctx, "invoke_agent "+agent, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	if !span.IsRecording() {
		return ctx, func(*operatorv1.OperatorOutput, error) { span.End() }
	}
	if r.capture() && r.lim.system != "" {
		span.SetAttributes(attribute.String(attrSystem, r.lim.system))
	}
	return ctx, func(out *operatorv1.OperatorOutput, err error) {
		defer span.End()
		if err != nil {
			endError(span, err)
			return
		}
		kind := out.GetExitReason().GetKind()
		span.SetAttributes(
			attribute.String(attrExit, kind.String()),
			attribute.Int64(attrTurns, int64(r.turns)),
			attribute.Int64(attrInputTokens, int64(r.usage.InputTokens)),
			attribute.Int64(attrOutputTokens, int64(r.usage.OutputTokens)),
			attribute.Float64(attrCost, r.cost.InexactFloat64()),
		)
		if r.answered != "" {
			span.SetAttributes(attribute.String(attrResponseModel, r.answered))
		}
		switch kind {
		case operatorv1.ExitKind_EXIT_KIND_COMPLETE, operatorv1.ExitKind_EXIT_KIND_SUSPENDED:
		default:
			span.SetStatus(codes.Error, out.GetExitReason().GetMessage())
			span.SetAttributes(attribute.String(attrErrorType, kind.String()))
		}
	}
}

// traceChat starts the "chat {model}" span of one model call; end
// finishes it with the response (or error) and records the call's
// metrics.
func (r *run) traceChat(ctx context.Context, req *provider.Request) (context.Context, func(*provider.Response, error)) {
	start := time.Now()
	ctx, span := r.tracerOr().Start(ctx, "chat "+req.Model, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String(attrOperation, "chat"),
		attribute.String(attrProvider, r.provider.Name()),
		attribute.String(attrRequestModel, req.Model),
	))
	if span.IsRecording() && r.capture() {
		span.SetAttributes(attribute.String(attrInputMessages, messagesJSON(req.Messages)))
	}
	return ctx, func(resp *provider.Response, err error) {
		defer span.End()
		model := req.Model
		if resp != nil && resp.Model != "" {
			model = resp.Model
		}
		common := []attribute.KeyValue{
			attribute.String(attrOperation, "chat"),
			attribute.String(attrProvider, r.provider.Name()),
			attribute.String(attrRequestModel, req.Model),
			attribute.String(attrResponseModel, model),
			attribute.String(attrAgentName, r.agentName()),
		}
		if err != nil {
			common = append(common, attribute.String(attrErrorType, errorType(err)))
			meters.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(common...))
			endError(span, err)
			return
		}
		meters.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(common...))
		u := resp.Usage
		meters.tokens.Record(ctx, int64(u.InputTokens), metric.WithAttributes(append(common, attribute.String(attrTokenType, "input"))...))
		meters.tokens.Record(ctx, int64(u.OutputTokens), metric.WithAttributes(append(common, attribute.String(attrTokenType, "output"))...))
		meters.cost.Add(ctx, resp.Cost.InexactFloat64(), metric.WithAttributes(common...))
		if !span.IsRecording() {
			return
		}
		span.SetAttributes(
			attribute.String(attrResponseModel, model),
			attribute.StringSlice(attrFinishReasons, []string{finishReason(resp.Stop)}),
			attribute.Int64(attrInputTokens, int64(u.InputTokens)),
			attribute.Int64(attrOutputTokens, int64(u.OutputTokens)),
			attribute.Int64(attrCacheRead, int64(u.CacheReadTokens)),
			attribute.Int64(attrCacheWrite, int64(u.CacheWriteTokens)),
			attribute.Float64(attrCost, resp.Cost.InexactFloat64()),
		)
		if r.capture() {
			span.SetAttributes(attribute.String(attrOutputMessages, messagesJSON([]provider.Message{{Role: provider.Assistant, Parts: resp.Parts}})))
		}
	}
}

// traceTool starts the "execute_tool {name}" span of a call that runs;
// end finishes it with the call's outcome and records its metrics.
func (r *run) traceTool(ctx context.Context, c *call) (context.Context, func()) {
	start := time.Now()
	ctx, span := r.tracerOr().Start(ctx, "execute_tool "+c.use.Name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		attribute.String(attrOperation, "execute_tool"),
		attribute.String(attrToolName, c.use.Name),
		attribute.String(attrToolCallID, c.use.ID),
		attribute.String(attrToolType, "function"),
	))
	if span.IsRecording() && r.capture() {
		span.SetAttributes(attribute.String(attrToolArgs, string(c.input)))
	}
	return ctx, func() {
		defer span.End()
		outcome := "ok"
		switch {
		case c.result.IsError:
			outcome = "error"
		case c.effect != nil:
			outcome = "effect"
		}
		attrs := metric.WithAttributes(attribute.String(attrToolName, c.use.Name), attribute.String(attrOutcome, outcome), attribute.String(attrAgentName, r.agentName()))
		meters.toolCalls.Add(ctx, 1, attrs)
		meters.toolTime.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attribute.String(attrToolName, c.use.Name)))
		span.SetAttributes(attribute.String(attrOutcome, outcome))
		if c.result.IsError {
			span.SetStatus(codes.Error, firstLine(c.result.Content))
			span.SetAttributes(attribute.String(attrErrorType, "tool_error"))
		}
		if r.capture() {
			span.SetAttributes(attribute.String(attrToolResult, c.result.Content))
		}
	}
}

// endError marks span failed with err.
func endError(span trace.Span, err error) {
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(attribute.String(attrErrorType, errorType(err)))
}

// errorType is err's class for error.type: its pkg/errs kind, else
// "_OTHER" as the conventions spell an unknown class.
func errorType(err error) string {
	var k *errs.Kind
	if errors.As(err, &k) {
		return k.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	if errors.Is(err, context.Canceled) {
		return "cancelled"
	}
	return "_OTHER"
}

// finishReason is a stop reason in the conventions' words.
func finishReason(s provider.StopReason) string {
	switch s {
	case provider.StopEndTurn:
		return "stop"
	case provider.StopToolUse:
		return "tool_call"
	case provider.StopMaxTokens:
		return "length"
	case provider.StopContentFilter:
		return "content_filter"
	}
	return s.String()
}

// messagesJSON is msgs in the conventions' message shape: role and parts
// (text, tool_call, tool_call_response). Images are named, not included.
func messagesJSON(msgs []provider.Message) string {
	type part struct {
		Type      string          `json:"type"`
		Content   string          `json:"content,omitempty"`
		ID        string          `json:"id,omitempty"`
		Name      string          `json:"name,omitempty"`
		Arguments json.RawMessage `json:"arguments,omitempty"`
		Response  string          `json:"response,omitempty"`
	}
	type message struct {
		Role  string `json:"role"`
		Parts []part `json:"parts"`
	}
	out := make([]message, 0, len(msgs))
	for _, m := range msgs {
		mm := message{Role: m.Role.String(), Parts: []part{}}
		for _, p := range m.Parts {
			switch {
			case p.ToolUse != nil:
				args := p.ToolUse.Input
				if !json.Valid(args) {
					args = nil
				}
				mm.Parts = append(mm.Parts, part{Type: "tool_call", ID: p.ToolUse.ID, Name: p.ToolUse.Name, Arguments: args})
			case p.ToolResult != nil:
				mm.Parts = append(mm.Parts, part{Type: "tool_call_response", ID: p.ToolResult.ToolUseID, Response: p.ToolResult.Content})
			case p.Image != nil:
				mm.Parts = append(mm.Parts, part{Type: "image", Content: p.Image.MediaType})
			default:
				mm.Parts = append(mm.Parts, part{Type: "text", Content: p.Text})
			}
		}
		out = append(out, mm)
	}
	b, _ := json.Marshal(out)
	return string(b)
}
