package docker

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/environment"
)

const (
	toolboxPkg   = "github.com/secbear/neuron/services/environment/docker/internal/toolbox"
	toolboxImage = "neuron-toolbox:sandbox-test"
)

// sandboxExec is what one Exec brought back.
type sandboxExec struct {
	stdout, stderr string
	exit           *environmentv1.ExecExit
	err            error
}

// execIn runs argv in sandbox id through Exec: start (with tty and size
// when tty), then each of msgs as it is, then (unless keepOpen) the end
// of the client's side; it collects everything until the call ends.
func execIn(t *testing.T, c environmentv1.EnvironmentServiceClient, id string, tty bool, msgs []*environmentv1.ExecRequest, argv ...string) sandboxExec {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := c.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := &environmentv1.ExecStart{SandboxId: id, Argv: argv, Tty: tty}
	_ = st.Send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Start{Start: start}})
	for _, m := range msgs {
		_ = st.Send(m)
	}
	var r sandboxExec
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

func stdinMsg(s string) *environmentv1.ExecRequest {
	return &environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Stdin{Stdin: []byte(s)}}
}

var closeStdin = &environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_CloseStdin{CloseStdin: true}}

func signalMsg(s string) *environmentv1.ExecRequest {
	return &environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Signal{Signal: s}}
}

// sandboxContainers returns the sandbox containers, running or not.
func sandboxContainers(t *testing.T, cli *client.Client) []string {
	t.Helper()
	res, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", LabelSandbox)})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range res.Items {
		out = append(out, c.ID)
	}
	return out
}

// TestDockerSandbox: CreateSandbox on the docker backend starts one
// long-lived container with the isolation of Run, and each Exec runs in
// it through the engine's exec API, through the real gRPC service:
// stdin in, stdout, stderr and the exit code out, streamed (a prompt
// without a newline arrives before any input is sent); the workspace
// lasts across commands and is read and written with the workspace API;
// a terminal on request, resized; signals (a trapped SIGTERM, an
// untrapped one); a timeout and a process left behind end with no
// process left; the attack classes of Run (not root, no capability, no
// new privileges, read-only root, no network, no engine socket, a
// credential scrubbed, a link out not followed, the cap checked before
// a command); CloseSandbox and the idle timeout remove the container
// and its volume.
func TestDockerSandbox(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dockerd and builds an image")
	}
	if _, err := os.Stat(caBundle); err != nil {
		t.Skipf("no CA bundle at %s for the image: apt-get install ca-certificates", caBundle)
	}
	eng := testenv.Docker(t)
	dir := t.TempDir()
	tb := filepath.Join(dir, "toolbox")
	if err := os.Link(testenv.BuildStatic(t, toolboxPkg), tb); err != nil {
		t.Fatal(err)
	}
	cli, err := client.New(client.WithHost(eng.Host))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	df := filepath.Join(dir, "Dockerfile")
	if err := os.WriteFile(df, []byte("FROM scratch\nCOPY toolbox /operator\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	buildImage(t, cli, df, tb, toolboxImage)

	const secret = "dock-sbx-secret-0123456789abcdef"
	secrets := filepath.Join(dir, "secrets")
	if err := os.Mkdir(secrets, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "tok"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	data := shortDir(t)
	d := environment.DefaultDefaults()
	d.Timeout = 5 * time.Second
	cfg := environment.Config{
		Server:            grpcserver.Config{Name: "environment", Dev: true, ShutdownTimeout: 2 * time.Second},
		Log:               harness.Logger(t),
		Backend:           "docker",
		DockerHost:        eng.Host,
		DefaultImage:      toolboxImage,
		DataDir:           data,
		SecretsDir:        secrets,
		Defaults:          d,
		WorkspaceMaxBytes: 1 << 20,
	}
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg.Listener = lis
		return environment.Run(ctx, cfg)
	})
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, Plaintext: true, MaxRetries: -1, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := environmentv1.NewEnvironmentServiceClient(conn)
	ctx := context.Background()

	spec := &environmentv1.EnvironmentSpec{
		Credentials: []*environmentv1.CredentialRef{{Name: "tok", Injection: envInj("TOK")}},
	}
	sb, err := c.CreateSandbox(ctx, &environmentv1.CreateSandboxRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if sb.GetBackend() != "docker" {
		t.Errorf("backend %q, want docker", sb.GetBackend())
	}
	id := sb.GetSandboxId()
	ids := sandboxContainers(t, cli)
	if len(ids) != 1 {
		t.Fatalf("%d sandbox containers, want 1", len(ids))
	}
	ctr, err := cli.ContainerInspect(ctx, ids[0], client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hc := ctr.Container.HostConfig; string(hc.NetworkMode) != "none" || !hc.ReadonlyRootfs || hc.Privileged || len(hc.CapDrop) != 1 || hc.CapDrop[0] != "ALL" || hc.Resources.PidsLimit == nil || hc.Resources.Memory == 0 {
		t.Errorf("sandbox container host config: network %s, read-only root %v, privileged %v, cap drop %v, limits %+v", hc.NetworkMode, hc.ReadonlyRootfs, hc.Privileged, hc.CapDrop, hc.Resources)
	}
	for _, e := range ctr.Container.Config.Env {
		if strings.Contains(e, secret) {
			t.Errorf("the credential is in the container's environment: %s", e)
		}
	}

	t.Run("streams", func(t *testing.T) {
		r := execIn(t, c, id, false, []*environmentv1.ExecRequest{stdinMsg("from stdin\n"), closeStdin}, "/operator", "cat")
		if r.err != nil || r.stdout != "from stdin\n" || r.exit.GetCode() != 0 {
			t.Fatalf("cat: %+v", r)
		}
		r = execIn(t, c, id, false, []*environmentv1.ExecRequest{closeStdin}, "/operator", "err", "to stderr")
		if r.err != nil || r.stderr != "to stderr\n" || r.stdout != "" {
			t.Fatalf("stderr: %+v", r)
		}
		r = execIn(t, c, id, false, []*environmentv1.ExecRequest{closeStdin}, "/operator", "exit", "3")
		if r.err != nil || r.exit.GetCode() != 3 {
			t.Fatalf("exit 3: %+v", r)
		}
		// A command named without a '/' is looked up in the PATH; one
		// that does not exist fails as the engine says.
		r = execIn(t, c, id, false, []*environmentv1.ExecRequest{closeStdin}, "no-such-command")
		if r.err == nil && r.exit.GetCode() == 0 {
			t.Fatalf("a missing command succeeded: %+v", r)
		}
		// Interactive: the prompt (no newline) arrives before any
		// input is sent, then the answer to the input.
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		st, err := c.Exec(sctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Start{Start: &environmentv1.ExecStart{SandboxId: id, Argv: []string{"/operator", "prompt"}}}})
		m, err := st.Recv()
		if err != nil || string(m.GetStdout()) != "name? " {
			t.Fatalf("the prompt: %v, %v", m, err)
		}
		_ = st.Send(stdinMsg("world\n"))
		var out string
		for {
			m, err := st.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
				break
			}
			out += string(m.GetStdout())
		}
		if out != "hello world\n" {
			t.Errorf("after the prompt: %q", out)
		}
		// Much output arrives whole and in order.
		const n = 3 << 20
		r = execIn(t, c, id, false, []*environmentv1.ExecRequest{closeStdin}, "/operator", "flood", "3145728")
		if r.err != nil || len(r.stdout) != n || !strings.HasPrefix(r.stdout, "00000000\n00000001\n") || !strings.Contains(r.stdout, "\n00349524\n") {
			t.Fatalf("flood: %d bytes, %v", len(r.stdout), r.err)
		}
	})

	ref := &environmentv1.WorkspaceRef{Kind: &environmentv1.WorkspaceRef_SandboxId{SandboxId: id}}
	t.Run("workspace lasts", func(t *testing.T) {
		if r := execIn(t, c, id, false, nil, "/operator", "write", "notes.md", "written by one command"); r.err != nil || r.exit.GetCode() != 0 {
			t.Fatalf("write: %+v", r)
		}
		if r := execIn(t, c, id, false, nil, "/operator", "read", "notes.md"); r.stdout != "written by one command" {
			t.Fatalf("the next command: %+v", r)
		}
		rs, err := c.ReadWorkspaceFile(ctx, &environmentv1.ReadWorkspaceFileRequest{Workspace: ref, Path: "notes.md"})
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		for {
			m, err := rs.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
				break
			}
			got = append(got, m.GetData()...)
		}
		if string(got) != "written by one command" {
			t.Errorf("ReadWorkspaceFile: %q", got)
		}
		ws, err := c.WriteWorkspaceFile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = ws.Send(&environmentv1.WriteWorkspaceFileRequest{Kind: &environmentv1.WriteWorkspaceFileRequest_Header{Header: &environmentv1.WorkspaceFileHeader{Workspace: ref, Path: "in/up.txt"}}})
		_ = ws.Send(&environmentv1.WriteWorkspaceFileRequest{Kind: &environmentv1.WriteWorkspaceFileRequest_Data{Data: []byte("uploaded")}})
		if _, err := ws.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
		if r := execIn(t, c, id, false, nil, "/operator", "read", "in/up.txt"); r.stdout != "uploaded" {
			t.Errorf("the upload, read by a command: %+v", r)
		}
		// A link a command leaves is not followed by the file API.
		if r := execIn(t, c, id, false, nil, "/operator", "symlink", "/etc", "leak"); r.exit.GetCode() != 0 {
			t.Fatalf("symlink: %+v", r)
		}
		rs, err = c.ReadWorkspaceFile(ctx, &environmentv1.ReadWorkspaceFileRequest{Workspace: ref, Path: "leak/passwd"})
		if err == nil {
			_, err = rs.Recv()
		}
		if code := status.Code(err); code != codes.FailedPrecondition && code != codes.InvalidArgument {
			t.Errorf("reading through a link out: %v, want it refused", err)
		}
	})

	t.Run("isolation", func(t *testing.T) {
		r := execIn(t, c, id, false, nil, "/operator", "probe")
		if r.err != nil {
			t.Fatal(r.err)
		}
		for _, want := range []string{
			"uid=65532 gid=65532", "CapEff: 0000000000000000", "CapPrm: 0000000000000000", "CapBnd: 0000000000000000", "NoNewPrivs: 1",
			"read-shadow=refused", "write-root=refused", "write-operator=refused", "docker-sock=refused", "run-docker-sock=refused",
			"dial-internet=refused", "mount=refused", "setuid-root=refused", "unshare-user=refused", "interfaces=lo\n",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("probe lacks %q:\n%s%s", want, r.stdout, r.stderr)
			}
		}
		// The credential reaches the command and comes back redacted.
		r = execIn(t, c, id, false, nil, "/operator", "env", "TOK")
		if strings.Contains(r.stdout, secret) || r.stdout != "TOK=[REDACTED]\n" {
			t.Errorf("credential: %q", r.stdout)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		st, err := c.Exec(sctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Start{Start: &environmentv1.ExecStart{
			SandboxId: id, Argv: []string{"/operator", "tty", "wait", "40", "120"}, Tty: true, Size: &environmentv1.TerminalSize{Rows: 30, Cols: 100},
		}}})
		var out string
		resized := false
		for {
			m, err := st.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
				break
			}
			out += string(m.GetStdout())
			if !resized && strings.Contains(out, "waiting") {
				resized = true
				_ = st.Send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Resize{Resize: &environmentv1.TerminalSize{Rows: 40, Cols: 120}}})
			}
		}
		for _, want := range []string{"fd0 tty=true\r\n", "fd1 tty=true\r\n", "fd2 tty=true\r\n", "resized 40 120\r\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("terminal output lacks %q:\n%q", want, out)
			}
		}
		// The size asked for at the start: read at once, or (the engine
		// may apply it only after the command has started) as a change.
		if !strings.Contains(out, "size 30 100\r\n") && !strings.Contains(out, "resized 30 100\r\n") {
			t.Errorf("the terminal never had the size asked for at the start (30 x 100):\n%q", out)
		}
		// End of input on a terminal (^D) ends cat.
		r := execIn(t, c, id, true, []*environmentv1.ExecRequest{stdinMsg("typed\n"), closeStdin}, "/operator", "cat")
		if r.err != nil || r.exit.GetCode() != 0 || !strings.Contains(r.stdout, "typed") {
			t.Errorf("cat on a terminal: %+v", r)
		}
	})

	t.Run("signals", func(t *testing.T) {
		// A trapped SIGTERM runs the handler; the command exits 0.
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		st, err := c.Exec(sctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(&environmentv1.ExecRequest{Kind: &environmentv1.ExecRequest_Start{Start: &environmentv1.ExecStart{SandboxId: id, Argv: []string{"/operator", "trap"}}}})
		var out string
		var exit *environmentv1.ExecExit
		sent := false
		for {
			m, err := st.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
				break
			}
			out += string(m.GetStdout())
			if m.GetExit() != nil {
				exit = m.GetExit()
			}
			if !sent && strings.Contains(out, "ready") {
				sent = true
				_ = st.Send(signalMsg("SIGTERM"))
			}
		}
		if !strings.Contains(out, "trapped terminated") || exit.GetCode() != 0 || exit.GetSignal() != "" {
			t.Errorf("trapped SIGTERM: %q, exit %v", out, exit)
		}
		// An untrapped SIGTERM ends the command by it.
		r := execIn(t, c, id, false, []*environmentv1.ExecRequest{signalMsg("SIGTERM")}, "/operator", "sleep", "100s")
		if r.err != nil || r.exit.GetSignal() != "SIGTERM" || r.exit.GetCode() != -1 {
			t.Errorf("SIGTERM: %+v, want exit by SIGTERM", r)
		}
		r = execIn(t, c, id, false, []*environmentv1.ExecRequest{signalMsg("SIGSEGV")}, "/operator", "sleep", "100s")
		if status.Code(r.err) != codes.InvalidArgument {
			t.Errorf("an unknown signal: %+v, want INVALID_ARGUMENT", r)
		}
	})

	t.Run("no process left", func(t *testing.T) {
		// A process a command leaves behind is killed when it ends.
		r := execIn(t, c, id, false, nil, "/operator", "spawn")
		pid := strings.TrimSpace(r.stdout)
		if r.err != nil || pid == "" {
			t.Fatalf("spawn: %+v", r)
		}
		if r := execIn(t, c, id, false, nil, "/operator", "alive", pid); r.stdout != "gone\n" {
			t.Errorf("the process the last command left: %q, want gone", r.stdout)
		}
		// The timeout (spec.timeout, here the service's 5 s default)
		// ends every process of the command.
		r = execIn(t, c, id, false, nil, "/operator", "sleep", "1h")
		if r.err != nil || !r.exit.GetTimedOut() {
			t.Fatalf("a command past its timeout: %+v", r)
		}
		// The sandbox still runs commands.
		if r := execIn(t, c, id, false, nil, "/operator", "echo", "still here"); r.stdout != "still here\n" {
			t.Errorf("after the timeout: %+v", r)
		}
	})

	t.Run("cap checked before", func(t *testing.T) {
		// The workspace cap is 1 MiB: a command can leave more (a
		// volume has no size limit), which fails it; the next command
		// is refused before it runs.
		r := execIn(t, c, id, false, nil, "/operator", "fill", "big.bin", "2000000")
		if status.Code(r.err) != codes.ResourceExhausted || !strings.Contains(r.err.Error(), "after the command") {
			t.Fatalf("filling past the cap: %+v, want RESOURCE_EXHAUSTED after the command", r)
		}
		r = execIn(t, c, id, false, nil, "/operator", "echo", "x")
		if status.Code(r.err) != codes.ResourceExhausted || !strings.Contains(r.err.Error(), "before the command") || r.stdout != "" {
			t.Fatalf("the next command: %+v, want RESOURCE_EXHAUSTED before the command", r)
		}
	})

	t.Run("egress and hostile specs", func(t *testing.T) {
		// A spec that allows a host gets the egress proxy's socket, and
		// the proxy's policy: another host is refused.
		sb, err := c.CreateSandbox(ctx, &environmentv1.CreateSandboxRequest{Spec: &environmentv1.EnvironmentSpec{
			Network: &environmentv1.NetworkPolicy{DefaultAction: environmentv1.NetworkAction_NETWORK_ACTION_DENY, Rules: []*environmentv1.NetworkRule{
				{Destination: "allowed.example", Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW},
			}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseSandbox(ctx, &environmentv1.CloseSandboxRequest{SandboxId: sb.GetSandboxId()})
		r := execIn(t, c, sb.GetSandboxId(), false, nil, "/operator", "egress", "denied.example")
		if r.err != nil || !strings.HasPrefix(r.stdout, "HTTP/1.1 403") {
			t.Errorf("a denied host through the proxy: %+v, want 403", r)
		}
		// Specs Run refuses are refused before any container exists.
		before := len(sandboxContainers(t, cli))
		for _, spec := range []*environmentv1.EnvironmentSpec{
			{Credentials: []*environmentv1.CredentialRef{{Name: "tok", Injection: fileInj("/proc/self/environ")}}},
			{Credentials: []*environmentv1.CredentialRef{{Name: "tok", Injection: envInj("LD_PRELOAD")}}},
			{Resources: &environmentv1.ResourceLimits{Memory: ptr("1Mi")}},
			{Isolation: []*environmentv1.IsolationBoundary{containerBoundary("bad image name!")}},
		} {
			if _, err := c.CreateSandbox(ctx, &environmentv1.CreateSandboxRequest{Spec: spec}); err == nil {
				t.Errorf("CreateSandbox(%v) succeeded", spec)
			}
		}
		if after := len(sandboxContainers(t, cli)); after != before {
			t.Errorf("%d sandbox containers after hostile specs, want %d", after, before)
		}
	})

	t.Run("close", func(t *testing.T) {
		if _, err := c.CloseSandbox(ctx, &environmentv1.CloseSandboxRequest{SandboxId: id}); err != nil {
			t.Fatal(err)
		}
		if left := sandboxContainers(t, cli); len(left) != 0 {
			t.Errorf("%d sandbox containers left after CloseSandbox", len(left))
		}
		vols, err := cli.VolumeList(ctx, client.VolumeListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(vols.Items) != 0 {
			t.Errorf("%d volumes left after CloseSandbox, e.g. %s", len(vols.Items), vols.Items[0].Name)
		}
		if r := execIn(t, c, id, false, nil, "/operator", "echo", "x"); status.Code(r.err) != codes.NotFound {
			t.Errorf("Exec in a closed sandbox: %+v, want NOT_FOUND", r)
		}
		// The idle timeout removes another.
		sb, err := c.CreateSandbox(ctx, &environmentv1.CreateSandboxRequest{Spec: &environmentv1.EnvironmentSpec{}, IdleTimeout: durationpb.New(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		if r := execIn(t, c, sb.GetSandboxId(), false, nil, "/operator", "echo", "x"); r.stdout != "x\n" {
			t.Fatalf("second sandbox: %+v", r)
		}
		deadline := time.Now().Add(time.Minute)
		for len(sandboxContainers(t, cli)) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("the idle sandbox's container is still there after a minute")
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if left := containers(t, cli); len(left) != 0 {
		t.Errorf("%d run containers left", len(left))
	}
}
