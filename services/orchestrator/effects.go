package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
)

// EffectHandler executes custom effects of one effect_type. It receives
// the effect's idempotency key (unique in the workflow) and must treat a
// repeated key as already done: after a crash a handler may be called
// again for an effect whose outcome was not yet journaled. A returned
// error marks the effect not applied, with the error as its detail.
type EffectHandler func(ctx context.Context, workflowID, idempotencyKey string, data *structpb.Value) error

// effectKey is an effect's idempotency key; an operator that left it
// empty gets one derived from the dispatch and position.
func effectKey(dispatchID string, i int, eff *typesv1.Effect) string {
	if k := eff.GetIdempotencyKey(); k != "" {
		return k
	}
	return fmt.Sprintf("%s/effect/%d", dispatchID, i)
}

// stateKey is the State service idempotency key of an effect: unique
// across workflows, at most 512 bytes.
func stateKey(workflowID, key string) string {
	k := workflowID + "/" + key
	if len(k) > 512 {
		sum := sha256.Sum256([]byte(k))
		k = "sha256:" + hex.EncodeToString(sum[:])
	}
	return k
}

// guardError is a delegation guard (depth, cycle) tripping: it fails the
// workflow with FAILED_PRECONDITION.
func guardError(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errs.FailedPrecondition)...)
}

// effects executes an output's effects in declaration order, each once.
// Delegates run their child agents to the end; the first Handoff is
// returned for the caller to follow. With halt set (the budget is spent)
// dispatching effects are recorded as not applied.
func (w *runner) effects(ctx context.Context, f frame, dispatchID string, out *operatorv1.OperatorOutput, halt error) ([]delegation, *handoffTarget, error) {
	var (
		results []delegation
		handoff *handoffTarget
	)
	for i, eff := range out.GetEffects() {
		key := effectKey(dispatchID, i, eff)
		prev, err := w.e.j.Effect(w.id, key)
		if err != nil {
			return nil, nil, err
		}
		switch k := eff.GetKind().(type) {
		case *typesv1.Effect_Delegate:
			d, err := w.delegate(ctx, f, dispatchID, key, k.Delegate, prev, halt)
			if err != nil {
				return nil, nil, err
			}
			results = append(results, d)
		case *typesv1.Effect_Handoff:
			target := k.Handoff.GetAgentId()
			if prev != nil {
				if prev.Applied && handoff == nil {
					handoff = &handoffTarget{target: target, from: f.agent.ID, key: key, state: k.Handoff.GetState()}
				}
				continue
			}
			var detail string
			ok := false
			switch {
			case handoff != nil:
				detail = fmt.Sprintf("not followed: this output already handed off to %q; only the first handoff counts", handoff.target)
			case halt != nil:
				detail = "not followed: the workflow budget is spent"
			default:
				if _, err := w.e.reg.Lookup(target); err != nil {
					detail = "not followed: " + err.Error()
				}
			}
			if detail == "" {
				handoff = &handoffTarget{target: target, from: f.agent.ID, key: key, state: k.Handoff.GetState()}
				detail, ok = fmt.Sprintf("handed off to %q", target), true
			}
			if err := w.record(f, dispatchID, key, "handoff", ok, detail); err != nil {
				return nil, nil, err
			}
		default:
			if prev != nil {
				continue
			}
			applied, detail, err := w.apply(ctx, f, key, eff)
			if err != nil {
				return nil, nil, err
			}
			if err := w.record(f, dispatchID, key, effectKind(eff), applied, detail); err != nil {
				return nil, nil, err
			}
		}
	}
	return results, handoff, nil
}

// delegate runs (or replays) a Delegate effect's child agent.
func (w *runner) delegate(ctx context.Context, f frame, dispatchID, key string, d *typesv1.Delegate, prev *effectRecord, halt error) (delegation, error) {
	res := delegation{agent: d.GetAgentId(), key: key}
	if prev != nil && !prev.Applied {
		res.text = prev.Detail
		return res, nil
	}
	notRun := func(detail string) (delegation, error) {
		res.text = detail
		return res, w.record(f, dispatchID, key, "delegate", false, detail)
	}
	if prev == nil && halt != nil {
		return notRun("not run: the workflow budget is spent")
	}
	child, err := w.e.reg.Lookup(d.GetAgentId())
	if err != nil {
		if prev != nil {
			return res, err // ran before; the registry changed since
		}
		return notRun(err.Error())
	}
	chain := append(append([]string(nil), f.chain...), child.ID)
	if slices.Contains(f.chain, child.ID) {
		return res, guardError("delegation cycle: %s", strings.Join(chain, " -> "))
	}
	if f.depth+1 > w.e.opts.MaxDepth {
		return res, guardError("delegation depth limit of %d reached: %s", w.e.opts.MaxDepth, strings.Join(chain, " -> "))
	}
	in := &operatorv1.OperatorInput{Message: d.GetMessage(), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK, Metadata: d.GetMetadata()}
	if d.GetSessionId() != "" {
		s := d.GetSessionId()
		in.SessionId = &s
	}
	if in.Message == nil {
		in.Message = &typesv1.Content{}
	}
	out, err := w.agent(ctx, frame{agent: child, depth: f.depth + 1, chain: chain, parent: dispatchID, cause: key}, in, false)
	var failed *agentError
	switch {
	case errors.As(err, &failed):
		res.text = "failed: " + failed.err.Error()
		if prev == nil {
			return res, w.record(f, dispatchID, key, "delegate", false, res.text)
		}
		return res, nil
	case err != nil:
		return res, err
	}
	res.ok = true
	res.text = content.TextOf(out.GetMessage())
	res.exit = strings.TrimPrefix(out.GetExitReason().GetKind().String(), "EXIT_KIND_")
	if prev != nil {
		return res, nil
	}
	return res, w.record(f, dispatchID, key, "delegate", true, fmt.Sprintf("agent %q ran (%s)", child.ID, res.exit))
}

// record journals an effect's outcome and reports it.
func (w *runner) record(f frame, dispatchID, key, kind string, applied bool, detail string) error {
	if err := w.e.j.RecordEffect(w.id, key, &effectRecord{Applied: applied, Detail: detail, Step: w.n, Time: time.Now()}); err != nil {
		return err
	}
	t := "orchestrator.effect.applied"
	if !applied {
		t = "orchestrator.effect.not_applied"
		w.e.log.Warn("effect not applied", "workflow_id", w.id, "agent", f.agent.ID, "effect", kind, "key", key, "detail", detail)
	}
	w.e.event(w.id, f.agent.ID, t, map[string]any{"dispatch_id": dispatchID, "effect": kind, "idempotency_key": key, "detail": detail})
	return nil
}

func effectKind(eff *typesv1.Effect) string {
	switch eff.GetKind().(type) {
	case *typesv1.Effect_WriteMemory:
		return "write_memory"
	case *typesv1.Effect_DeleteMemory:
		return "delete_memory"
	case *typesv1.Effect_Signal:
		return "signal"
	case *typesv1.Effect_Delegate:
		return "delegate"
	case *typesv1.Effect_Handoff:
		return "handoff"
	case *typesv1.Effect_Log:
		return "log"
	case *typesv1.Effect_Custom:
		return "custom:" + eff.GetCustom().GetEffectType()
	}
	return "unknown"
}

// effectEnv is what executing a non-dispatching effect needs; both
// backends provide one.
type effectEnv struct {
	state    statev1.StateServiceClient
	handlers map[string]EffectHandler
	// signal queues a signal for a workflow of this orchestrator, keyed
	// so that a repeat is a duplicate. Unknown or ended workflows are
	// errs.NotFound or errs.FailedPrecondition.
	signal  func(ctx context.Context, workflowID string, payload []byte, key string) (seq uint64, dup bool, err error)
	publish func(*lifecyclev1.LifecycleEvent)
}

// apply executes a non-dispatching effect, retrying transient State
// failures with capped backoff for as long as the workflow runs: an
// effect is never dropped because the State service was briefly away. A
// permanent failure returns applied=false with the reason; err is only
// for a stopped workflow or a broken journal.
func (w *runner) apply(ctx context.Context, f frame, key string, eff *typesv1.Effect) (applied bool, detail string, err error) {
	env := effectEnv{state: w.e.state, handlers: w.e.opts.Handlers, publish: w.e.publish,
		signal: func(_ context.Context, id string, payload []byte, key string) (uint64, bool, error) {
			return w.e.Signal(id, payload, key)
		}}
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		applied, detail, err := applyEffect(ctx, env, w.id, f.agent.ID, key, eff)
		if err == nil || !transient(err) || ctx.Err() != nil {
			if ctx.Err() != nil {
				return false, "", context.Cause(ctx)
			}
			return applied, detail, err
		}
		w.e.log.Warn("state service unavailable; retrying the effect", "workflow_id", w.id, "effect", effectKind(eff), "attempt", attempt, "err", err)
		if err := w.e.opts.Sleep(ctx, backoff); err != nil {
			return false, "", err
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

// transient says whether a State failure may pass if the effect is
// tried again.
func transient(err error) bool {
	switch errs.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

// applyEffect executes a non-dispatching effect of workflow wfID once.
// A permanent failure returns applied=false with the reason; err is a
// transient State failure (see transient), ctx's end, or a broken
// journal.
func applyEffect(ctx context.Context, env effectEnv, wfID, agentID, key string, eff *typesv1.Effect) (applied bool, detail string, err error) {
	switch k := eff.GetKind().(type) {
	case *typesv1.Effect_WriteMemory:
		m := k.WriteMemory
		return stateCall(ctx, env, "write", func(ctx context.Context) (string, error) {
			resp, err := env.state.Write(ctx, &statev1.WriteRequest{Scope: m.GetScope(), Key: m.GetKey(), Value: m.GetValue(), IdempotencyKey: stateKey(wfID, key)})
			if err != nil {
				return "", err
			}
			if resp.GetReplayed() {
				return fmt.Sprintf("written earlier (revision %d)", resp.GetRevision()), nil
			}
			return fmt.Sprintf("written (revision %d)", resp.GetRevision()), nil
		})
	case *typesv1.Effect_DeleteMemory:
		m := k.DeleteMemory
		return stateCall(ctx, env, "delete", func(ctx context.Context) (string, error) {
			resp, err := env.state.Delete(ctx, &statev1.DeleteRequest{Scope: m.GetScope(), Key: m.GetKey(), IdempotencyKey: stateKey(wfID, key)})
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("deleted (existed: %v)", resp.GetExisted()), nil
		})
	case *typesv1.Effect_Signal:
		s := k.Signal
		payload, err := proto.Marshal(s.GetPayload())
		if err != nil {
			return false, "the signal payload cannot be encoded: " + err.Error(), nil
		}
		seq, dup, err := env.signal(ctx, s.GetWorkflowId(), payload, stateKey(wfID, key))
		switch {
		case errors.Is(err, errs.NotFound), errors.Is(err, errs.FailedPrecondition):
			return false, err.Error(), nil
		case err != nil:
			return false, "", err
		case dup:
			return true, fmt.Sprintf("delivered earlier as signal %d of workflow %q", seq, s.GetWorkflowId()), nil
		}
		return true, fmt.Sprintf("queued as signal %d of workflow %q", seq, s.GetWorkflowId()), nil
	case *typesv1.Effect_Log:
		l := k.Log
		data := map[string]any{"level": strings.TrimPrefix(l.GetLevel().String(), "LOG_LEVEL_"), "message": l.GetMessage(), "idempotency_key": key}
		if l.GetData() != nil {
			data["data"] = l.GetData().AsInterface()
		}
		env.publish(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, "operator.log", wfID, agentID, data))
		return true, "published as an observable event", nil
	case *typesv1.Effect_Custom:
		c := k.Custom
		h := env.handlers[c.GetEffectType()]
		if h == nil {
			env.publish(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, "orchestrator.effect.unhandled", wfID, agentID,
				map[string]any{"effect_type": c.GetEffectType(), "idempotency_key": key}))
			return false, fmt.Sprintf("no handler is registered for custom effect type %q", c.GetEffectType()), nil
		}
		if err := h(ctx, wfID, key, c.GetData()); err != nil {
			if ctx.Err() != nil {
				return false, "", context.Cause(ctx)
			}
			return false, "handler failed: " + err.Error(), nil
		}
		return true, "handled", nil
	}
	raw, _ := protojson.Marshal(eff)
	return false, fmt.Sprintf("unknown effect kind (an operator newer than this orchestrator?): %s", raw), nil
}

// stateCall runs a State call once. A transient failure is returned as
// err; a permanent one (bad scope, value too large, ...) is not applied,
// with the reason.
func stateCall(ctx context.Context, env effectEnv, op string, call func(ctx context.Context) (string, error)) (bool, string, error) {
	if env.state == nil {
		return false, "no State service is configured (--state-addr); memory effects cannot be applied", nil
	}
	detail, err := call(ctx)
	switch {
	case err == nil:
		return true, detail, nil
	case ctx.Err() != nil:
		return false, "", context.Cause(ctx)
	case transient(err):
		return false, "", fmt.Errorf("state %s: %w", op, err)
	}
	return false, fmt.Sprintf("state %s refused: %s", op, errs.ToStatus(err).Message()), nil
}
