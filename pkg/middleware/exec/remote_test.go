package exec_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/middleware/internal/boundarytest"
	"github.com/secbear/neuron/pkg/middleware/remote"
)

// methods are the invocations: Execute and Run (unary), ExecuteStream.
var methods = []boundarytest.Method{
	{Name: "execute", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return execBehind(t, m, "execute") }},
	{Name: "run", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return execBehind(t, m, "run") }},
	{Name: "stream", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return execBehind(t, m, "stream") }},
}

// TestRemote runs the boundaries' shared suite at the exec boundary: a
// fake agent served behind the standard chain plus the remote middleware's
// ExecServerInterceptors (as the operator and environment services
// install them), invoked by Execute, Run and ExecuteStream.
func TestRemote(t *testing.T) {
	boundarytest.Run(t, boundarytest.Boundary{
		Kind:         middlewarev1.Boundary_BOUNDARY_EXEC,
		Methods:      methods,
		HaltIsOutput: true,
		Replaced:     "input",
	})
}

// execTarget is a fake agent behind the exec interceptors and a
// connection to it.
type execTarget struct {
	agent  *boundarytest.Agent
	conn   *grpc.ClientConn
	method string
	last   *operatorv1.OperatorOutput // of the last Call
}

func execBehind(t *testing.T, m *remote.Middleware, method string) *execTarget {
	t.Helper()
	a := &boundarytest.Agent{}
	u, s := m.ExecServerInterceptors()
	addr := boundarytest.ServeStandard(t, func(r grpc.ServiceRegistrar) { boundarytest.RegisterAgent(r, a) },
		[]grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{s})
	return &execTarget{agent: a, conn: boundarytest.Dial(t, addr), method: method}
}

func (e *execTarget) Call(ctx context.Context, t *testing.T, word string) boundarytest.Result {
	t.Helper()
	var out *operatorv1.OperatorOutput
	var err error
	switch e.method {
	case "execute":
		var resp *operatorv1.ExecuteResponse
		resp, err = operatorv1.NewOperatorServiceClient(e.conn).Execute(ctx, &operatorv1.ExecuteRequest{Input: boundarytest.Input(word)})
		out = resp.GetOutput()
	case "run":
		var resp *environmentv1.RunResponse
		resp, err = environmentv1.NewEnvironmentServiceClient(e.conn).Run(ctx,
			&environmentv1.RunRequest{Input: boundarytest.Input(word), Spec: &environmentv1.EnvironmentSpec{}})
		out = resp.GetOutput()
	case "stream":
		out, err = e.stream(ctx, t, word)
	}
	e.last = out
	r := boundarytest.Result{Err: err, Output: content.TextOf(out.GetMessage()), Calls: 1}
	if out.GetExitReason().GetKind() == operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT {
		r.Halt = out.GetExitReason().GetMessage()
	}
	return r
}

// stream runs ExecuteStream and returns its output. The stream must end
// with its one output, after the agent's delta when the agent ran, alone
// when it did not.
func (e *execTarget) stream(ctx context.Context, t *testing.T, word string) (*operatorv1.OperatorOutput, error) {
	t.Helper()
	ran := len(e.agent.Got())
	st, err := operatorv1.NewOperatorServiceClient(e.conn).ExecuteStream(ctx, &operatorv1.ExecuteStreamRequest{Input: boundarytest.Input(word)})
	if err != nil {
		return nil, err
	}
	var msgs []*operatorv1.ExecuteStreamResponse
	for {
		msg, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, msg)
	}
	if len(msgs) == 0 || msgs[len(msgs)-1].GetOutput() == nil {
		t.Fatalf("the stream did not end with an output: %v", msgs)
	}
	for _, msg := range msgs[:len(msgs)-1] {
		if msg.GetOutput() != nil {
			t.Fatalf("an output before the last message: %v", msgs)
		}
	}
	want := 2 // the delta, the output
	if len(e.agent.Got()) == ran {
		want = 1 // halted before: only the output
	}
	if len(msgs) != want {
		t.Errorf("%d messages, want %d: %v", len(msgs), want, msgs)
	}
	return msgs[len(msgs)-1].GetOutput(), nil
}

func (e *execTarget) Received(*testing.T) []string { return e.agent.Got() }

// Other is a health check.
func (e *execTarget) Other(ctx context.Context, t *testing.T) {
	t.Helper()
	if _, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestHaltedOutputs: what an invocation's output keeps under each
// verdict. A halt drops the message and the effects, keeping the metadata
// of what the invocation consumed (zero cost and duration when it never
// ran); a MODIFY after is the middleware's output as it sent it.
func TestHaltedOutputs(t *testing.T) {
	m := boundarytest.StartPolicy(t, &boundarytest.Policy{Name: "exec-policy"}, remote.Config{})
	tests := []struct {
		name    string
		word    string
		tokens  uint64 // metadata kept
		effects int
	}{
		{"continue", boundarytest.Continue, boundarytest.AgentTokens, boundarytest.AgentEffects},
		{"halt before: not run", boundarytest.HaltBefore, 0, 0},
		{"modify before", boundarytest.ModifyBefore, boundarytest.AgentTokens, boundarytest.AgentEffects},
		{"modify after", boundarytest.ModifyAfter, 0, 0},
		{"halt after: output replaced, cost kept", boundarytest.HaltAfter, boundarytest.AgentTokens, 0},
	}
	for _, method := range methods {
		for _, tt := range tests {
			t.Run(method.Name+"/"+tt.name, func(t *testing.T) {
				e := method.Serve(t, m).(*execTarget)
				if r := e.Call(context.Background(), t, tt.word); r.Err != nil {
					t.Fatal(r.Err)
				}
				out := e.last
				if got := out.GetMetadata().GetTokensIn(); got != tt.tokens {
					t.Errorf("tokens_in %d, want %d", got, tt.tokens)
				}
				if got := len(out.GetEffects()); got != tt.effects {
					t.Errorf("%d effects, want %d", got, tt.effects)
				}
				if md := out.GetMetadata(); len(e.Received(t)) == 0 && (md.GetCost().GetAmount() != "0" || md.GetDuration() == nil) {
					t.Errorf("an invocation that never ran has metadata %v, want zeros", md)
				}
			})
		}
	}
}
