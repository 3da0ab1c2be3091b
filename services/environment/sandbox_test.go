package environment_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// execResult is what one Exec answered.
type execResult struct {
	stdout, stderr string
	exit           *environmentv1.ExecExit
	err            error
}

// exec runs argv in sandbox id with stdin; signal, when set, is sent
// right after the input is closed.
func (e *env) exec(t *testing.T, id string, stdin, signal string, argv ...string) execResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := e.client.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Start{Start: &environmentv1.ExecStart{SandboxId: id, Argv: argv}}})
	if stdin != "" {
		_ = st.Send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Stdin{Stdin: []byte(stdin)}})
	}
	_ = st.Send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_CloseStdin{CloseStdin: true}})
	if signal != "" {
		_ = st.Send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Signal{Signal: signal}})
	} else {
		_ = st.CloseSend()
	}
	var r execResult
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return r
		}
		if err != nil {
			r.err = err
			return r
		}
		r.stdout += string(m.GetStdout())
		r.stderr += string(m.GetStderr())
		if m.GetExit() != nil {
			r.exit = m.GetExit()
		}
	}
}

// TestSandboxSession: a sandbox runs commands one after another in a
// workspace that lasts (stdin in; stdout, stderr and the exit code out;
// files readable with the workspace API), with the isolation of Run
// (its own uid, no /etc/shadow, /proc or network, credentials scrubbed
// from what comes back); a signal stops a command; a closed sandbox and
// an idle one are gone.
func TestSandboxSession(t *testing.T) {
	requireSandbox(t)
	const secret = "sbx-secret-0123456789abcdef"
	e := startEnv(t, envOptions{secrets: map[string]string{"tok": secret}})
	ctx := context.Background()
	spec := &environmentv1.EnvironmentSpec{
		Isolation: []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}},
		Credentials: []*environmentv1.CredentialRef{{Name: "tok", Injection: &environmentv1.CredentialInjection{
			Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "TOK"}}}}},
	}
	sb, err := e.client.CreateSandbox(ctx, &environmentv1.CreateSandboxRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if sb.GetBackend() != "process" {
		t.Errorf("backend %q", sb.GetBackend())
	}
	id := sb.GetSandboxId()

	r := e.exec(t, id, "from stdin\n", "", "sh", "-c", "echo out; echo err >&2; cat > in.txt; exit 3")
	if r.err != nil || r.stdout != "out\n" || r.stderr != "err\n" || r.exit.GetCode() != 3 {
		t.Fatalf("first command: %+v", r)
	}
	if r := e.exec(t, id, "", "", "cat", "in.txt"); r.err != nil || r.stdout != "from stdin\n" || r.exit.GetCode() != 0 {
		t.Errorf("the next command did not find the file: %+v", r)
	}
	ref := &environmentv1.WorkspaceRef{Kind: &environmentv1.WorkspaceRef_SandboxId{SandboxId: id}}
	if got, err := e.readFile(t, ref, "in.txt"); err != nil || got != "from stdin\n" {
		t.Errorf("ReadWorkspaceFile: %q, %v", got, err)
	}

	// The attack classes of Run, against Exec.
	r = e.exec(t, id, "", "", "sh", "-c", `id -u; echo "tok=$TOK"; cat /etc/shadow; ls /proc/1; ls /run/; `+
		`ln -s /etc/passwd pw; exec 3<>/dev/tcp/1.1.1.1/80 && echo NETWORK; true`)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if strings.HasPrefix(r.stdout, "0\n") || strings.Contains(r.stdout, "root:") || strings.Contains(r.stdout, "NETWORK") {
		t.Errorf("the command escaped its isolation:\n%s\n%s", r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, secret) || !strings.Contains(r.stdout, "tok=[REDACTED]") {
		t.Errorf("the credential came back unscrubbed (or never reached the command):\n%s", r.stdout)
	}
	for _, want := range []string{"/etc/shadow: No such file", "/proc/1", "/run/"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	_, err = e.readFile(t, ref, "pw")
	wantCode(t, err, codes.InvalidArgument, "leaves the workspace")

	// A signal stops a command (sleep, the init of its pid namespace,
	// has no handler: the default action is carried out).
	r = e.exec(t, id, "", "SIGTERM", "sleep", "100")
	if r.err != nil || r.exit.GetSignal() != "SIGTERM" || r.exit.GetCode() != -1 {
		t.Errorf("a signalled command: %+v, want exit by SIGTERM", r)
	}
	// A signal Exec does not deliver is refused, naming the ones it does.
	r = e.exec(t, id, "", "SIGSEGV", "sleep", "100")
	if errs.Code(r.err) != codes.InvalidArgument || !strings.Contains(r.err.Error(), "SIGTERM") {
		t.Errorf("an unknown signal: %+v, want INVALID_ARGUMENT", r)
	}

	if c, err := e.client.CloseSandbox(ctx, &environmentv1.CloseSandboxRequest{SandboxId: id}); err != nil || !c.GetExisted() {
		t.Fatalf("CloseSandbox: %v, %v", c, err)
	}
	if r := e.exec(t, id, "", "", "true"); errs.Code(r.err) != codes.NotFound {
		t.Errorf("Exec in a closed sandbox: %+v", r)
	}
	_, err = e.readFile(t, ref, "in.txt")
	wantCode(t, err, codes.NotFound)

	// An idle sandbox is closed.
	idle, err := e.client.CreateSandbox(ctx, &environmentv1.CreateSandboxRequest{Spec: spec, IdleTimeout: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	gone := false
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && !gone; time.Sleep(200 * time.Millisecond) {
		_, err := e.client.ListWorkspaceFiles(ctx, &environmentv1.ListWorkspaceFilesRequest{Workspace: &environmentv1.WorkspaceRef{Kind: &environmentv1.WorkspaceRef_SandboxId{SandboxId: idle.GetSandboxId()}}})
		gone = errs.Code(err) == codes.NotFound
	}
	if !gone {
		t.Error("an idle sandbox outlived its idle_timeout")
	}
	if len(sandboxProcesses(t, "sleep 100")) > 0 {
		t.Errorf("processes left: %v", sandboxProcesses(t, "sleep 100"))
	}
}
