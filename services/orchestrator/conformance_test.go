package orchestrator_test

import (
	"context"
	"testing"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/testenv"
	conformance "github.com/secbear/neuron/pkg/conformance/orchestrator"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/money"
	"github.com/shopspring/decimal"
)

// conformanceAgents is the registry of the agents the conformance suite
// (pkg/conformance/orchestrator) dispatches. Answer and Writer run on the
// real operator (opAddr) with the scripted model. Slow and Suspend run on
// a fake operator (fakeAddr): the operator service answers shortly before
// its caller's deadline (EXIT_KIND_TIMEOUT), however long a scripted
// delay, and Slow must not answer at all; the scripted model cannot
// suspend and the operator service refuses resumed inputs. Approver and
// Streamer run on a fake operator that streams (streamAddr): the
// Approver's calls to approve are fixed, and the Streamer's call must
// stay in flight with its progress sent.
func conformanceAgents(t *testing.T, opAddr, fakeAddr, streamAddr string) []byte {
	retry := map[string]any{"max_attempts": 3, "initial_backoff": "1ms", "max_backoff": "5ms"}
	return registryYAML(t,
		map[string]any{"id": conformance.DefaultAnswerAgent, "operator": opAddr, "retry": retry,
			"metadata": script([]map[string]any{{"text": "4", "cost": "0.001"}})},
		map[string]any{"id": conformance.DefaultSlowAgent, "operator": fakeAddr, "retry": retry},
		map[string]any{"id": conformance.DefaultWriterAgent, "operator": opAddr, "retry": retry,
			"metadata": script([]map[string]any{
				{"tool_calls": []any{call("write_memory", map[string]any{"scope": "workflow", "key": conformance.WriterKey, "value": conformance.WriterValue})}, "cost": "0.002"},
				{"text": "Written.", "cost": "0.001"},
			})},
		map[string]any{"id": conformance.DefaultSuspendAgent, "operator": fakeAddr, "retry": retry},
		map[string]any{"id": conformance.DefaultApproverAgent, "operator": streamAddr, "retry": retry},
		map[string]any{"id": conformance.DefaultStreamerAgent, "operator": streamAddr, "retry": retry},
	)
}

// blockUntilCancelled is the Slow agent: every call waits until it is
// cancelled or its deadline passes.
func blockUntilCancelled(ctx context.Context, _ *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// suspendEveryCall is the Suspend agent: every call exits SUSPENDED.
func suspendEveryCall(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
	return &operatorv1.OperatorOutput{
		Message: content.Text("Waiting for a signal."),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_SUSPENDED,
			Suspension: &operatorv1.Suspension{ResumeToken: "resume-" + in.GetDispatch().GetDispatchId(), Prompt: "Signal to go on."}},
		Metadata: &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.Zero), TurnsUsed: 1},
	}, nil
}

// approveThenReport is the Approver agent: a first call waits for the
// approval of the two calls the suite expects; a resumed call reports the
// decisions it received.
func approveThenReport(_ context.Context, in *operatorv1.OperatorInput, _ func(*operatorv1.ExecuteStreamResponse)) (*operatorv1.OperatorOutput, error) {
	if r := in.GetResume(); r != nil {
		return done(in, conformance.Decided(r.GetToolDecisions()), "0.001"), nil
	}
	return suspendFor(in, "conformance-"+in.GetDispatch().GetDispatchId(),
		pendingCall(conformance.ApproverCall1, conformance.ApproverTool1, map[string]any{"path": "conformance.txt"}),
		pendingCall(conformance.ApproverCall2, conformance.ApproverTool2, map[string]any{"cmd": "true"})), nil
}

// streamUntilCancelled is the Streamer agent: every call sends its text
// delta, then waits until it is cancelled or its deadline passes.
func streamUntilCancelled(ctx context.Context, _ *operatorv1.OperatorInput, emit func(*operatorv1.ExecuteStreamResponse)) (*operatorv1.OperatorOutput, error) {
	emit(delta(conformance.StreamerText))
	<-ctx.Done()
	return nil, ctx.Err()
}

// conformanceTarget starts what the suite's agents need (a State
// service, the real operator and two fake ones) and returns the target
// for an orchestrator started by startOrch over the registry.
func conformanceTarget(t *testing.T, startOrch func(registry []byte, stateAddr string) *orch) conformance.Target {
	stateAddr, _, _ := startState(t)
	opAddr := startOperator(t, stateAddr)
	_, fakeAddr := startFake(t, map[string]behaviour{
		conformance.DefaultSlowAgent:    blockUntilCancelled,
		conformance.DefaultSuspendAgent: suspendEveryCall,
	})
	_, streamAddr := startStreamingFake(t, map[string]streamBehaviour{
		conformance.DefaultApproverAgent: approveThenReport,
		conformance.DefaultStreamerAgent: streamUntilCancelled,
	})
	o := startOrch(conformanceAgents(t, opAddr, fakeAddr, streamAddr), stateAddr)
	return conformance.Target{Conn: dial(t, o.addr), State: dial(t, stateAddr)}
}

// TestConformance runs the OrchestratorService conformance suite against
// the bbolt backend and the Temporal backend.
func TestConformance(t *testing.T) {
	t.Run("bbolt", func(t *testing.T) {
		conformance.Run(t, conformanceTarget(t, func(registry []byte, stateAddr string) *orch {
			return startOrch(t, t.TempDir(), registry, stateAddr, orchOptions{})
		}))
	})
	t.Run("temporal", func(t *testing.T) {
		dev := testenv.Temporal(t)
		target := conformanceTarget(t, func(registry []byte, stateAddr string) *orch {
			return startTemporalOrch(t, dev, registry, stateAddr, orchOptions{})
		})
		target.Skip = map[string]string{
			"ListWorkflows/NewestFirst": "documented difference (ListWorkflows in orchestrator.proto): the Temporal backend lists in " +
				"Temporal's visibility order, running workflows first, then ended ones by close time; its SQL visibility " +
				"store rejects ORDER BY StartTime DESC",
		}
		conformance.Run(t, target)
	})
}
