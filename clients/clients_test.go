//go:build unix

package clients_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/grpcclient"
)

// The tests run the Python and Node example clients, and the grpcurl
// walkthrough, as subprocesses against the real service binaries, each
// started in dev mode on a port the kernel picks. They assert what the
// clients print (JSON lines) and check the results through the Go stubs.
//
// Safety bounds, never assertions about speed: a service that is not
// SERVING within startTimeout, or a client still running after
// clientTimeout, fails the test with its log.
const (
	startTimeout  = 2 * time.Minute
	clientTimeout = 3 * time.Minute
	stopTimeout   = 15 * time.Second
	echoPrefix    = "[scripted model] You said: "
)

// binary returns the path of a service binary (one of state, operator,
// orchestrator, environment): built once before the tests by make test,
// else here (internal/testenv.BuildStatic), before any clock starts.
func binary(t *testing.T, name string) string {
	t.Helper()
	return testenv.BuildStatic(t, "github.com/secbear/neuron/services/"+name+"/cmd/"+name)
}

// repoRoot is the repository's root: tests run in clients/.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// cacheDir is where scripts/client-deps.sh installs the Node modules and
// grpcurl.
func cacheDir() string {
	if d := os.Getenv("NEURON_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache", "neuron")
}

// serviceEnv is this process's environment without what would change how
// the services behave: their flags' NEURON_* fallbacks and model provider
// credentials (the operator must run the scripted model).
func serviceEnv() []string {
	drop := []string{"NEURON_", "ANTHROPIC_", "OPENAI_", "GEMINI_", "GOOGLE_API_KEY", "GOOGLE_GEMINI_"}
	var env []string
	for _, kv := range os.Environ() {
		if !slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			env = append(env, kv)
		}
	}
	return env
}

// logTail keeps the last lines a process logged, for failure messages.
type logTail struct {
	mu    sync.Mutex
	lines []string
}

func (l *logTail) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == 40 {
		l.lines = slices.Delete(l.lines, 0, 1)
	}
	l.lines = append(l.lines, s)
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// startService runs a service binary in dev mode on 127.0.0.1:0, waits
// for its SERVING log line and returns the address it names. The process
// gets SIGTERM in t.Cleanup (SIGKILL if it has not exited stopTimeout
// later); exiting before that fails the test.
func startService(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(binary(t, name), append([]string{"--dev", "--addr", "127.0.0.1:0", "--log-format", "json"}, args...)...)
	cmd.Env = serviceEnv()
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	var (
		tail    logTail
		waitErr error
		done    = make(chan struct{})
		addrCh  = make(chan string, 1)
		stopped = false
	)
	go func() {
		waitErr = cmd.Wait()
		pw.Close()
		close(done)
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			tail.add(sc.Text())
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "SERVING" && line.Addr != "" {
				select {
				case addrCh <- line.Addr:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, pr) // a line too long for the scanner: keep the process unblocked
	}()
	t.Cleanup(func() {
		select {
		case <-done:
			if !stopped {
				t.Errorf("%s exited before the test ended: %v\n%s", name, waitErr, tail.String())
			}
			return
		default:
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(stopTimeout):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%s ignored SIGTERM for %v; killed\n%s", name, stopTimeout, tail.String())
		}
	})
	select {
	case addr := <-addrCh:
		return addr
	case <-done:
		stopped = true
		t.Fatalf("%s exited before SERVING: %v\n%s", name, waitErr, tail.String())
	case <-time.After(startTimeout):
		t.Fatalf("%s not SERVING after %v\n%s", name, startTimeout, tail.String())
	}
	return ""
}

// system is the addresses of a running set of services.
type system struct {
	state, operator, orchestrator, environment string
}

// environmentMode says how startSystem starts the environment service.
type environmentMode int

const (
	noEnvironment environmentMode = iota
	// sandboxedEnvironment: the process backend running the operator
	// binary, with a secrets directory holding ci-token, as in the README.
	sandboxedEnvironment
	// localEnvironment: --backend local, forwarding to the operator
	// service (no isolation: specs asking for any are refused).
	localEnvironment
)

// ciToken is the credential the walkthrough's restrictive spec injects.
const ciToken = "tok-demo-1234567890"

// startSystem starts the State service, an operator on the scripted model
// with no built-in tools that reads session history from it, and an
// orchestrator whose registry names that operator for agent "assistant";
// then, as mode says, an environment service.
func startSystem(t *testing.T, mode environmentMode) system {
	t.Helper()
	dir := t.TempDir()
	var s system
	s.state = startService(t, "state", "--data-dir", filepath.Join(dir, "state"))
	s.operator = startService(t, "operator", "--model", "scripted", "--tools", "",
		"--workspace", filepath.Join(dir, "workspace"), "--state-addr", s.state)
	registry := filepath.Join(dir, "agents.yaml")
	yaml := fmt.Sprintf("defaults:\n  operator: %q\nagents:\n  - id: assistant\n    max_turns: 4\n", s.operator)
	if err := os.WriteFile(registry, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	s.orchestrator = startService(t, "orchestrator", "--agents", registry, "--state-addr", s.state,
		"--data-dir", filepath.Join(dir, "orchestrator"))
	switch mode {
	case sandboxedEnvironment:
		secrets := filepath.Join(dir, "secrets")
		if err := os.MkdirAll(secrets, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(secrets, "ci-token"), []byte(ciToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s.environment = startService(t, "environment", "--data-dir", filepath.Join(dir, "environment"),
			"--operator-binary", binary(t, "operator"), "--secrets-dir", secrets,
			"--operator-args", "--tools read,write,edit,bash")
	case localEnvironment:
		s.environment = startService(t, "environment", "--data-dir", filepath.Join(dir, "environment"),
			"--backend", "local", "--operator-addr", s.operator)
	}
	return s
}

// runClient runs a client to completion and returns its stdout; a
// non-zero exit fails the test with its stderr.
func runClient(t *testing.T, env []string, name string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.Dir = repoRoot(t)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes()
}

// TestClients runs the Python and the Node client against one set of
// services. Each writes a value and reads it back, dispatches agent
// "assistant" and replays the workflow's lifecycle events.
func TestClients(t *testing.T) {
	root := repoRoot(t)
	stubs, pyReason := testenv.PythonStubs(t, root)
	nodeReason := nodeMissing()
	if pyReason != "" && nodeReason != "" {
		t.Skipf("%s; %s", pyReason, nodeReason)
	}
	sys := startSystem(t, noEnvironment)

	t.Run("python", func(t *testing.T) {
		if pyReason != "" {
			t.Skip(pyReason)
		}
		env := append(os.Environ(), "PYTHONPATH="+stubs, "PYTHONDONTWRITEBYTECODE=1")
		text := "hello from python"
		out := runClient(t, env, testenv.Python, filepath.Join(root, "clients", "python", "neuron_client.py"),
			"--state", sys.state, "--orchestrator", sys.orchestrator,
			"--session", "clients-test-python", "--key", "clients/python", "--text", text, "--timeout", "60")
		checkClientOutput(t, sys, out, "python", "clients-test-python", "clients/python", text)
	})

	t.Run("node", func(t *testing.T) {
		if nodeReason != "" {
			t.Skip(nodeReason)
		}
		node, _ := exec.LookPath("node")
		env := append(os.Environ(), "NODE_PATH="+filepath.Join(cacheDir(), "node", "node_modules"))
		text := "hello from node"
		out := runClient(t, env, node, filepath.Join(root, "clients", "node", "neuron_client.js"),
			"--state", sys.state, "--orchestrator", sys.orchestrator,
			"--session", "clients-test-node", "--key", "clients/node", "--text", text, "--timeout", "60")
		checkClientOutput(t, sys, out, "node", "clients-test-node", "clients/node", text)
	})
}

// nodeMissing says why the Node client cannot run here, or "".
func nodeMissing() string {
	if _, err := exec.LookPath("node"); err != nil {
		return "node is not on PATH"
	}
	modules := filepath.Join(cacheDir(), "node", "node_modules")
	for _, m := range []string{"@grpc/grpc-js", "@grpc/proto-loader"} {
		if _, err := os.Stat(filepath.Join(modules, m, "package.json")); err != nil {
			return fmt.Sprintf("%s is not installed in %s: run scripts/client-deps.sh", m, modules)
		}
	}
	return ""
}

// clientLine is one JSON line a client prints.
type clientLine struct {
	Step           string `json:"step"`
	Session        string `json:"session"`
	Key            string `json:"key"`
	Value          any    `json:"value"`
	Revision       string `json:"revision"`
	WorkflowID     string `json:"workflow_id"`
	Text           string `json:"text"`
	Exit           string `json:"exit"`
	Provider       string `json:"provider"`
	EffectsApplied int    `json:"effects_applied"`
	Sequence       string `json:"sequence"`
	Kind           string `json:"kind"`
	Type           string `json:"type"`
	Count          int    `json:"count"`
}

// checkClientOutput asserts what a client printed, and checks the value
// and the workflow through the Go stubs.
func checkClientOutput(t *testing.T, sys system, out []byte, lang, session, key, text string) {
	t.Helper()
	steps := map[string][]clientLine{}
	for _, raw := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		var l clientLine
		if err := json.Unmarshal(raw, &l); err != nil {
			t.Fatalf("not a JSON line: %q: %v\nstdout:\n%s", raw, err, out)
		}
		steps[l.Step] = append(steps[l.Step], l)
	}
	for _, s := range []string{"write", "read", "dispatch", "events"} {
		if len(steps[s]) != 1 {
			t.Fatalf("%d %q lines, want 1\nstdout:\n%s", len(steps[s]), s, out)
		}
	}
	t.Logf("%s client output:\n%s", lang, out)

	// State: the value read back is the value written, as the Go stubs see it.
	want := map[string]any{"greeting": text, "client": lang, "tags": []any{"example", "state"}}
	w, r := steps["write"][0], steps["read"][0]
	if !reflect.DeepEqual(w.Value, want) {
		t.Errorf("wrote %#v, want %#v", w.Value, want)
	}
	if !reflect.DeepEqual(r.Value, want) || r.Key != key || r.Session != session {
		t.Errorf("read %s/%s = %#v, want %s/%s = %#v", r.Session, r.Key, r.Value, session, key, want)
	}
	if r.Revision == "" || r.Revision == "0" || r.Revision != w.Revision {
		t.Errorf("read revision %q, write revision %q: want the same, non-zero", r.Revision, w.Revision)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := statev1.NewStateServiceClient(dial(t, sys.state)).Read(ctx, &statev1.ReadRequest{
		Scope: &typesv1.Scope{Kind: &typesv1.Scope_Session{Session: &typesv1.SessionScope{SessionId: session}}},
		Key:   key,
	})
	if err != nil {
		t.Errorf("Read %s/%s through Go: %v", session, key, err)
	} else if !reflect.DeepEqual(got.GetValue().AsInterface(), want) || strconv.FormatUint(got.GetRevision(), 10) != w.Revision {
		t.Errorf("through Go: %v at revision %d, want %v at revision %s", got.GetValue().AsInterface(), got.GetRevision(), want, w.Revision)
	}

	// Dispatch: the scripted model's echo; the session's conversation turn
	// is an effect the orchestrator applied.
	d := steps["dispatch"][0]
	if d.Text != echoPrefix+text || d.Provider != "scripted" || d.Exit != "EXIT_KIND_COMPLETE" {
		t.Errorf("dispatch: text %q, provider %q, exit %q; want %q, scripted, EXIT_KIND_COMPLETE", d.Text, d.Provider, d.Exit, echoPrefix+text)
	}
	if d.EffectsApplied < 1 {
		t.Errorf("dispatch applied %d effects, want at least the conversation turn", d.EffectsApplied)
	}
	wf, err := orchestratorv1.NewOrchestratorServiceClient(dial(t, sys.orchestrator)).GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: d.WorkflowID})
	if err != nil {
		t.Errorf("GetWorkflow %q: %v", d.WorkflowID, err)
	} else if st := wf.GetWorkflow().GetStatus(); st != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Errorf("workflow %q is %v, want COMPLETED", d.WorkflowID, st)
	}

	// Lifecycle: the subscription began after Dispatch returned, so its
	// events arrived by replay (after_sequence): the workflow's start
	// first, its completion last, in sequence order, nothing from
	// another workflow.
	evs := steps["event"]
	if len(evs) == 0 {
		t.Fatalf("no lifecycle event for workflow %q\nstdout:\n%s", d.WorkflowID, out)
	}
	if c := steps["events"][0].Count; c != len(evs) {
		t.Errorf("events count %d, but %d event lines", c, len(evs))
	}
	var prev uint64
	for i, e := range evs {
		if e.WorkflowID != d.WorkflowID {
			t.Errorf("event %d is of workflow %q, want %q", i, e.WorkflowID, d.WorkflowID)
		}
		seq, err := strconv.ParseUint(e.Sequence, 10, 64)
		if err != nil || seq <= prev {
			t.Errorf("event %d: sequence %q after %d, want increasing", i, e.Sequence, prev)
		}
		prev = seq
	}
	if first := evs[0]; first.Kind != "observable" || first.Type != "orchestrator.workflow.started" {
		t.Errorf("first event %s %q, want the replayed observable orchestrator.workflow.started", first.Kind, first.Type)
	}
	if last := evs[len(evs)-1]; last.Kind != "observable" || last.Type != "orchestrator.workflow.completed" {
		t.Errorf("last event %s %q, want observable orchestrator.workflow.completed", last.Kind, last.Type)
	}
}

// dial connects to a service in dev mode; the connection closes in
// t.Cleanup.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
