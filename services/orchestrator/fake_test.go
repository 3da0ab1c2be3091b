package orchestrator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/shopspring/decimal"
)

// behaviour answers one operator call of an agent.
type behaviour func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error)

// fakeOperator is an OperatorService whose answers are chosen per agent
// by the test. It records every input it receives.
type fakeOperator struct {
	operatorv1.UnimplementedOperatorServiceServer
	mu     sync.Mutex
	agents map[string]behaviour
	calls  []*operatorv1.OperatorInput
}

func startFake(t *testing.T, agents map[string]behaviour) (*fakeOperator, string) {
	f := &fakeOperator{agents: agents}
	addr := harness.ServeFake(t, "test", func(s *grpcserver.Server) { operatorv1.RegisterOperatorServiceServer(s, f) })
	return f, addr
}

func (f *fakeOperator) Execute(ctx context.Context, req *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	in := req.GetInput()
	f.mu.Lock()
	f.calls = append(f.calls, proto.Clone(in).(*operatorv1.OperatorInput))
	b := f.agents[in.GetDispatch().GetAgentId()]
	f.mu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("fake operator: no behaviour for agent %q", in.GetDispatch().GetAgentId())
	}
	out, err := b(ctx, in)
	if err != nil {
		return nil, err
	}
	return &operatorv1.ExecuteResponse{Output: out}, nil
}

// inputs returns the recorded inputs of agent ("" for all).
func (f *fakeOperator) inputs(agent string) []*operatorv1.OperatorInput {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*operatorv1.OperatorInput
	for _, in := range f.calls {
		if agent == "" || in.GetDispatch().GetAgentId() == agent {
			out = append(out, in)
		}
	}
	return out
}

// done is a COMPLETE output with text, cost and effects, keyed the way
// real operators key them.
func done(in *operatorv1.OperatorInput, text, cost string, effects ...*typesv1.Effect) *operatorv1.OperatorOutput {
	for i, e := range effects {
		if e.IdempotencyKey == "" {
			e.IdempotencyKey = fmt.Sprintf("%s/effect/%d", in.GetDispatch().GetDispatchId(), i)
		}
	}
	return &operatorv1.OperatorOutput{
		Message:    content.Text(text),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.RequireFromString(cost)), TurnsUsed: 1},
		Effects:    effects,
	}
}

// answer is a behaviour that always completes with text.
func answer(text string, effects ...func(in *operatorv1.OperatorInput) *typesv1.Effect) behaviour {
	return func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		var effs []*typesv1.Effect
		for _, e := range effects {
			effs = append(effs, e(in))
		}
		return done(in, text, "0", effs...), nil
	}
}

func writeMem(key string, v any) func(in *operatorv1.OperatorInput) *typesv1.Effect {
	return func(in *operatorv1.OperatorInput) *typesv1.Effect {
		val, _ := structpb.NewValue(v)
		return &typesv1.Effect{Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{
			Scope: scope.Workflow(in.GetDispatch().GetWorkflowId()), Key: key, Value: val}}}
	}
}

func delegateTo(agent, task string) func(in *operatorv1.OperatorInput) *typesv1.Effect {
	return func(*operatorv1.OperatorInput) *typesv1.Effect {
		return &typesv1.Effect{Kind: &typesv1.Effect_Delegate{Delegate: &typesv1.Delegate{AgentId: agent, Message: content.Text(task)}}}
	}
}

// firstTime runs first on an agent's USER/first call and then on
// re-invocations (delegation results) runs then.
func firstTime(first, then behaviour) behaviour {
	return func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		if _, ok := in.GetMetadata().GetFields()["delegations"]; ok {
			return then(ctx, in)
		}
		return first(ctx, in)
	}
}

func agentsAt(addr string, ids ...string) []map[string]any {
	var out []map[string]any
	for _, id := range ids {
		out = append(out, map[string]any{"id": id, "operator": addr, "retry": map[string]any{"max_attempts": 3, "initial_backoff": "1ms", "max_backoff": "5ms"}})
	}
	return out
}
