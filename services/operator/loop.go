package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider"
)

// errMaxDuration is the cause of the loop's context when max_duration (or
// the caller's deadline, less a grace period) runs out.
var errMaxDuration = errors.New("max duration reached")

// run is the state of one invocation.
type run struct {
	op       *Operator
	in       *operatorv1.OperatorInput
	lim      limits
	provider provider.Provider
	model    string
	specs    []provider.ToolSpec
	tools    *toolset
	// strategy is the invocation's context strategy; strict refuses a
	// conversation that does not fit instead (context_strategy NONE).
	strategy compaction.Strategy
	strict   bool
	allowed  map[string]bool
	events   Events
	log      *slog.Logger
	start    time.Time
	keyBase  string
	// metadata is the input's metadata as providers take it, converted
	// once per invocation (nil without metadata); providers only read it.
	metadata map[string]any
	// callerBound is set when the caller's deadline, not max_duration,
	// bounds the loop.
	callerBound bool
	// resume is the state a resumed invocation continues from, and
	// decided the person's decisions on its waiting calls; nil otherwise.
	resume  *resumeState
	decided map[string]decision
	// oneShot is set for a one-shot invocation (a process of its own).
	oneShot bool
	// base is the counters a resumed invocation started from: its
	// metadata reports only what it consumed itself, while its limits
	// count from the first invocation.
	base counters

	messages  []provider.Message // the whole context sent to the model
	newTurns  []provider.Message // what this invocation adds to history
	lastText  []provider.Part    // text of the latest assistant message
	usage     provider.Usage
	cost      decimal.Decimal
	answered  string // the model that last answered
	turns     uint32
	effects   []*typesv1.Effect
	records   []*operatorv1.SubDispatchRecord
	failures  int // consecutive failed tool calls
	nextEffID int
	emitMu    sync.Mutex // parallel tool calls emit concurrently
	// tracer starts the invocation's spans (tracing.go).
	tracer trace.Tracer
	// mem follows the session's persisted summary through compactions
	// (summary.go); nil when the history has none to offer.
	mem *sessionMemory
	// pressured is set once ContextPressure was published, until a
	// compaction brings the context back under the threshold.
	pressured bool
}

// counters are the loop's running totals.
type counters struct {
	turns uint32
	usage provider.Usage
	cost  decimal.Decimal
}

// exit builds an ExitReason.
func exit(kind operatorv1.ExitKind, format string, args ...any) *operatorv1.ExitReason {
	return &operatorv1.ExitReason{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// deadline is when the loop must stop: max_duration, or shortly before the
// caller's own deadline so that the caller still receives the output.
func (r *run) deadline(ctx context.Context) time.Time {
	d := r.start.Add(r.lim.maxDuration)
	if cd, ok := ctx.Deadline(); ok {
		grace := min(time.Second, time.Until(cd)/10)
		if cd.Add(-grace).Before(d) {
			d = cd.Add(-grace)
			r.callerBound = true
		}
	}
	return d
}

func (r *run) execute(ctx context.Context) (*operatorv1.OperatorOutput, error) {
	loopCtx, cancel := context.WithDeadlineCause(ctx, r.deadline(ctx), errMaxDuration)
	defer cancel()

	if sid := r.in.GetSessionId(); r.in.SessionId != nil && r.lim.history {
		var hist []provider.Message
		var err error
		if sl, ok := r.op.history.(sessionLoader); ok {
			var s *loadedSession
			if s, err = sl.LoadSession(loopCtx, sid, r.op.cfg.HistoryEntries); err == nil {
				hist, r.mem = s.messages, newSessionMemory(s)
			}
		} else {
			hist, err = r.op.history.Load(loopCtx, sid, r.op.cfg.HistoryEntries)
		}
		if err != nil {
			if reason, ok := r.timedOut(ctx, loopCtx); ok {
				return r.finish(reason)
			}
			return nil, err
		}
		r.messages = hist
	}
	// Room for the task and a few tool turns (an assistant message and
	// its results each) before the slices grow.
	const turns = 1 + 2*3
	r.messages = append(make([]provider.Message, 0, len(r.messages)+turns+1), r.messages...)
	r.newTurns = make([]provider.Message, 0, turns+1)
	// uses are the tool calls of the turn to act on: a resumed turn's,
	// else the model's next.
	var uses []*provider.ToolUse
	decided := r.decided
	if r.resume != nil {
		uses = r.resumeFrom(r.resume)
	} else {
		user := provider.Message{Role: provider.User, Parts: toParts(r.in.GetMessage(), r.log)}
		r.messages = append(r.messages, user)
		r.newTurns = append(r.newTurns, user)
	}

	for {
		if uses == nil {
			var reason *operatorv1.ExitReason
			var err error
			uses, reason, err = r.infer(ctx, loopCtx)
			if err != nil {
				if reason, ok := r.timedOut(ctx, loopCtx); ok {
					return r.finish(reason)
				}
				return nil, err
			}
			if reason != nil {
				return r.finish(reason)
			}
		}

		halt, waiting, err := r.runTools(loopCtx, uses, decided)
		if err != nil {
			return nil, err
		}
		if len(waiting) > 0 {
			return r.suspend(waiting, decided)
		}
		uses, decided = nil, nil
		if halt != nil {
			return r.finish(halt)
		}
		if reason := r.checkLimits(ctx, loopCtx); reason != nil {
			return r.finish(reason)
		}
		if reason := r.hookHalt(loopCtx, operatorv1.HookPoint_HOOK_POINT_EXIT_CHECK, nil); reason != nil {
			return r.finish(reason)
		}
	}
}

// infer runs one model turn: the pre-inference hooks, the context
// strategy, the model call and the post-inference hooks. It returns the
// turn's tool calls, or the reason the loop ends (a halt, or a final
// answer: COMPLETE).
func (r *run) infer(ctx, loopCtx context.Context) ([]*provider.ToolUse, *operatorv1.ExitReason, error) {
	if reason := r.hookHalt(loopCtx, operatorv1.HookPoint_HOOK_POINT_PRE_INFERENCE, nil); reason != nil {
		return nil, reason, nil
	}
	if err := r.compact(loopCtx); err != nil {
		return nil, nil, err
	}
	resp, err := r.callModel(loopCtx)
	if err != nil {
		return nil, nil, err
	}
	assistant := provider.Message{Role: provider.Assistant, Parts: resp.Parts}
	r.messages = append(r.messages, assistant)
	r.newTurns = append(r.newTurns, assistant)
	r.lastText = resp.Parts
	uses := resp.ToolUses()

	if reason := r.hookHalt(loopCtx, operatorv1.HookPoint_HOOK_POINT_POST_INFERENCE, func(hc *operatorv1.HookContext) {
		hc.ModelOutput = textContent(resp.Parts)
	}); reason != nil {
		r.answerPending(uses, "not run: "+reason.GetMessage())
		return nil, reason, nil
	}
	switch resp.Stop {
	case provider.StopMaxTokens:
		return nil, nil, fmt.Errorf("the model's output was cut off at its max-tokens limit in turn %d; raise the output limit or ask for a shorter answer: %w", r.turns, errs.NonRetryable)
	case provider.StopContentFilter:
		return nil, nil, fmt.Errorf("the model provider stopped the response with its content filter in turn %d; rephrase the request: %w", r.turns, errs.NonRetryable)
	}
	if len(uses) == 0 {
		return nil, exit(operatorv1.ExitKind_EXIT_KIND_COMPLETE, ""), nil
	}
	return uses, nil, nil
}

// timedOut reports whether the loop context ended because of max_duration
// while the caller's context is still live.
func (r *run) timedOut(ctx, loopCtx context.Context) (*operatorv1.ExitReason, bool) {
	if ctx.Err() == nil && errors.Is(context.Cause(loopCtx), errMaxDuration) {
		if r.callerBound {
			return exit(operatorv1.ExitKind_EXIT_KIND_TIMEOUT, "stopped after %d turns to answer before the caller's deadline", r.turns), true
		}
		return exit(operatorv1.ExitKind_EXIT_KIND_TIMEOUT, "max duration of %s reached after %d turns", r.lim.maxDuration, r.turns), true
	}
	return nil, false
}

// checkLimits runs the exit checks that follow a turn's tools.
func (r *run) checkLimits(ctx, loopCtx context.Context) *operatorv1.ExitReason {
	if n := r.op.cfg.CircuitBreaker; n > 0 && r.failures >= n {
		return exit(operatorv1.ExitKind_EXIT_KIND_CIRCUIT_BREAKER, "%d consecutive tool calls failed", r.failures)
	}
	if r.lim.costBounded && (r.cost.GreaterThan(r.lim.maxCost) || (r.lim.maxCost.IsPositive() && r.cost.Equal(r.lim.maxCost))) {
		return exit(operatorv1.ExitKind_EXIT_KIND_BUDGET_EXHAUSTED, "spent %s USD of a %s USD budget", r.cost.String(), r.lim.maxCost.String())
	}
	if reason, ok := r.timedOut(ctx, loopCtx); ok {
		return reason
	}
	if r.turns >= r.lim.maxTurns {
		return exit(operatorv1.ExitKind_EXIT_KIND_MAX_TURNS, "max turns (%d) reached and the model still wants to continue", r.lim.maxTurns)
	}
	return nil
}

// compact runs the context strategy before a model call. The stored
// conversation (newTurns) is never compacted, only what the model is
// shown; a summary call's usage and cost count toward the invocation.
// With context_strategy NONE nothing is removed, and a conversation over
// the budget fails FAILED_PRECONDITION (OPERATOR_NON_RETRYABLE: the same
// input would fail again) before the model is called.
func (r *run) compact(ctx context.Context) error {
	budget := r.op.budget(r.model)
	_, _, fits := r.pressure(budget, r.messages)
	if r.strict {
		if est, limit, ok := compaction.Fits(r.lim.system, r.specs, r.messages, budget); !ok {
			return fmt.Errorf("the conversation (%d messages, about %d tokens) does not fit model %s's context budget of %d tokens (a %d-token window less %d reserved for the answer), "+
				"and the agent's context_strategy is NONE, which never removes turns; set context_strategy to COMPACT or TRUNCATE, or start a new session: %w",
				len(r.messages), est, r.model, limit, budget.ContextWindow, budget.Reserve, errs.NonRetryable)
		}
		return nil
	}
	if !fits && r.strategy.Name() != compaction.NameNone {
		r.publishFlush()
	}
	out, rep, err := r.strategy.Compact(ctx, r.lim.system, r.specs, r.messages, budget)
	if err != nil {
		return err
	}
	if rep == nil {
		return nil
	}
	r.mem.compacted(rep, out)
	r.messages = out
	r.usage = r.usage.Add(rep.Usage)
	r.cost = r.cost.Add(rep.Cost)
	freed := max(rep.TokensBefore-rep.TokensAfter, 0)
	r.log.Info("context compacted", "strategy", rep.Strategy, "tokens_before", rep.TokensBefore, "tokens_after", rep.TokensAfter,
		"messages_before", rep.MessagesBefore, "messages_after", rep.MessagesAfter, "over_budget", rep.OverBudget, "err", rep.Err)
	d := r.in.GetDispatch()
	r.op.events.Publish(&lifecyclev1.LifecycleEvent{
		WorkflowId: d.GetWorkflowId(), AgentId: d.GetAgentId(), CorrelationId: d.GetCorrelationId(),
		Event: &lifecyclev1.LifecycleEvent_Compaction{Compaction: &lifecyclev1.CompactionEvent{
			Kind: &lifecyclev1.CompactionEvent_CompactionComplete{CompactionComplete: &lifecyclev1.CompactionComplete{
				AgentId: d.GetAgentId(), Strategy: rep.Strategy, TokensFreed: uint64(freed),
			}},
		}},
	})
	r.pressure(budget, r.messages) // re-arm ContextPressure once back under the threshold
	return nil
}

// callModel runs one model call and accounts for it.
func (r *run) callModel(ctx context.Context) (*provider.Response, error) {
	r.turns++
	turn := r.turns
	req := &provider.Request{
		Model:     r.model,
		System:    r.lim.system,
		Messages:  r.messages,
		Tools:     r.specs,
		MaxTokens: r.lim.maxTokens,
		Metadata:  r.metadata,
		SessionID: r.sessionID(),

		Temperature:     r.lim.temperature,
		ReasoningEffort: r.lim.effort,
		OutputSchema:    r.lim.outputSchema,
	}
	if r.events != nil {
		req.OnText = func(text string) {
			if text == "" {
				return
			}
			// A failed send means the client is gone; its context ends
			// the call, so the error itself can be dropped here.
			_ = r.emit(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{
				TextDelta: &operatorv1.TextDelta{Turn: turn, Text: text},
			}})
		}
	}
	cctx, traced := r.traceChat(ctx, req)
	resp, err := r.provider.Complete(cctx, req)
	traced(resp, err)
	if err != nil {
		return nil, r.modelErr(ctx, err)
	}
	if resp.Cost.IsNegative() {
		return nil, fmt.Errorf("provider %s reported a negative cost %s: %w", r.provider.Name(), resp.Cost, errs.Internal)
	}
	r.usage = r.usage.Add(resp.Usage)
	r.cost = r.cost.Add(resp.Cost)
	r.answered = resp.Model
	if r.answered == "" {
		r.answered = r.model
	}
	if r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("model call", "turn", turn, "model", r.answered, "stop", resp.Stop.String(),
			"tokens_in", resp.Usage.InputTokens, "tokens_out", resp.Usage.OutputTokens, "cost", resp.Cost.String())
	}
	if r.events != nil {
		if err := r.emit(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ModelCallFinished{
			ModelCallFinished: &operatorv1.ModelCallFinished{
				Turn: turn, Model: r.answered,
				TokensIn: resp.Usage.InputTokens, TokensOut: resp.Usage.OutputTokens,
				Cost: money.FromDecimal(resp.Cost), CumulativeCost: money.FromDecimal(r.cost),
			},
		}}); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// sessionID is the session the provider may keep state for (the OpenAI
// Responses API chains calls per session): none when session_history is
// off, since the model must then not see the session's earlier turns.
func (r *run) sessionID() string {
	if !r.lim.history {
		return ""
	}
	return r.in.GetSessionId()
}

// modelErr classifies a provider failure. Providers wrap an errs kind; a
// bare error (a transport failure the provider did not classify) is
// treated as retryable.
func (r *run) modelErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var k *errs.Kind
	if errors.As(err, &k) {
		return fmt.Errorf("model %s (provider %s): %w", r.model, r.provider.Name(), err)
	}
	return fmt.Errorf("model %s (provider %s): %v: %w", r.model, r.provider.Name(), err, errs.Retryable)
}

// emit sends a progress event when streaming. Callers that would build
// an event only to have it dropped check r.events first.
func (r *run) emit(ev *operatorv1.ExecuteStreamResponse) error {
	if r.events == nil {
		return nil
	}
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	if err := r.events(ev); err != nil {
		return fmt.Errorf("sending progress: %w", err)
	}
	return nil
}

// effectKey is the idempotency key of the next declared effect:
// deterministic in the dispatch id and the order of declaration.
func (r *run) effectKey() string {
	r.nextEffID++
	return fmt.Sprintf("%s/effect/%d", r.keyBase, r.nextEffID)
}

// declare records an effect and announces it.
func (r *run) declare(e *typesv1.Effect) error {
	r.effects = append(r.effects, e)
	if r.events == nil {
		return nil
	}
	return r.emit(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_EffectDeclared{
		EffectDeclared: &operatorv1.EffectDeclared{Effect: e},
	}})
}

// finish builds the output: the history effect first (so that a delegate
// or handoff in the same output sees this turn), then the declared
// effects in order.
func (r *run) finish(reason *operatorv1.ExitReason) (*operatorv1.OperatorOutput, error) {
	effects := r.effects
	// A suspended invocation declares no history: its turns travel in
	// the resume token, and the invocation that finishes declares them.
	suspended := reason.GetKind() == operatorv1.ExitKind_EXIT_KIND_SUSPENDED
	if r.in.SessionId != nil && r.lim.history && !suspended {
		value, err := encodeEntry(r.in.GetDispatch().GetDispatchId(), r.newTurns)
		if err != nil {
			return nil, fmt.Errorf("encoding history: %v: %w", err, errs.Internal)
		}
		hist := &typesv1.Effect{
			IdempotencyKey: r.keyBase + "/history",
			Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{
				Scope: scope.Session(r.in.GetSessionId()),
				Key:   fmt.Sprintf("%s%020d-%s", HistoryPrefix, r.start.UnixNano(), shortKey(r.keyBase)),
				Value: value,
				// History is read back by key, not searched, unless the
				// agent asks for it (indexing would cost more than the
				// write).
				Unindexed: !r.in.GetConfig().GetSearchableHistory(),
			}},
		}
		if r.events != nil {
			if err := r.emit(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_EffectDeclared{
				EffectDeclared: &operatorv1.EffectDeclared{Effect: hist},
			}}); err != nil {
				return nil, err
			}
		}
		sum, err := r.mem.effects(hist.GetWriteMemory().GetScope(), r.keyBase)
		if err != nil {
			return nil, err
		}
		if r.events != nil {
			for _, e := range sum {
				if err := r.emit(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_EffectDeclared{
					EffectDeclared: &operatorv1.EffectDeclared{Effect: e},
				}}); err != nil {
					return nil, err
				}
			}
		}
		effects = append(append([]*typesv1.Effect{hist}, sum...), effects...)
	}
	out := &operatorv1.OperatorOutput{
		Message:    textContent(r.lastText),
		ExitReason: reason,
		Effects:    effects,
		Metadata: &operatorv1.OperatorMetadata{
			TokensIn:         r.usage.InputTokens - r.base.usage.InputTokens,
			TokensOut:        r.usage.OutputTokens - r.base.usage.OutputTokens,
			CacheReadTokens:  r.usage.CacheReadTokens - r.base.usage.CacheReadTokens,
			CacheWriteTokens: r.usage.CacheWriteTokens - r.base.usage.CacheWriteTokens,
			Cost:             money.FromDecimal(r.cost.Sub(r.base.cost)),
			TurnsUsed:        r.turns - r.base.turns,
			SubDispatches:    r.records,
			Duration:         durationpb.New(time.Since(r.start)),
			Model:            r.answered,
			Provider:         r.provider.Name(),
		},
	}
	if out.Metadata.Model == "" {
		out.Metadata.Model = r.model
	}
	if r.provider.Name() == provider.ScriptedName {
		out.Annotations = &structpb.Struct{Fields: map[string]*structpb.Value{
			"neuron.model_notice": structpb.NewStringValue("SCRIPTED MODEL: this output came from the built-in deterministic script, not from a language model"),
		}}
	}
	if r.log.Enabled(context.Background(), slog.LevelInfo) {
		r.log.Info("invocation finished", "exit", reason.GetKind().String(), "turns", r.turns,
			"tokens_in", r.usage.InputTokens, "tokens_out", r.usage.OutputTokens, "cost", r.cost.String(),
			"effects", len(effects), "duration", time.Since(r.start).Round(time.Millisecond).String())
	}
	return out, nil
}

// shortKey is a key-safe, bounded form of s for use inside a state key.
func shortKey(s string) string {
	const max = 64
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) > max {
		b = b[:max]
	}
	return string(b)
}
