package temporal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/middleware/dispatch"
	"github.com/secbear/neuron/services/orchestrator"
)

// Only references cross the history: the workflow plans operator inputs
// (which output, which effect) and the call activity builds them, and
// every OperatorOutput (the transcript) is kept in the State service
// under the workflow's scope, where the activities and the engine read
// it.

// outputScope is where a workflow's operator outputs are kept.
func outputScope(workflowID string) *typesv1.Scope {
	return &typesv1.Scope{Kind: &typesv1.Scope_Workflow{Workflow: &typesv1.WorkflowScope{WorkflowId: workflowID}}}
}

// outputKey is the State key of step n's output.
func outputKey(n uint64) string { return "orchestrator/output/" + strconv.FormatUint(n, 10) }

// loadOutput reads step n's output from State; nil when it is not there.
func loadOutput(ctx context.Context, state statev1.StateServiceClient, workflowID string, n uint64) (*operatorv1.OperatorOutput, error) {
	if state == nil {
		return nil, fmt.Errorf("no State service is configured; the Temporal engine keeps operator outputs there: %w", errs.FailedPrecondition)
	}
	resp, err := state.Read(ctx, &statev1.ReadRequest{Scope: outputScope(workflowID), Key: outputKey(n)})
	if errors.Is(errs.FromGRPC(err), errs.NotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the output of step %d of workflow %q from the State service: %w", n, workflowID, errs.FromGRPC(err))
	}
	b, err := protojson.Marshal(resp.GetValue())
	if err != nil {
		return nil, err
	}
	out := &operatorv1.OperatorOutput{}
	if err := protojson.Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("the stored output of step %d of workflow %q is not an OperatorOutput: %v: %w", n, workflowID, err, errs.Internal)
	}
	return out, nil
}

// mustOutput is loadOutput for an output the workflow knows exists.
func mustOutput(ctx context.Context, state statev1.StateServiceClient, workflowID string, n uint64) (*operatorv1.OperatorOutput, error) {
	out, err := loadOutput(ctx, state, workflowID, n)
	if err == nil && out == nil {
		err = fmt.Errorf("the output of step %d of workflow %q is missing from the State service (was its scope deleted?): %w", n, workflowID, errs.FailedPrecondition)
	}
	return out, err
}

// storeOutput writes step n's output to State, idempotently.
func storeOutput(ctx context.Context, state statev1.StateServiceClient, workflowID string, n uint64, out *operatorv1.OperatorOutput) error {
	b, err := protojson.Marshal(out)
	if err != nil {
		return err
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(b, v); err != nil {
		return err
	}
	_, err = state.Write(ctx, &statev1.WriteRequest{Scope: outputScope(workflowID), Key: outputKey(n), Value: v,
		IdempotencyKey: orchestrator.StateKey(workflowID, outputKey(n))})
	if err != nil {
		return fmt.Errorf("keeping the output of step %d in the State service: %w", n, errs.FromGRPC(err))
	}
	return nil
}

// The call activity's errors carry their status as a failure. Operator
// failures are non-retryable for Temporal (errTypeOperator; or
// errTypeRetryable, which the workflow retries per the agent's policy,
// so that the agent's attempts count operator failures only); State
// failures (errTypeState) are retried by Temporal, as are the timeouts
// of an attempt whose worker died.

// operatorErr is an operator failure; retryable when the agent's retry
// policy may fix it.
func operatorErr(err error, retryable bool) error {
	f := failureOf(orchestrator.FailureOf(err))
	if retryable {
		return temporal.NewNonRetryableApplicationError(f.Message, errTypeRetryable, nil, f)
	}
	return temporal.NewNonRetryableApplicationError(f.Message, errTypeOperator, nil, f)
}

// stateErr is a State failure, retried by Temporal.
func stateErr(err error) error {
	f := failureOf(orchestrator.FailureOf(err))
	return temporal.NewApplicationError(f.Message, errTypeState, f)
}

// callActivity makes one operator call: it builds the input the workflow
// planned, calls the agent's operator or environment, and keeps the
// output in State. An output already kept (a worker died after the call)
// is not called for again.
func (e *Engine) callActivity(ctx context.Context, a callArgs) (*callResult, error) {
	out, err := loadOutput(ctx, e.deps.State, a.WorkflowID, a.N)
	if err != nil {
		e.log.Warn("reading a kept output; retrying", "workflow_id", a.WorkflowID, "step", a.N, "err", err)
		return nil, stateErr(err)
	}
	var took time.Duration
	if out == nil {
		if out, took, err = e.call(ctx, a); err != nil {
			return nil, err
		}
	}
	res := resultOf(orchestrator.ResultOf(orchestrator.DispatchID(a.WorkflowID, a.N), out))
	res.DurationMS = took.Milliseconds()
	return res, nil
}

// call builds the input, calls the operator and keeps its output. The
// operator call is bounded by the call timeout: an operator that hangs
// fails the call (DEADLINE_EXCEEDED) rather than timing the activity out,
// which Temporal would retry without end.
func (e *Engine) call(ctx context.Context, a callArgs) (*operatorv1.OperatorOutput, time.Duration, error) {
	agent, err := e.deps.Registry.LookupRevision(a.Agent, a.Revision)
	if err != nil {
		return nil, 0, operatorErr(err, false)
	}
	in, _, err := orchestrator.BuildInput(agent, a.stepCall(), a.WorkflowID, a.signals(), func(n uint64) (*operatorv1.OperatorOutput, error) {
		return mustOutput(ctx, e.deps.State, a.WorkflowID, n)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		e.log.Warn("building an operator input", "workflow_id", a.WorkflowID, "step", a.N, "err", err)
		if orchestrator.Transient(err) {
			return nil, 0, stateErr(err)
		}
		return nil, 0, operatorErr(err, false)
	}

	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(a.Trace))
	stop := heartbeat(ctx, e.opts.HeartbeatTimeout)
	defer stop()
	cctx, cancel := context.WithTimeout(dispatch.WithBudget(ctx, a.remaining()), e.opts.Engine.CallTimeout)
	defer cancel()
	started := time.Now()
	out, err := e.deps.Caller.Call(cctx, agent, in)
	took := time.Since(started)
	timedOut := cctx.Err() != nil
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		if timedOut {
			err = fmt.Errorf("the operator call did not finish within the call timeout of %s: %w", e.opts.Engine.CallTimeout, errs.DeadlineExceeded)
		}
		e.log.Warn("operator call failed", "workflow_id", a.WorkflowID, "agent", a.Agent, "step", a.N, "err", err)
		return nil, 0, operatorErr(err, orchestrator.Retryable(err))
	}
	if err := storeOutput(ctx, e.deps.State, a.WorkflowID, a.N, out); err != nil {
		e.log.Warn("keeping an output in State; retrying the call", "workflow_id", a.WorkflowID, "step", a.N, "err", err)
		return nil, 0, stateErr(err)
	}
	return out, took, nil
}

// heartbeat records activity heartbeats until stopped, so that a worker
// that dies mid-call is noticed within the heartbeat timeout.
func heartbeat(ctx context.Context, timeout time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(max(timeout/3, 10*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				activity.RecordHeartbeat(ctx)
			}
		}
	}()
	return func() { close(done) }
}

// effectActivity executes one non-dispatching effect, reading it from
// the output kept in State. A transient State failure is retried by the
// activity's policy; the State service recognises a repeat by the
// effect's idempotency key.
func (e *Engine) effectActivity(ctx context.Context, a effectArgs) (*effectOutcome, error) {
	out, err := mustOutput(ctx, e.deps.State, a.WorkflowID, a.Step)
	if err == nil && (a.Index < 0 || a.Index >= len(out.GetEffects())) {
		err = fmt.Errorf("step %d of workflow %q has no effect %d: %w", a.Step, a.WorkflowID, a.Index, errs.Internal)
	}
	if err != nil {
		e.log.Warn("reading an effect; retrying", "workflow_id", a.WorkflowID, "step", a.Step, "err", err)
		return nil, stateErr(err)
	}
	eff := out.GetEffects()[a.Index]
	var events [][]byte
	env := orchestrator.EffectEnv{State: e.deps.State, Handlers: e.opts.Engine.Handlers, Signal: e.Signal,
		Publish: func(ev *lifecyclev1.LifecycleEvent) {
			if raw, err := proto.Marshal(ev); err == nil {
				events = append(events, raw)
			}
		}}
	stop := heartbeat(ctx, e.opts.HeartbeatTimeout)
	defer stop()
	applied, detail, err := orchestrator.ApplyEffect(ctx, env, a.WorkflowID, a.Agent, a.Key, eff)
	if err != nil {
		e.log.Warn("effect failed; retrying", "workflow_id", a.WorkflowID, "effect", orchestrator.EffectKind(eff), "key", a.Key, "err", err)
		return nil, stateErr(err)
	}
	if !applied {
		e.log.Warn("effect not applied", "workflow_id", a.WorkflowID, "agent", a.Agent, "effect", orchestrator.EffectKind(eff), "key", a.Key, "detail", detail)
	}
	return &effectOutcome{Key: a.Key, Applied: applied, Detail: detail, Events: events}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
