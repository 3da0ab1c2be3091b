package remote

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// dispatchTo serves a fresh fake agent and returns it with a connection
// to it that goes through m's dispatch interceptor.
func dispatchTo(t *testing.T, m *Middleware) (*agent, *grpc.ClientConn) {
	t.Helper()
	a := &agent{}
	_, addr := listen(t, func(s *grpc.Server) {
		operatorv1.RegisterOperatorServiceServer(s, a)
		environmentv1.RegisterEnvironmentServiceServer(s, a)
	})
	return a, dial(t, addr, grpc.WithUnaryInterceptor(m.DispatchClientInterceptor()))
}

// callAgent dispatches text through Execute or Run and returns the
// output's text.
func callAgent(ctx context.Context, conn *grpc.ClientConn, method, text string) (string, error) {
	if method == "run" {
		req := &environmentv1.RunRequest{Input: input(text), Spec: &environmentv1.EnvironmentSpec{}}
		orig := proto.Clone(req)
		resp, err := environmentv1.NewEnvironmentServiceClient(conn).Run(ctx, req)
		if !proto.Equal(req, orig) {
			panic("the caller's request was changed")
		}
		return content.TextOf(resp.GetOutput().GetMessage()), err
	}
	req := &operatorv1.ExecuteRequest{Input: input(text)}
	orig := proto.Clone(req)
	resp, err := operatorv1.NewOperatorServiceClient(conn).Execute(ctx, req)
	if !proto.Equal(req, orig) {
		panic("the caller's request was changed")
	}
	return content.TextOf(resp.GetOutput().GetMessage()), err
}

func TestDispatch(t *testing.T) {
	var logs syncBuffer
	m := startPolicy(t, &policy{name: "test-policy"}, Config{Log: logTo(&logs)})
	if m.Name() != "test-policy" {
		t.Fatalf("Name() = %q", m.Name())
	}
	tests := []struct {
		name     string
		text     string
		code     codes.Code
		frags    []string // in the error message
		received []string // what the agent got
		output   string
	}{
		{"continue", "hello", codes.OK, nil, []string{"hello"}, "echo: hello"},
		{"halt before: never reaches the agent", "forbidden", codes.PermissionDenied,
			[]string{`"agent-7"`, `"test-policy"`, haltReason}, nil, ""},
		{"modify before: the agent gets the rewrite", "rewrite me", codes.OK, nil, []string{"rewritten"}, "echo: rewritten"},
		{"modify after: the caller gets the rewrite", "tell secret", codes.OK, nil, []string{"tell secret"}, "[redacted]"},
		{"halt after: the result is withheld", "leak please", codes.PermissionDenied,
			[]string{`"agent-7"`, `"test-policy"`, haltReason}, []string{"leak please"}, ""},
		{"MODIFY without input fails closed", "broken", codes.Unavailable, []string{`"test-policy"`}, nil, ""},
	}
	for _, method := range []string{"execute", "run"} {
		for _, tt := range tests {
			t.Run(method+"/"+tt.name, func(t *testing.T) {
				a, conn := dispatchTo(t, m)
				out, err := callAgent(context.Background(), conn, method, tt.text)
				wantStatus(t, err, tt.code, tt.frags...)
				if got := a.got(); !equal(got, tt.received) {
					t.Errorf("agent received %q, want %q", got, tt.received)
				}
				if out != tt.output {
					t.Errorf("output %q, want %q", out, tt.output)
				}
			})
		}
	}
	for _, want := range []string{"middleware=test-policy", "boundary=dispatch", "phase=before", "phase=after", "verdict=HALT", "verdict=MODIFY", "reason=\"" + haltReason} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.String())
		}
	}
	for _, value := range []string{"secret answer", "rewritten\"", "leak"} {
		if strings.Contains(logs.String(), value) {
			t.Errorf("a value (%q) was logged:\n%s", value, logs.String())
		}
	}
}

// TestDispatchOtherMethodsPassThrough: ExecuteStream is not a dispatch the
// interceptor handles; the middleware is not called for it.
func TestDispatchOtherMethodsPassThrough(t *testing.T) {
	p := &policy{name: "p"}
	m := startPolicy(t, p, Config{})
	a := &agent{}
	_, addr := listen(t, func(s *grpc.Server) { operatorv1.RegisterOperatorServiceServer(s, a) })
	conn := dial(t, addr, grpc.WithUnaryInterceptor(m.DispatchClientInterceptor()))
	err := conn.Invoke(context.Background(), "/layer0.operator.v1.OperatorService/Other", &operatorv1.ExecuteRequest{Input: input("forbidden")}, &operatorv1.ExecuteResponse{})
	wantStatus(t, err, codes.Unimplemented)
	if n := p.callsAt(dispatchBoundary, before); n != 0 {
		t.Fatalf("middleware called %d times for another method", n)
	}
}
