package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
)

// EffectHandler executes custom effects of one effect_type. It receives
// the effect's idempotency key (unique in the workflow) and must treat a
// repeated key as already done: after a crash a handler may be called
// again for an effect whose outcome was not yet journaled. A returned
// error marks the effect not applied, with the error as its detail.
type EffectHandler func(ctx context.Context, workflowID, idempotencyKey string, data *structpb.Value) error

// EffectKey is an effect's idempotency key; an operator that left it
// empty gets one derived from the dispatch and position.
func EffectKey(dispatchID string, i int, eff *typesv1.Effect) string {
	if k := eff.GetIdempotencyKey(); k != "" {
		return k
	}
	return fmt.Sprintf("%s/effect/%d", dispatchID, i)
}

// StateKey is the State service idempotency key of an effect: unique
// across workflows, at most 512 bytes.
func StateKey(workflowID, key string) string {
	k := workflowID + "/" + key
	if len(k) > 512 {
		sum := sha256.Sum256([]byte(k))
		k = "sha256:" + hex.EncodeToString(sum[:])
	}
	return k
}

func EffectKind(eff *typesv1.Effect) string {
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

// EffectEnv is what executing a non-dispatching effect needs; every
// engine provides one.
type EffectEnv struct {
	State    statev1.StateServiceClient
	Handlers map[string]EffectHandler
	// signal queues a signal for a workflow of this orchestrator, keyed
	// so that a repeat is a duplicate. Unknown or ended workflows are
	// errs.NotFound or errs.FailedPrecondition.
	Signal func(ctx context.Context, workflowID string, payload []byte, key string) (seq uint64, dup bool, err error)
	// Publish takes the events the effect produces (see Outcome.Events).
	Publish func(*lifecyclev1.LifecycleEvent)
}

// Transient says whether a State (or signal) failure may pass if the
// effect is tried again. Only a refusal of the effect itself is
// permanent: a bad scope, key or value, a limit of the request
// (LIMIT_EXCEEDED), a stale revision, an unknown workflow. Everything
// else, a State service that is down, slow, out of disk (STORAGE_FULL),
// misconfigured (a credential refused) or failing internally, is retried:
// an effect is never recorded as not applied because of the service's
// condition rather than its content.
func Transient(err error) bool {
	if errs.Reason(err) == errs.ReasonStorageFull {
		return true
	}
	switch errs.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.NotFound,
		codes.AlreadyExists, codes.Unimplemented, codes.ResourceExhausted:
		return false
	}
	return true
}

// ApplyEffect executes a non-dispatching effect of workflow wfID once.
// A permanent failure returns applied=false with the reason; err is a
// transient State failure (see Transient), ctx's end, or a broken
// journal.
func ApplyEffect(ctx context.Context, env EffectEnv, wfID, agentID, key string, eff *typesv1.Effect) (applied bool, detail string, err error) {
	switch k := eff.GetKind().(type) {
	case *typesv1.Effect_WriteMemory:
		m := k.WriteMemory
		return stateCall(ctx, env, "write", func(ctx context.Context) (string, error) {
			resp, err := env.State.Write(ctx, &statev1.WriteRequest{Scope: m.GetScope(), Key: m.GetKey(), Value: m.GetValue(), IdempotencyKey: StateKey(wfID, key), Unindexed: m.GetUnindexed()})
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
			resp, err := env.State.Delete(ctx, &statev1.DeleteRequest{Scope: m.GetScope(), Key: m.GetKey(), IdempotencyKey: StateKey(wfID, key)})
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
		seq, dup, err := env.Signal(ctx, s.GetWorkflowId(), payload, StateKey(wfID, key))
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
		env.Publish(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_OPERATOR, "operator.log", wfID, agentID, data))
		return true, "published as an observable event", nil
	case *typesv1.Effect_Custom:
		c := k.Custom
		h := env.Handlers[c.GetEffectType()]
		if h == nil {
			env.Publish(lifecycle.Observable(lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR, "orchestrator.effect.unhandled", wfID, agentID,
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
func stateCall(ctx context.Context, env EffectEnv, op string, call func(ctx context.Context) (string, error)) (bool, string, error) {
	if env.State == nil {
		return false, "no State service is configured (--state-addr); memory effects cannot be applied", nil
	}
	detail, err := call(ctx)
	switch {
	case err == nil:
		return true, detail, nil
	case ctx.Err() != nil:
		return false, "", context.Cause(ctx)
	case Transient(err):
		return false, "", fmt.Errorf("state %s: %w", op, err)
	}
	return false, fmt.Sprintf("state %s refused: %s", op, errs.ToStatus(err).Message()), nil
}

// Retryable says whether a retry may fix an operator failure. A service
// that stayed unreachable past its horizon (PeerDownError) is not: the
// caller already waited for it longer than the agent's retries would.
func Retryable(err error) bool {
	var down *PeerDownError
	if errors.As(err, &down) {
		return false
	}
	if errs.Reason(err) == errs.ReasonRetryable {
		return true
	}
	switch errs.Code(err) {
	case codes.Unavailable, codes.Aborted:
		return true
	}
	return false
}
