package remote

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// execBehind serves a fresh fake agent behind the standard chain plus m's
// exec interceptors.
func execBehind(t *testing.T, m *Middleware) (*agent, *grpc.ClientConn) {
	t.Helper()
	a := &agent{}
	u, s := m.ExecServerInterceptors()
	addr := serveStandard(t, func(r grpc.ServiceRegistrar) {
		operatorv1.RegisterOperatorServiceServer(r, a)
		environmentv1.RegisterEnvironmentServiceServer(r, a)
	}, []grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{s})
	return a, dial(t, addr)
}

// stream runs ExecuteStream and returns every message.
func stream(t *testing.T, conn *grpc.ClientConn, text string) ([]*operatorv1.ExecuteStreamResponse, error) {
	t.Helper()
	st, err := operatorv1.NewOperatorServiceClient(conn).ExecuteStream(context.Background(), &operatorv1.ExecuteStreamRequest{Input: input(text)})
	if err != nil {
		return nil, err
	}
	var msgs []*operatorv1.ExecuteStreamResponse
	for {
		msg, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return msgs, nil
		}
		if err != nil {
			return msgs, err
		}
		msgs = append(msgs, msg)
	}
}

func TestExec(t *testing.T) {
	m := startPolicy(t, &policy{name: "exec-policy"}, Config{})
	tests := []struct {
		name     string
		text     string
		exit     operatorv1.ExitKind
		output   string
		received []string
		tokens   uint64 // metadata kept
		effects  int
	}{
		{"continue", "hello", operatorv1.ExitKind_EXIT_KIND_COMPLETE, "echo: hello", []string{"hello"}, 42, 1},
		{"halt before: not run", "forbidden", operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT, "", nil, 0, 0},
		{"modify before", "rewrite me", operatorv1.ExitKind_EXIT_KIND_COMPLETE, "echo: rewritten", []string{"rewritten"}, 42, 1},
		{"modify after", "tell secret", operatorv1.ExitKind_EXIT_KIND_COMPLETE, "[redacted]", []string{"tell secret"}, 0, 0},
		{"halt after: output replaced, cost kept", "leak please", operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT, "", []string{"leak please"}, 42, 0},
	}
	check := func(t *testing.T, a *agent, out *operatorv1.OperatorOutput, tt int) {
		t.Helper()
		want := tests[tt]
		if got := out.GetExitReason().GetKind(); got != want.exit {
			t.Fatalf("exit %v (%q), want %v", got, out.GetExitReason().GetMessage(), want.exit)
		}
		if want.exit == operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT {
			msg := out.GetExitReason().GetMessage()
			if !strings.Contains(msg, haltReason) || !strings.Contains(msg, "exec-policy") {
				t.Errorf("halt message %q lacks the reason or the middleware", msg)
			}
			if md := out.GetMetadata(); want.received == nil && (md.GetCost().GetAmount() != "0" || md.GetDuration() == nil) {
				t.Errorf("an invocation that never ran has metadata %v, want zeros", md)
			}
		}
		if got := content.TextOf(out.GetMessage()); got != want.output {
			t.Errorf("output %q, want %q", got, want.output)
		}
		if got := out.GetMetadata().GetTokensIn(); got != want.tokens {
			t.Errorf("tokens_in %d, want %d", got, want.tokens)
		}
		if got := len(out.GetEffects()); got != want.effects {
			t.Errorf("%d effects, want %d", got, want.effects)
		}
		if got := a.got(); !equal(got, want.received) {
			t.Errorf("agent received %q, want %q", got, want.received)
		}
	}
	for i, tt := range tests {
		t.Run("execute/"+tt.name, func(t *testing.T) {
			a, conn := execBehind(t, m)
			resp, err := operatorv1.NewOperatorServiceClient(conn).Execute(context.Background(), &operatorv1.ExecuteRequest{Input: input(tt.text)})
			if err != nil {
				t.Fatal(err)
			}
			check(t, a, resp.GetOutput(), i)
		})
		t.Run("run/"+tt.name, func(t *testing.T) {
			a, conn := execBehind(t, m)
			resp, err := environmentv1.NewEnvironmentServiceClient(conn).Run(context.Background(),
				&environmentv1.RunRequest{Input: input(tt.text), Spec: &environmentv1.EnvironmentSpec{}})
			if err != nil {
				t.Fatal(err)
			}
			check(t, a, resp.GetOutput(), i)
		})
		t.Run("stream/"+tt.name, func(t *testing.T) {
			a, conn := execBehind(t, m)
			msgs, err := stream(t, conn, tt.text)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) == 0 || msgs[len(msgs)-1].GetOutput() == nil {
				t.Fatalf("the stream did not end with an output: %v", msgs)
			}
			for _, msg := range msgs[:len(msgs)-1] {
				if msg.GetOutput() != nil {
					t.Fatalf("an output before the last message: %v", msgs)
				}
			}
			if tt.received == nil && len(msgs) != 1 {
				t.Errorf("a halted stream sent %d messages, want only the output", len(msgs))
			}
			check(t, a, msgs[len(msgs)-1].GetOutput(), i)
		})
	}
}

func TestExecFailClosed(t *testing.T) {
	m := startPolicy(t, &policy{name: "exec-policy"}, Config{})
	a, conn := execBehind(t, m)
	_, err := operatorv1.NewOperatorServiceClient(conn).Execute(context.Background(), &operatorv1.ExecuteRequest{Input: input("broken")})
	wantStatus(t, err, codes.Unavailable, `"exec-policy"`, "MODIFY without a replacement input")
	_, err = stream(t, conn, "broken")
	wantStatus(t, err, codes.Unavailable, `"exec-policy"`)
	if got := a.got(); len(got) != 0 {
		t.Fatalf("the agent ran: %q", got)
	}
}
