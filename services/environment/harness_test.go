package environment_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/process"
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
	secrets      environment.MapSecrets
	egress       environment.EgressOptions
	defaults     *environment.Defaults
	extra        []environment.Backend
	container    string
	state        statev1.StateServiceClient
	// readOnly are extra paths the sandbox may read (process.Config.ReadOnly).
	readOnly []string
	// maxConcurrent is Config.MaxConcurrent (0: the default).
	maxConcurrent int
}

// startEnv serves an environment service with the process backend on a
// real TCP port and returns a client.
func startEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	work := t.TempDir()
	args := o.operatorArgs
	if args == nil {
		args = []string{"--tools", "read,write,edit,bash", "--tool-timeout", "20s"}
	}
	pb, err := process.New(process.Config{OperatorBinary: operatorBinary(t), OperatorArgs: args, WorkDir: work, ReadOnly: o.readOnly, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	d := environment.DefaultDefaults()
	d.Timeout = 60 * time.Second
	d.Limits.MemoryBytes = 1 << 30
	if o.defaults != nil {
		d = *o.defaults
	}
	cfg := environment.Config{
		Backends:  append([]environment.Backend{pb}, o.extra...),
		Default:   "process",
		Process:   "process",
		Container: o.container,
		Secrets:   o.secrets,
		Defaults:  d,
		Egress:    environment.NewEgressFactory(o.egress),
		State:     o.state,
		Log:       log,
	}
	cfg.MaxConcurrent = o.maxConcurrent
	if cfg.Secrets == nil {
		cfg.Secrets = environment.MapSecrets{}
	}
	es, err := environment.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := grpcserver.New(grpcserver.Config{Name: "environment", Addr: "127.0.0.1:0", Dev: true}, log)
	if err != nil {
		t.Fatal(err)
	}
	environmentv1.RegisterEnvironmentServiceServer(srv, es)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, lis) }()
	conn, err := grpcclient.Dial(grpcclient.Config{Target: lis.Addr().String(), Dev: true, Plaintext: true, MaxRetries: -1, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); cancel(); <-done })
	return &env{client: environmentv1.NewEnvironmentServiceClient(conn), logs: logs, workDir: work}
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

// sandboxProcesses lists live processes in a sandbox cgroup of any
// invocation, or whose command line contains marker.
func sandboxProcesses(t *testing.T, marker string) []string {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cg, _ := os.ReadFile("/proc/" + e.Name() + "/cgroup")
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		st, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
		if i := strings.LastIndexByte(string(st), ')'); i > 0 && strings.HasPrefix(strings.TrimSpace(string(st[i+1:])), "Z") {
			continue
		}
		if strings.Contains(string(cg), "neuron-sandbox-") || (marker != "" && strings.Contains(string(cmd), marker)) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
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
