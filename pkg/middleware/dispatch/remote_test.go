package dispatch_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/middleware/dispatch"
	"github.com/secbear/neuron/pkg/middleware/internal/boundarytest"
	"github.com/secbear/neuron/pkg/middleware/remote"
)

// TestRemote runs the boundaries' shared suite at the dispatch boundary:
// a fake agent called, by Execute and by Run, through a client connection
// with the chain the orchestrator installs (serve.Run): the audit and
// budget interceptors, then the remote middleware's
// DispatchClientInterceptor.
func TestRemote(t *testing.T) {
	boundarytest.Run(t, boundarytest.Boundary{
		Kind: middlewarev1.Boundary_BOUNDARY_DISPATCH,
		Methods: []boundarytest.Method{
			{Name: "execute", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return dispatchTo(t, m, false) }},
			{Name: "run", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return dispatchTo(t, m, true) }},
		},
		HaltNames: func(string) []string { return []string{fmt.Sprintf("%q", boundarytest.AgentID)} },
		Replaced:  "input",
	})
}

// agentTarget is a fake agent and a connection to it through the
// dispatch interceptor.
type agentTarget struct {
	agent *boundarytest.Agent
	conn  *grpc.ClientConn
	run   bool // EnvironmentService.Run, else OperatorService.Execute
}

func dispatchTo(t *testing.T, m *remote.Middleware, run bool) *agentTarget {
	t.Helper()
	a := &boundarytest.Agent{}
	_, addr := boundarytest.Listen(t, func(s *grpc.Server) { boundarytest.RegisterAgent(s, a) })
	chain := grpc.WithChainUnaryInterceptor(dispatch.AuditInterceptor(nil), dispatch.BudgetInterceptor(), m.DispatchClientInterceptor())
	return &agentTarget{agent: a, conn: boundarytest.Dial(t, addr, chain), run: run}
}

// Call dispatches word; the caller's request must not change, whatever
// the middleware replaces.
func (a *agentTarget) Call(ctx context.Context, t *testing.T, word string) boundarytest.Result {
	t.Helper()
	var req, orig proto.Message
	var out *operatorv1.OperatorOutput
	var err error
	if a.run {
		r := &environmentv1.RunRequest{Input: boundarytest.Input(word), Spec: &environmentv1.EnvironmentSpec{}}
		req, orig = r, proto.Clone(r)
		var resp *environmentv1.RunResponse
		resp, err = environmentv1.NewEnvironmentServiceClient(a.conn).Run(ctx, r)
		out = resp.GetOutput()
	} else {
		r := &operatorv1.ExecuteRequest{Input: boundarytest.Input(word)}
		req, orig = r, proto.Clone(r)
		var resp *operatorv1.ExecuteResponse
		resp, err = operatorv1.NewOperatorServiceClient(a.conn).Execute(ctx, r)
		out = resp.GetOutput()
	}
	if !proto.Equal(req, orig) {
		t.Error("the caller's request was changed")
	}
	return boundarytest.Result{Err: err, Output: content.TextOf(out.GetMessage()), Calls: 1}
}

func (a *agentTarget) Received(*testing.T) []string { return a.agent.Got() }

// Other: ExecuteStream, or any other method, is not a dispatch the
// interceptor handles.
func (a *agentTarget) Other(ctx context.Context, t *testing.T) {
	t.Helper()
	err := a.conn.Invoke(ctx, "/layer0.operator.v1.OperatorService/Other", &operatorv1.ExecuteRequest{Input: boundarytest.Input(boundarytest.HaltBefore)}, &operatorv1.ExecuteResponse{})
	boundarytest.WantStatus(t, err, codes.Unimplemented)
}
