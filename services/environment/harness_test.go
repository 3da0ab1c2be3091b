package environment_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/egress"
	// The backends the tests start register themselves with Run.
	_ "github.com/secbear/neuron/services/environment/local"
	_ "github.com/secbear/neuron/services/environment/process"
)

func TestMain(m *testing.M) {
	sandbox.Main() // the process backend re-executes this test binary
	os.Exit(m.Run())
}

// operatorBinary is the static operator binary, built once per test
// binary.
func operatorBinary(t *testing.T) string {
	t.Helper()
	return testenv.BuildStatic(t, "github.com/secbear/neuron/services/operator/cmd/operator")
}

// requireSandbox skips tests of the process backend on hosts that cannot
// confine it; the refusal itself is tested by TestFailClosed.
func requireSandbox(t *testing.T) {
	t.Helper()
	if err := sandbox.Supported(); err != nil {
		t.Skipf("the process backend needs Landlock: %v", err)
	}
	if err := sandbox.CgroupSupported(); err != nil {
		t.Skipf("the process backend needs a cgroup: %v", err)
	}
}

// env is one environment service under test.
type env struct {
	client  environmentv1.EnvironmentServiceClient
	logs    *syncBuffer
	workDir string
}

type envOptions struct {
	operatorArgs []string
	// secrets are written to the service's --secrets-dir, one file each.
	secrets map[string]string
	// egress are the administrator's egress settings.
	egressStaticHosts  map[string]string
	egressAllowPrivate []netip.Prefix
	egressCAFile       string
	egressResolver     egress.Resolver
	defaults           *environment.Defaults
	extra              []environment.Backend
	container          string
	// state is the address of a state service (Config.State).
	state string
	// readOnly are extra paths the sandbox may read (Config.ReadOnly).
	readOnly []string
	// maxConcurrent is Config.MaxConcurrent (0: the default).
	maxConcurrent int
	// binary replaces the operator binary (a stand-in the test built).
	binary string
	// progress is Config.Progress (zero: the defaults).
	progress environment.ProgressLimits
	// workspaceMax is Config.WorkspaceMaxBytes (0: the default).
	workspaceMax int64
	// middleware is Config.Middleware (the exec-boundary middleware).
	middleware remote.Flags
}

// startEnv serves an environment service with the process backend on a
// real TCP port, started as the binary starts it (environment.Run), and
// returns a client.
func startEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	data := t.TempDir()
	args := o.operatorArgs
	if args == nil {
		args = []string{"--tools", "read,write,edit,bash", "--tool-timeout", "20s"}
	}
	d := environment.DefaultDefaults()
	d.Timeout = 60 * time.Second
	d.Limits.MemoryBytes = 1 << 30
	if o.defaults != nil {
		d = *o.defaults
	}
	binary := o.binary
	if binary == "" {
		binary = operatorBinary(t)
	}
	cfg := environment.Config{
		Server:             grpcserver.Config{Name: "environment", Dev: true, ShutdownTimeout: 2 * time.Second},
		Log:                log,
		Backend:            "process",
		ContainerBackend:   o.container,
		ExtraBackends:      o.extra,
		DataDir:            data,
		OperatorBinary:     binary,
		OperatorArgs:       args,
		ReadOnly:           o.readOnly,
		SecretsDir:         secretsDir(t, o.secrets),
		Defaults:           d,
		MaxConcurrent:      o.maxConcurrent,
		Progress:           o.progress,
		EgressStaticHosts:  o.egressStaticHosts,
		EgressAllowPrivate: o.egressAllowPrivate,
		EgressCAFile:       o.egressCAFile,
		EgressResolver:     o.egressResolver,
		WorkspaceMaxBytes:  o.workspaceMax,
		Middleware:         o.middleware,
	}
	if o.state != "" {
		cfg.State = grpcclient.Config{Target: o.state, Dev: true}
	}
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg.Listener = lis
		return environment.Run(ctx, cfg)
	})
	return &env{client: dialEnv(t, addr), logs: logs, workDir: filepath.Join(data, "work")}
}

// dialEnv connects to an environment service as its callers do: no
// retries (a test sees the first answer), generous deadlines.
func dialEnv(t *testing.T, addr string) environmentv1.EnvironmentServiceClient {
	t.Helper()
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, Plaintext: true, MaxRetries: -1, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return environmentv1.NewEnvironmentServiceClient(conn)
}

// secretsDir writes secrets into a directory, one file per name (the
// layout of a mounted Kubernetes Secret), for Config.SecretsDir.
func secretsDir(t *testing.T, secrets map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, v := range secrets {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// run calls Run with a text message.
func (e *env) run(t *testing.T, text string, spec *environmentv1.EnvironmentSpec) (*environmentv1.RunResponse, error) {
	t.Helper()
	if spec == nil {
		spec = &environmentv1.EnvironmentSpec{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return e.client.Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{Message: content.Text(text)},
		Spec:  spec,
	})
}

// bash runs command through the operator's bash tool (the scripted
// model's "/tool" rule) and returns the model's final text, which quotes
// the first 200 characters of the tool result.
func (e *env) bash(t *testing.T, command string, spec *environmentv1.EnvironmentSpec) (string, *environmentv1.RunResponse) {
	t.Helper()
	args, _ := json.Marshal(map[string]any{"command": command, "timeout_seconds": 30})
	resp, err := e.run(t, "/tool bash "+string(args), spec)
	if err != nil {
		t.Fatalf("Run(bash %q): %v", command, err)
	}
	return text(resp), resp
}

func text(resp *environmentv1.RunResponse) string {
	return content.TextOf(resp.GetOutput().GetMessage())
}

func wantCode(t *testing.T, err error, code codes.Code, contains ...string) {
	t.Helper()
	if errs.Code(err) != code {
		t.Fatalf("got %v, want %v", err, code)
	}
	for _, c := range contains {
		if !strings.Contains(status.Convert(err).Message(), c) {
			t.Errorf("message %q does not mention %q", status.Convert(err).Message(), c)
		}
	}
}

// sandboxProcesses lists live processes, anywhere on the machine, whose
// command line contains marker. It looks past the sandbox's cgroups on
// purpose (a process that escaped its cgroup still counts) and matches a
// marker rather than a cgroup name because other test binaries run
// sandboxes at the same time.
func sandboxProcesses(t *testing.T, marker string) []string {
	t.Helper()
	if marker == "" {
		t.Fatal("sandboxProcesses needs a marker unique to the test")
	}
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		st, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
		if i := strings.LastIndexByte(string(st), ')'); i > 0 && strings.HasPrefix(strings.TrimSpace(string(st[i+1:])), "Z") {
			continue
		}
		if line := strings.ReplaceAll(string(cmd), "\x00", " "); strings.Contains(line, marker) {
			out = append(out, e.Name()+": "+line)
		}
	}
	return out
}

// fakeResolver answers from a map, like a DNS server an attacker controls.
type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var _ io.Writer = (*syncBuffer)(nil)

// freePort returns a TCP port that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

func textContent(s string) *typesv1.Content { return content.Text(s) }

// shortTemp is a temp dir with a short path, for Unix sockets (108 bytes).
func shortTemp(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "env")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
