package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/environment/internal/mwtest"
)

// newPolicy is a MiddlewareService at the exec boundary: it halts an
// input saying "halt me" before it runs, rewrites an input saying
// "rewrite me", and rewrites an output saying "You said: redact" after.
// It records the phases it was asked about.
func newPolicy() *mwtest.Policy {
	return &mwtest.Policy{
		Name: "test-policy",
		Line: func(r *middlewarev1.InterceptExecRequest) string {
			return r.GetPhase().String() + " " + content.TextOf(r.GetInput().GetMessage())
		},
		Decide: func(r *middlewarev1.InterceptExecRequest) (*middlewarev1.InterceptExecResponse, error) {
			in := content.TextOf(r.GetInput().GetMessage())
			if r.GetPhase() == middlewarev1.Phase_PHASE_BEFORE {
				switch {
				case strings.Contains(in, "halt me"):
					return mwtest.Verdict(middlewarev1.VerdictKind_VERDICT_KIND_HALT, "no halting problems here"), nil
				case strings.Contains(in, "rewrite me"):
					v := mwtest.Verdict(middlewarev1.VerdictKind_VERDICT_KIND_MODIFY, "rewrite")
					v.Input = &operatorv1.OperatorInput{Message: content.Text("rewritten by policy")}
					return v, nil
				}
			}
			if r.GetPhase() == middlewarev1.Phase_PHASE_AFTER && strings.Contains(content.TextOf(r.GetOutput().GetMessage()), "You said: redact") {
				v := mwtest.Verdict(middlewarev1.VerdictKind_VERDICT_KIND_MODIFY, "redact")
				v.Output = &operatorv1.OperatorOutput{Message: content.Text("[output withheld by policy]"), ExitReason: r.GetOutput().GetExitReason(), Metadata: r.GetOutput().GetMetadata()}
				return v, nil
			}
			return mwtest.Verdict(middlewarev1.VerdictKind_VERDICT_KIND_CONTINUE, ""), nil
		},
	}
}

// startBinary runs the binary's run with args (plus --dev, a free port,
// its own data directory and the operator binary) until the test ends
// and returns a client, or the error run stopped with before serving.
func startBinary(t *testing.T, args ...string) (environmentv1.EnvironmentServiceClient, error) {
	t.Helper()
	dir := t.TempDir()
	op := testenv.BuildStatic(t, "github.com/secbear/neuron/services/operator/cmd/operator")
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	args = append([]string{"--dev", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--operator-binary", op, "--operator-args", "--tools read"}, args...)
	go func() {
		err := run(ctx, args, pw)
		pw.CloseWithError(io.EOF)
		done <- err
	}()
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "SERVING" {
				addrc <- line.Addr
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		cancel()
		return nil, err
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, Plaintext: true, Timeout: time.Minute, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return environmentv1.NewEnvironmentServiceClient(conn), nil
}

func requireProcessBackend(t *testing.T) {
	t.Helper()
	if err := sandbox.Supported(); err != nil {
		t.Skipf("no Landlock: %v", err)
	}
	if err := sandbox.CgroupSupported(); err != nil {
		t.Skipf("no cgroup: %v", err)
	}
}

func processSpec() *environmentv1.EnvironmentSpec {
	return &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}}}
}

// runStream calls RunStream and returns its result message.
func runStream(ctx context.Context, t *testing.T, c environmentv1.EnvironmentServiceClient, text string) *environmentv1.RunResponse {
	t.Helper()
	st, err := c.RunStream(ctx, &environmentv1.RunStreamRequest{Input: &operatorv1.OperatorInput{Message: content.Text(text)}, Spec: processSpec()})
	if err != nil {
		t.Fatal(err)
	}
	var res *environmentv1.RunResponse
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("RunStream(%q): %v", text, err)
		}
		if r := m.GetResult(); r != nil {
			res = r
		}
	}
	if res == nil {
		t.Fatalf("RunStream(%q) sent no result", text)
	}
	return res
}

// TestExecMiddleware: with --middleware-addr the binary consults the
// middleware before and after each Run and RunStream of the real
// sandboxed operator: a HALT before answers MIDDLEWARE_HALT without
// running the operator, a MODIFY before runs the rewritten input, a
// MODIFY after replaces the output; an input it lets through runs
// unchanged.
func TestExecMiddleware(t *testing.T) {
	requireProcessBackend(t)
	p := newPolicy()
	c, err := startBinary(t, "--middleware-addr", mwtest.Serve(t, p))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runText := func(text string) *environmentv1.RunResponse {
		t.Helper()
		resp, err := c.Run(ctx, &environmentv1.RunRequest{Input: &operatorv1.OperatorInput{Message: content.Text(text)}, Spec: processSpec()})
		if err != nil {
			t.Fatalf("Run(%q): %v", text, err)
		}
		return resp
	}
	checkHalted := func(resp *environmentv1.RunResponse) {
		t.Helper()
		out := resp.GetOutput()
		if out.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT || !strings.Contains(out.GetExitReason().GetMessage(), "no halting problems here") {
			t.Errorf("halted run answered %v, want exit MIDDLEWARE_HALT with the reason", out)
		}
		if got := content.TextOf(out.GetMessage()); got != "" || resp.GetBackend() != "" {
			t.Errorf("halted run ran on %q and said %q; want no run", resp.GetBackend(), got)
		}
	}

	checkHalted(runText("please halt me"))
	if got := content.TextOf(runText("please rewrite me").GetOutput().GetMessage()); !strings.Contains(got, "You said: rewritten by policy") || strings.Contains(got, "rewrite me") {
		t.Errorf("rewritten run said %q; want the operator to have seen the middleware's input", got)
	}
	if got := content.TextOf(runText("redact this").GetOutput().GetMessage()); got != "[output withheld by policy]" {
		t.Errorf("run whose output the middleware replaced said %q", got)
	}
	if got := content.TextOf(runText("plain").GetOutput().GetMessage()); !strings.Contains(got, "You said: plain") {
		t.Errorf("run the middleware let through said %q", got)
	}
	// The same through RunStream.
	checkHalted(runStream(ctx, t, c, "stream: halt me"))
	if got := content.TextOf(runStream(ctx, t, c, "stream: rewrite me").GetOutput().GetMessage()); !strings.Contains(got, "You said: rewritten by policy") {
		t.Errorf("rewritten stream said %q", got)
	}
	if got := content.TextOf(runStream(ctx, t, c, "redact the stream").GetOutput().GetMessage()); got != "[output withheld by policy]" {
		t.Errorf("stream whose output the middleware replaced said %q", got)
	}

	// A halted invocation never ran: no AFTER call for it.
	seen := p.Seen()
	for _, want := range []string{"PHASE_BEFORE please halt me", "PHASE_AFTER rewritten by policy", "PHASE_AFTER plain", "PHASE_BEFORE stream: halt me"} {
		if !strings.Contains(seen, want) {
			t.Errorf("middleware calls:\n%s\nwant %q", seen, want)
		}
	}
	if strings.Contains(seen, "PHASE_AFTER please halt me") || strings.Contains(seen, "PHASE_AFTER stream: halt me") {
		t.Errorf("middleware calls:\n%s\na halted run went on", seen)
	}
}

// TestExecMiddlewareFailPolicy: an unreachable middleware stops a
// fail-closed binary from starting, naming the flag; fail-open starts,
// and runs proceed unchanged.
func TestExecMiddlewareFailPolicy(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	if _, err := startBinary(t, "--middleware-addr", dead, "--middleware-timeout", "300ms"); err == nil || !strings.Contains(err.Error(), "middleware") {
		t.Fatalf("fail-closed with an unreachable middleware: started (err %v); want a start-up error naming the middleware", err)
	}
	requireProcessBackend(t)
	c, err := startBinary(t, "--middleware-addr", dead, "--middleware-timeout", "300ms", "--middleware-fail-open")
	if err != nil {
		t.Fatalf("fail-open: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := c.Run(ctx, &environmentv1.RunRequest{Input: &operatorv1.OperatorInput{Message: content.Text("halt me")}, Spec: processSpec()})
	if err != nil || !strings.Contains(content.TextOf(resp.GetOutput().GetMessage()), "You said: halt me") {
		t.Fatalf("fail-open run: %v, %v; want it to proceed unchanged", resp, err)
	}
	if errs.Code(err) != codes.OK {
		t.Fatal(err)
	}
}
