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
// DispatchClientInterceptor; and the same calls streamed (ExecuteStream,
// RunStream), the chain run around a Streamer as the orchestrator's
// caller runs it.
func TestRemote(t *testing.T) {
	boundarytest.Run(t, boundarytest.Boundary{
		Kind: middlewarev1.Boundary_BOUNDARY_DISPATCH,
		Methods: []boundarytest.Method{
			{Name: "execute", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return dispatchTo(t, m, false) }},
			{Name: "run", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return dispatchTo(t, m, true) }},
			{Name: "execute stream", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return streamTo(t, m, false) }},
			{Name: "run stream", Serve: func(t *testing.T, m *remote.Middleware) boundarytest.Target { return streamTo(t, m, true) }},
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

// streamTarget is a fake agent that streams, and a bare connection to it
// on which the chain runs around a Streamer.
type streamTarget struct {
	agent *boundarytest.Agent
	conn  *grpc.ClientConn
	chain grpc.UnaryClientInterceptor
	run   bool // RunStream, else ExecuteStream
}

func streamTo(t *testing.T, m *remote.Middleware, run bool) *streamTarget {
	t.Helper()
	a := &boundarytest.Agent{}
	_, addr := boundarytest.Listen(t, func(s *grpc.Server) {
		operatorv1.RegisterOperatorServiceServer(s, a)
		environmentv1.RegisterEnvironmentServiceServer(s, runStreamer{a})
	})
	return &streamTarget{
		agent: a, conn: boundarytest.Dial(t, addr), run: run,
		chain: dispatch.Chain(dispatch.AuditInterceptor(nil), dispatch.BudgetInterceptor(), m.DispatchClientInterceptor()),
	}
}

// Call dispatches word as a stream. The caller's request must not
// change; the progress is the agent's one text delta, the text it ran,
// whatever the middleware does to the output, and none when it did not
// run.
func (a *streamTarget) Call(ctx context.Context, t *testing.T, word string) boundarytest.Result {
	t.Helper()
	var method string
	var req, orig, reply proto.Message
	if a.run {
		method, req, reply = environmentv1.EnvironmentService_Run_FullMethodName,
			&environmentv1.RunRequest{Input: boundarytest.Input(word), Spec: &environmentv1.EnvironmentSpec{}}, &environmentv1.RunResponse{}
	} else {
		method, req, reply = operatorv1.OperatorService_Execute_FullMethodName, &operatorv1.ExecuteRequest{Input: boundarytest.Input(word)}, &operatorv1.ExecuteResponse{}
	}
	orig = proto.Clone(req)
	ran := len(a.agent.Got())
	var deltas []string
	var s dispatch.Streamer
	err := a.chain(ctx, method, req, reply, a.conn, s.Invoker(func(ev *operatorv1.ExecuteStreamResponse) {
		deltas = append(deltas, ev.GetTextDelta().GetText())
	}))
	if !proto.Equal(req, orig) {
		t.Error("the caller's request was changed")
	}
	if got := a.agent.Got()[ran:]; !boundarytest.Equal(deltas, got) {
		t.Errorf("progress %q, want the text the agent ran: %q", deltas, got)
	}
	if err != nil {
		return boundarytest.Result{Err: err, Calls: 1} // the reply is not the caller's (a unary client drops it too)
	}
	out, _ := dispatch.Output(reply)
	if out == nil {
		t.Error("a stream answered without its output")
	}
	return boundarytest.Result{Output: content.TextOf(out.GetMessage()), Calls: 1}
}

func (a *streamTarget) Received(*testing.T) []string { return a.agent.Got() }

// Other: a call that is not a dispatch passes through the chain and the
// Streamer unchanged.
func (a *streamTarget) Other(ctx context.Context, t *testing.T) {
	t.Helper()
	var s dispatch.Streamer
	err := a.chain(ctx, "/layer0.operator.v1.OperatorService/Other", &operatorv1.ExecuteRequest{Input: boundarytest.Input(boundarytest.HaltBefore)},
		&operatorv1.ExecuteResponse{}, a.conn, s.Invoker(nil))
	boundarytest.WantStatus(t, err, codes.Unimplemented)
}

// runStreamer adds RunStream to boundarytest.Agent: its Run's result,
// after its output's text as one delta.
type runStreamer struct{ *boundarytest.Agent }

func (r runStreamer) RunStream(req *environmentv1.RunStreamRequest, s environmentv1.EnvironmentService_RunStreamServer) error {
	resp, err := r.Run(s.Context(), &environmentv1.RunRequest{Input: req.GetInput(), Spec: req.GetSpec()})
	if err != nil {
		return err
	}
	delta := &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{
		TextDelta: &operatorv1.TextDelta{Turn: 1, Text: content.TextOf(resp.GetOutput().GetMessage())},
	}}
	if err := s.Send(&environmentv1.RunStreamResponse{Kind: &environmentv1.RunStreamResponse_Progress{Progress: delta}}); err != nil {
		return err
	}
	return s.Send(&environmentv1.RunStreamResponse{Kind: &environmentv1.RunStreamResponse_Result{Result: resp}})
}
