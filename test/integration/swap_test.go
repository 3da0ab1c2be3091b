package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	conformance "github.com/secbear/neuron/pkg/conformance/state"
	"github.com/secbear/neuron/pkg/testenv"
)

// python is the interpreter with Debian's python3-grpcio and
// python3-grpc-tools (the python3 first on PATH may lack them).
const python = "/usr/bin/python3"

// stateService is the StateService's name in grpc.health.v1.
const stateService = "layer0.state.v1.StateService"

// TestSwapStateImplementations runs the services as processes: the State
// service over bbolt, the operator and the orchestrator. A workflow
// writes memory; then the State service is stopped and another
// implementation takes its address while the operator and orchestrator
// keep running: the memory backend of the same binary, then (when
// Python's grpcio is installed) the Python StateService of
// testdata/pystate. After each swap the new server holds none of the old
// data, the workflow passes again through the orchestrator's
// reconnected client, and the state conformance suite runs against it
// (asserted for the memory backend, reported for Python's).
func TestSwapStateImplementations(t *testing.T) {
	bins := binaries(t)
	dir := t.TempDir()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir}

	bolt := startProc(t, "state (bolt)", []string{bins["state"], "--dev", "--addr", "127.0.0.1:0",
		"--backend", "bolt", "--data-dir", filepath.Join(dir, "state")}, env)
	stateAddr := bolt.addr
	op := startProc(t, "operator", []string{bins["operator"], "--dev", "--addr", "127.0.0.1:0",
		"--tools", "read,write,edit", "--workspace", filepath.Join(dir, "workspace"), "--state-addr", stateAddr}, env)
	agents := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(agents, registry(op.addr), 0o644); err != nil {
		t.Fatal(err)
	}
	orch := startProc(t, "orchestrator", []string{bins["orchestrator"], "--dev", "--addr", "127.0.0.1:0",
		"--agents", agents, "--state-addr", stateAddr, "--data-dir", filepath.Join(dir, "orchestrator")}, env)
	orchClient := orchestratorv1.NewOrchestratorServiceClient(dial(t, orch.addr))

	boltRun := newMemoryWorkflow(t, "bolt")
	boltRun.run(t, orchClient, statev1.NewStateServiceClient(dial(t, stateAddr)))
	t.Logf("workflow %s wrote %q through the orchestrator at %s into the bolt State service at %s", boltRun.id, boltRun.key, orch.addr, stateAddr)

	// swap stops current and starts the next implementation on its
	// address, then checks the operator and orchestrator kept running and
	// the new server is empty of prev's key; it returns a fresh
	// connection to the new server, once it reports SERVING.
	swap := func(t *testing.T, current *proc, name string, argv, env []string, prev memoryWorkflow) (*proc, *grpc.ClientConn) {
		t.Helper()
		current.stopClean(t)
		next := startProc(t, name, argv, env)
		if next.addr != stateAddr {
			t.Fatalf("%s serves at %s, want the old address %s", name, next.addr, stateAddr)
		}
		for _, p := range []*proc{op, orch} {
			if s := p.state(); s != "running" {
				t.Fatalf("%s stopped while the State service was swapped: %s", p.name, s)
			}
		}
		conn := dial(t, stateAddr)
		waitHealthy(t, conn, stateService)
		prev.wantMissing(t, statev1.NewStateServiceClient(conn))
		return next, conn
	}

	mem, memConn := swap(t, bolt, "state (memory)", []string{bins["state"], "--dev", "--addr", stateAddr, "--backend", "memory"}, env, boltRun)
	memRun := newMemoryWorkflow(t, "memory")
	memRun.run(t, orchClient, statev1.NewStateServiceClient(memConn))
	t.Logf("after the swap to the memory backend, workflow %s wrote %q through the same orchestrator", memRun.id, memRun.key)
	t.Run("MemoryConformance", func(t *testing.T) {
		conformance.Run(t, conformance.Target{Conn: memConn})
	})

	t.Run("Python", func(t *testing.T) {
		root := repoRoot(t)
		stubs := pythonStubs(t, root) // skips without grpcio
		server := filepath.Join(root, "test", "integration", "testdata", "pystate", "state_server.py")
		pyEnv := append(slices.Clone(env), "PYTHONPATH="+stubs, "PYTHONDONTWRITEBYTECODE=1")
		_, pyConn := swap(t, mem, "state (python)", []string{python, server, "--addr", stateAddr}, pyEnv, memRun)
		pyRun := newMemoryWorkflow(t, "python")
		pyRun.run(t, orchClient, statev1.NewStateServiceClient(pyConn))
		t.Logf("after the swap to the Python StateService, workflow %s wrote %q through the same orchestrator", pyRun.id, pyRun.key)
		reportConformance(t, stateAddr)
	})
}

// pythonStubs generates the Python modules of layer0/state/v1/state.proto
// (and its imports) with grpc_tools.protoc into a temporary directory and
// returns it, for PYTHONPATH. It skips the test when python cannot import
// grpc and grpc_tools.
//
// Debian's grpc_tools carries protoc 3.5.1, which predates proto3
// "optional". The generator is therefore given a copy of state.proto in
// which each `optional T name = N;` is written as what protoc makes of
// it, a oneof of one field named "_name": the same wire format and the
// same presence (HasField) in Python. The copy shadows the original by
// coming first on the include path.
func pythonStubs(t *testing.T, root string) string {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import grpc, grpc_tools.protoc").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import grpc and grpc_tools (%v: %s); apt-get install -y python3-grpcio python3-grpc-tools", python, err, bytes.TrimSpace(out))
	}
	dir := t.TempDir()
	shadow := filepath.Join(dir, "proto")
	out := filepath.Join(dir, "py")
	src, err := os.ReadFile(filepath.Join(root, "proto", "layer0", "state", "v1", "state.proto"))
	if err != nil {
		t.Fatal(err)
	}
	rewritten := proto3Optional.ReplaceAll(src, []byte("${1}oneof _${3} { ${2} ${3} = ${4}; }"))
	for _, d := range []string{filepath.Join(shadow, "layer0", "state", "v1"), out} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(shadow, "layer0", "state", "v1", "state.proto"), rewritten, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "-m", "grpc_tools.protoc",
		"-I", shadow, "-I", filepath.Join(root, "proto"), "-I", filepath.Join(root, "third_party", "protovalidate"),
		"--python_out="+out, "--grpc_python_out="+out,
		"layer0/state/v1/state.proto", "layer0/types/v1/scope.proto", "buf/validate/validate.proto")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, b)
	}
	return out
}

// proto3Optional matches a proto3 optional field without options.
var proto3Optional = regexp.MustCompile(`(?m)^(\s*)optional\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;`)

// conformanceAddrEnv passes the server to TestStateConformanceChild.
const conformanceAddrEnv = "NEURON_IT_STATE_CONFORMANCE_ADDR"

// TestStateConformanceChild runs the state conformance suite against the
// server named by $NEURON_IT_STATE_CONFORMANCE_ADDR. It is the child
// process of reportConformance (this test binary run again), so an
// implementation's failures are counted without failing the parent.
func TestStateConformanceChild(t *testing.T) {
	addr := os.Getenv(conformanceAddrEnv)
	if addr == "" {
		t.Skip("runs only as the child process of TestSwapStateImplementations/Python (set " + conformanceAddrEnv + " to run it against a server)")
	}
	conformance.Run(t, conformance.Target{Conn: dial(t, addr)})
}

// reportConformance runs the conformance suite against addr in a child
// process and logs how far the server gets: checks passed, failed and
// skipped, by group, and each failure's first message. Nothing is
// asserted.
func reportConformance(t *testing.T, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStateConformanceChild$", "-test.v", "-test.count=1", "-test.timeout=4m")
	cmd.Env = append(os.Environ(), conformanceAddrEnv+"="+addr)
	out, err := cmd.CombinedOutput()
	r := parseTestOutput(out)
	if len(r.results) == 0 {
		t.Logf("conformance suite against %s produced no results (%v):\n%s", addr, err, tailLines(out, 30))
		return
	}
	t.Logf("conformance suite against %s (reported, not asserted): %s", addr, r.summary())
}

// testRun is what a `go test -v` run printed: each test's result and
// first error message.
type testRun struct {
	results map[string]string // name -> PASS, FAIL or SKIP
	order   []string
	message map[string]string
}

var (
	resultLine  = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+)`)
	runLine     = regexp.MustCompile(`^=== (?:RUN|CONT|NAME)\s+(\S+)`)
	messageLine = regexp.MustCompile(`^\s+\w+\.go:\d+: (.*)$`)
)

func parseTestOutput(out []byte) testRun {
	r := testRun{results: map[string]string{}, message: map[string]string{}}
	current := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := runLine.FindStringSubmatch(line); m != nil {
			current = m[1]
			continue
		}
		if m := resultLine.FindStringSubmatch(line); m != nil {
			if _, seen := r.results[m[2]]; !seen {
				r.order = append(r.order, m[2])
			}
			r.results[m[2]] = m[1]
			continue
		}
		if m := messageLine.FindStringSubmatch(line); m != nil && current != "" {
			if _, ok := r.message[current]; !ok {
				r.message[current] = m[1]
			}
		}
	}
	return r
}

// summary counts the leaf checks (tests without subtests) by group, the
// second element of their names, and lists the failures.
func (r testRun) summary() string {
	type count struct{ pass, fail, skip int }
	groups := map[string]*count{}
	var groupOrder, failures []string
	total := count{}
	for _, name := range r.order {
		leaf := true
		for _, other := range r.order {
			if strings.HasPrefix(other, name+"/") {
				leaf = false
				break
			}
		}
		parts := strings.Split(name, "/")
		if !leaf || len(parts) < 2 {
			continue
		}
		g := parts[1]
		if groups[g] == nil {
			groups[g] = &count{}
			groupOrder = append(groupOrder, g)
		}
		switch r.results[name] {
		case "PASS":
			groups[g].pass++
			total.pass++
		case "FAIL":
			groups[g].fail++
			total.fail++
			failures = append(failures, fmt.Sprintf("  FAIL %s: %s", strings.Join(parts[1:], "/"), r.message[name]))
		case "SKIP":
			groups[g].skip++
			total.skip++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d checks passed, %d failed, %d skipped\n", total.pass, total.fail, total.skip)
	for _, g := range groupOrder {
		c := groups[g]
		fmt.Fprintf(&b, "  %-16s %d/%d passed", g, c.pass, c.pass+c.fail)
		if c.skip > 0 {
			fmt.Fprintf(&b, " (%d skipped)", c.skip)
		}
		b.WriteByte('\n')
	}
	const maxListed = 40
	for i, f := range failures {
		if i == maxListed {
			fmt.Fprintf(&b, "  … and %d more failures\n", len(failures)-maxListed)
			break
		}
		b.WriteString(f + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

func tailLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestScaleBackends runs the same memory-writing workflow through the
// real binaries with both engines users grow into swapped in: the State
// service on PostgreSQL (two replicas on one database, the workflow's
// memory read back from the replica the orchestrator did not write to)
// and the orchestrator on Temporal. It skips where PostgreSQL or the
// Temporal CLI is missing (make test-deps installs both).
func TestScaleBackends(t *testing.T) {
	dsn := testenv.Postgres(t)
	dev := testenv.Temporal(t)
	bins := binaries(t)
	dir := t.TempDir()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir}
	dsnFile := filepath.Join(dir, "state.dsn")
	if err := os.WriteFile(dsnFile, []byte(dsn), 0o600); err != nil {
		t.Fatal(err)
	}
	stateArgs := func() []string {
		return []string{bins["state"], "--dev", "--addr", "127.0.0.1:0", "--backend", "postgres", "--postgres-dsn-file", dsnFile}
	}
	first := startProc(t, "state (postgres 1)", stateArgs(), env)
	second := startProc(t, "state (postgres 2)", stateArgs(), env)
	op := startProc(t, "operator", []string{bins["operator"], "--dev", "--addr", "127.0.0.1:0",
		"--tools", "read,write,edit", "--workspace", filepath.Join(dir, "workspace"), "--state-addr", first.addr}, env)
	agents := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(agents, registry(op.addr), 0o644); err != nil {
		t.Fatal(err)
	}
	orch := startProc(t, "orchestrator (temporal)", []string{bins["orchestrator"], "--dev", "--addr", "127.0.0.1:0",
		"--agents", agents, "--state-addr", first.addr, "--backend", "temporal", "--temporal-address", dev.Address,
		"--temporal-namespace", dev.Namespace, "--temporal-task-queue", "neuron-scale-test"}, env)
	run := newMemoryWorkflow(t, "scale")
	run.run(t, orchestratorv1.NewOrchestratorServiceClient(dial(t, orch.addr)), statev1.NewStateServiceClient(dial(t, second.addr)))
	t.Logf("workflow %s ran on Temporal (%s) and wrote %q into PostgreSQL through %s; read back through %s", run.id, dev.Address, run.key, first.addr, second.addr)
	t.Run("StateConformance", func(t *testing.T) {
		conformance.Run(t, conformance.Target{Conn: dial(t, second.addr)})
	})
}
