package environment_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/internal/mwtest"
)

// execPolicy is a MiddlewareService at the exec boundary for sandbox
// commands: before, it halts a command mentioning "forbidden", rewrites
// the argv of one mentioning "rewrite-me", replaces the text of one
// mentioning "shell-me", and fails on one mentioning "explode"; after,
// it halts a command that exited 3. It records what it was shown.
func execPolicy() *mwtest.Policy {
	return &mwtest.Policy{
		Name: "sandbox-policy",
		Line: func(r *middlewarev1.InterceptExecRequest) string {
			in := r.GetInput()
			return r.GetPhase().String() + " " + in.GetCustomTrigger() + " " + content.TextOf(in.GetMessage()) + " -> " + content.TextOf(r.GetOutput().GetMessage())
		},
		Decide: func(r *middlewarev1.InterceptExecRequest) (*middlewarev1.InterceptExecResponse, error) {
			in := r.GetInput()
			cmd := content.TextOf(in.GetMessage())
			if r.GetPhase() == middlewarev1.Phase_PHASE_BEFORE {
				switch {
				case strings.Contains(cmd, "forbidden"):
					return mwtest.Verdict(middlewarev1.VerdictKind_VERDICT_KIND_HALT, "no forbidden commands"), nil
				case strings.Contains(cmd, "rewrite-me"):
					repl := proto.Clone(in).(*operatorv1.OperatorInput)
					argv, _ := structpb.NewList([]any{"echo", "rewritten by policy"})
					repl.Metadata.Fields["argv"] = structpb.NewListValue(argv)
					v := mwtest.Verdict(middlewarev1.VerdictKind_VERDICT_KIND_MODIFY, "rewrite")
					v.Input = repl
					return v, nil
				case strings.Contains(cmd, "shell-me"):
					repl := proto.Clone(in).(*operatorv1.OperatorInput)
					repl.Message = content.Text("echo via the shell; echo $((6*7))")
					v := mwtest.Verdict(middlewarev1.VerdictKind_VERDICT_KIND_MODIFY, "shell")
					v.Input = repl
					return v, nil
				case strings.Contains(cmd, "explode"):
					return nil, status.Error(codes.Internal, "policy engine down")
				}
			}
			if r.GetPhase() == middlewarev1.Phase_PHASE_AFTER && content.TextOf(r.GetOutput().GetMessage()) == "exit 3" {
				return mwtest.Verdict(middlewarev1.VerdictKind_VERDICT_KIND_HALT, "exit 3 is reported"), nil
			}
			return mwtest.Verdict(middlewarev1.VerdictKind_VERDICT_KIND_CONTINUE, ""), nil
		},
	}
}

// serveExecPolicy serves p on a loopback port and returns the flags that
// point the environment service at it.
func serveExecPolicy(t *testing.T, p *mwtest.Policy, failOpen bool) remote.Flags {
	t.Helper()
	return remote.Flags{Client: grpcclient.Config{Target: mwtest.Serve(t, p), Dev: true, Plaintext: true, Timeout: 10 * time.Second}, FailOpen: failOpen}
}

// TestExecSandboxMiddleware: with an exec-boundary middleware the
// service consults it before and after each Exec of a sandbox command,
// through the real gRPC service and the process backend: a HALT before
// refuses the command PERMISSION_DENIED with the middleware's reason and
// it never runs; a MODIFY runs the rewritten command (a new argv, or a
// new text run by the shell); after, the middleware sees the exit status
// and a HALT then ends the call PERMISSION_DENIED; a middleware failure
// refuses the command when fail-closed and lets it run when fail-open.
func TestExecSandboxMiddleware(t *testing.T) {
	requireSandbox(t)
	p := execPolicy()
	e := startEnv(t, envOptions{middleware: serveExecPolicy(t, p, false)})
	id := e.newSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(e *env, id string, argv ...string) *execStream {
		x := e.startExec(ctx, t, &environmentv1.ExecStart{SandboxId: id, Argv: argv})
		x.finish()
		return x
	}

	x := run(e, id, "sh", "-c", "echo forbidden > halted.txt")
	if errs.Code(x.err) != codes.PermissionDenied || !strings.Contains(x.err.Error(), "no forbidden commands") || !strings.Contains(x.err.Error(), "not run") {
		t.Errorf("halted command: %v, want PERMISSION_DENIED with the reason", x.err)
	}
	if x := run(e, id, "ls"); strings.Contains(x.stdout.String(), "halted.txt") {
		t.Errorf("the halted command ran: %q", x.stdout.String())
	}

	x = run(e, id, "echo", "rewrite-me")
	if x.err != nil || x.stdout.String() != "rewritten by policy\n" {
		t.Errorf("rewritten argv: %q, %v", x.stdout.String(), x.err)
	}
	x = run(e, id, "echo", "shell-me")
	if x.err != nil || x.stdout.String() != "via the shell\n42\n" {
		t.Errorf("rewritten text: %q, %v", x.stdout.String(), x.err)
	}

	x = run(e, id, "sh", "-c", "echo three; exit 3")
	if errs.Code(x.err) != codes.PermissionDenied || !strings.Contains(x.err.Error(), "ran (exit 3)") || !strings.Contains(x.err.Error(), "exit 3 is reported") {
		t.Errorf("halted after: %v, want PERMISSION_DENIED naming the exit and the reason", x.err)
	}
	if x.stdout.String() != "three\n" || x.exit != nil {
		t.Errorf("halted after: stdout %q exit %v; want the output, no exit message", x.stdout.String(), x.exit)
	}

	x = run(e, id, "sh", "-c", "echo explode > exploded.txt")
	if x.err == nil || x.exit != nil {
		t.Errorf("fail-closed middleware failure: %v, %v; want an error", x.exit, x.err)
	}
	if x := run(e, id, "ls"); strings.Contains(x.stdout.String(), "exploded.txt") {
		t.Errorf("fail-closed: the command ran although the middleware failed: %q", x.stdout.String())
	}

	seen := p.Seen()
	for _, want := range []string{
		"PHASE_BEFORE " + environment.ExecTrigger + " sh -c 'echo forbidden > halted.txt' -> ",
		"PHASE_AFTER " + environment.ExecTrigger + " echo rewrite-me -> exit 0",
		"PHASE_AFTER " + environment.ExecTrigger + " sh -c 'echo three; exit 3' -> exit 3",
	} {
		if !strings.Contains(seen, want) {
			t.Errorf("middleware calls:\n%s\nwant %q", seen, want)
		}
	}
	if strings.Contains(seen, "PHASE_AFTER "+environment.ExecTrigger+" sh -c 'echo forbidden") {
		t.Errorf("a halted command went on:\n%s", seen)
	}

	// Fail-open: the same failure lets the command run, unchanged.
	open := startEnv(t, envOptions{middleware: serveExecPolicy(t, execPolicy(), true)})
	oid := open.newSandbox(t)
	x = run(open, oid, "echo", "explode")
	if x.err != nil || x.stdout.String() != "explode\n" || x.exit.GetCode() != 0 {
		t.Errorf("fail-open: %q %v %v; want the command to run", x.stdout.String(), x.exit, x.err)
	}
}
