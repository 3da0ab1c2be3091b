package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/scope"
)

// The commands under test, as import paths for testenv.BuildStatic.
const (
	statePkg        = "github.com/secbear/neuron/services/state/cmd/state"
	operatorPkg     = "github.com/secbear/neuron/services/operator/cmd/operator"
	orchestratorPkg = "github.com/secbear/neuron/services/orchestrator/cmd/orchestrator"
	environmentPkg  = "github.com/secbear/neuron/services/environment/cmd/environment"
)

// Bounds. None is a timing assertion: each only stops a stuck test.
const (
	startTimeout    = 90 * time.Second // a process or container until it logs SERVING
	stopTimeout     = 20 * time.Second // SIGTERM until exit, before SIGKILL
	workflowTimeout = 2 * time.Minute  // one workflow, State service reconnects included
	rpcTimeout      = 15 * time.Second // one check call
	healthTimeout   = 30 * time.Second // a fresh connection until the service reports SERVING
	healthPoll      = 50 * time.Millisecond
)

// agentID is the one agent of the registry the tests write: its script
// comes with each dispatch, in the input's metadata.
const agentID = "memo"

// registry returns the orchestrator's agent registry (YAML) with agentID
// on the operator service at operatorAddr.
func registry(operatorAddr string) []byte {
	return fmt.Appendf(nil, `# The integration tests' registry: one agent, scripted per dispatch.
defaults:
  operator: %q
  retry: {max_attempts: 3, initial_backoff: 100ms, max_backoff: 1s}
agents:
  - id: %s
    max_turns: 4
`, operatorAddr, agentID)
}

// memoryWorkflow is one Dispatch of agentID whose scripted model calls
// write_memory (workflow scope) in its first turn and answers in its
// second: one WriteMemory effect the orchestrator applies through the
// State service.
type memoryWorkflow struct {
	id    string
	key   string
	value *structpb.Value
	reply string
}

func newMemoryWorkflow(t *testing.T, label string) memoryWorkflow {
	t.Helper()
	value, err := structpb.NewValue(map[string]any{
		"label": label,
		"items": []any{"alpha", 2.5, true},
		"note":  "written by the " + label + " run",
	})
	if err != nil {
		t.Fatal(err)
	}
	return memoryWorkflow{
		id:    "it-" + label + "-" + randomHex(t, 4),
		key:   "notes/" + label,
		value: value,
		reply: "Stored the " + label + " notes.",
	}
}

// request is the DispatchRequest of w: the script rides in the input's
// metadata under "scripted" (services/operator/provider/scripted).
func (w memoryWorkflow) request(t *testing.T) *orchestratorv1.DispatchRequest {
	t.Helper()
	script, err := structpb.NewStruct(map[string]any{
		"turns": []any{
			map[string]any{
				"text": "Saving the notes.",
				"tool_calls": []any{map[string]any{
					"name": "write_memory",
					"arguments": map[string]any{
						"key":   w.key,
						"value": w.value.AsInterface(),
						"scope": "workflow",
					},
				}},
			},
			map[string]any{"text": w.reply},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &orchestratorv1.DispatchRequest{
		AgentId:    agentID,
		WorkflowId: w.id,
		Input: &operatorv1.OperatorInput{
			Message:  content.Text("Please keep these notes."),
			Trigger:  operatorv1.TriggerType_TRIGGER_TYPE_USER,
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"scripted": structpb.NewStructValue(script)}},
		},
	}
}

var writtenDetail = regexp.MustCompile(`^written \(revision ([0-9]+)\)$`)

// run dispatches w through orch and checks the result: the scripted
// reply, one WriteMemory effect applied, and the value in the State
// service behind st at the revision the orchestrator reported. A
// Dispatch answered UNAVAILABLE is repeated with the same workflow id
// (Dispatch is idempotent by workflow id) until workflowTimeout; the
// orchestrator itself retries the State write while the State service is
// away.
func (w memoryWorkflow) run(t *testing.T, orch orchestratorv1.OrchestratorServiceClient, st statev1.StateServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), workflowTimeout)
	defer cancel()
	req := w.request(t)
	var (
		resp *orchestratorv1.DispatchResponse
		err  error
	)
	for attempt := 1; ; attempt++ {
		resp, err = orch.Dispatch(ctx, req)
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			break
		}
		t.Logf("Dispatch %s, attempt %d: %v; retrying", w.id, attempt, err)
		if !sleep(ctx, 200*time.Millisecond) {
			break
		}
	}
	if err != nil {
		t.Fatalf("Dispatch %s: %v", w.id, err)
	}

	if resp.GetWorkflowId() != w.id {
		t.Errorf("Dispatch: workflow id %q, want %q", resp.GetWorkflowId(), w.id)
	}
	out := resp.GetOutput()
	if got := content.TextOf(out.GetMessage()); got != w.reply {
		t.Errorf("Dispatch %s: reply %q, want the script's %q", w.id, got, w.reply)
	}
	if kind := out.GetExitReason().GetKind(); kind != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		t.Errorf("Dispatch %s: exit %v (%s), want EXIT_KIND_COMPLETE", w.id, kind, out.GetExitReason())
	}
	if n := len(resp.GetEffects()); n != 1 {
		t.Fatalf("Dispatch %s: %d effect outcomes %v, want 1 (the write_memory call)", w.id, n, resp.GetEffects())
	}
	eff := resp.GetEffects()[0]
	m := writtenDetail.FindStringSubmatch(eff.GetDetail())
	if !eff.GetApplied() || m == nil {
		t.Fatalf("Dispatch %s: effect %q applied=%v detail %q, want applied with \"written (revision N)\"", w.id, eff.GetIdempotencyKey(), eff.GetApplied(), eff.GetDetail())
	}
	rev, _ := strconv.ParseUint(m[1], 10, 64)

	rctx, rcancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer rcancel()
	got, err := st.Read(rctx, &statev1.ReadRequest{Scope: scope.Workflow(w.id), Key: w.key})
	if err != nil {
		t.Fatalf("State Read of %s key %q after the workflow: %v", scope.String(scope.Workflow(w.id)), w.key, err)
	}
	if !proto.Equal(got.GetValue(), w.value) {
		t.Errorf("State holds %v under %q, want %v", got.GetValue(), w.key, w.value)
	}
	if got.GetRevision() != rev {
		t.Errorf("State holds %q at revision %d; the orchestrator reported revision %d", w.key, got.GetRevision(), rev)
	}
}

// wantMissing fails t unless the State service behind st has no w.key in
// w's workflow scope.
func (w memoryWorkflow) wantMissing(t *testing.T, st statev1.StateServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	_, err := st.Read(ctx, &statev1.ReadRequest{Scope: scope.Workflow(w.id), Key: w.key})
	if status.Code(err) != codes.NotFound {
		t.Errorf("Read of %q from workflow %s on the new State service: %v, want NotFound (a fresh store)", w.key, w.id, err)
	}
}

// dial connects to a dev-mode (plaintext) service and closes the
// connection when the test ends.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// waitHealthy waits until service (empty: the server as a whole) reports
// SERVING over conn.
func waitHealthy(t *testing.T, conn *grpc.ClientConn, service string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), healthTimeout)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		res, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: service})
		ccancel()
		if err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if !sleep(ctx, healthPoll) {
			t.Fatalf("%s at %s did not report SERVING within %v: status %v, error %v", orAll(service), conn.Target(), healthTimeout, res.GetStatus(), err)
		}
	}
}

func orAll(service string) string {
	if service == "" {
		return "the server"
	}
	return service
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// repoRoot is the module's root directory: the tests run in
// test/integration.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	return root
}

// servingAddr reports whether line is a service's JSON log line
// {"msg":"SERVING", ...} and returns its "addr" (the listener's address).
func servingAddr(line []byte) (string, bool) {
	if !bytes.Contains(line, []byte(`"SERVING"`)) {
		return "", false
	}
	var rec struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
	}
	if err := json.Unmarshal(line, &rec); err != nil || rec.Msg != "SERVING" {
		return "", false
	}
	return rec.Addr, true
}

// logBuffer keeps a process's output for failure messages.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// tail returns the last n lines.
func (b *logBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	lines := bytes.Split(bytes.TrimRight(b.buf.Bytes(), "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// proc is a service running as a child process of the test.
type proc struct {
	name   string
	cmd    *exec.Cmd
	addr   string // from its SERVING line
	log    logBuffer
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

// startProc runs argv with env (and nothing else of the test's
// environment, so no model credentials leak in) and waits for its
// SERVING line. The test fails when the process exits first or does not
// serve within startTimeout. When the test ends a running process gets
// SIGTERM, then SIGKILL after stopTimeout; its output is logged when the
// test failed.
func startProc(t *testing.T, name string, argv, env []string) *proc {
	t.Helper()
	p := &proc{name: name, exited: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = env
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		r.Close()
		w.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	w.Close()
	serving := make(chan string, 1)
	var readDone sync.WaitGroup
	readDone.Go(func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			p.log.Write(append(append([]byte(nil), line...), '\n'))
			if addr, ok := servingAddr(line); ok {
				select {
				case serving <- addr:
				default:
				}
			}
		}
		_, _ = io.Copy(&p.log, r) // a line beyond the scanner's limit
	})
	go func() {
		p.err = p.cmd.Wait()
		readDone.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("output of %s (%s):\n%s", name, p.state(), p.log.tail(60))
		}
	})

	select {
	case p.addr = <-serving:
	case <-p.exited:
		t.Fatalf("%s exited before serving (%v):\n%s", name, p.err, p.log.tail(30))
	case <-time.After(startTimeout):
		t.Fatalf("%s did not log SERVING within %v:\n%s", name, startTimeout, p.log.tail(30))
	}
	if p.addr == "" {
		t.Fatalf("%s logged SERVING without an addr:\n%s", name, p.log.tail(5))
	}
	return p
}

// stop sends SIGTERM, waits for the exit (SIGKILL after stopTimeout) and
// returns cmd.Wait's error: nil for a clean exit.
func (p *proc) stop() error {
	select {
	case <-p.exited:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not exit within %v of SIGTERM; killed (%v)", p.name, stopTimeout, p.err)
	}
	return p.err
}

func (p *proc) state() string {
	select {
	case <-p.exited:
		if p.err == nil {
			return "exited 0"
		}
		return p.err.Error()
	default:
		return "running"
	}
}

// stopClean stops p and fails t unless it exited 0.
func (p *proc) stopClean(t *testing.T) {
	t.Helper()
	if err := p.stop(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s on SIGTERM: %v, want exit status 0:\n%s", p.name, err, p.log.tail(20))
		}
		t.Fatal(err)
	}
}

// binaries builds the three services' static binaries (once per test
// binary; testenv.BuildStatic) and returns them by name.
func binaries(t *testing.T) map[string]string {
	t.Helper()
	return map[string]string{
		"state":        testenv.BuildStatic(t, statePkg),
		"operator":     testenv.BuildStatic(t, operatorPkg),
		"orchestrator": testenv.BuildStatic(t, orchestratorPkg),
		"environment":  testenv.BuildStatic(t, environmentPkg),
	}
}
