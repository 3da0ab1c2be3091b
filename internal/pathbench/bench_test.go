//go:build linux

package pathbench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/benchkit"
	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/sandbox"
)

var (
	toolCalls  = flag.Int("k", 3, "tool calls per dispatch (K: K+1 model calls each)")
	profileDir = flag.String("perf", "", "record a CPU profile of the services (perf record) during each measurement into this directory; its overhead is in that run's numbers")
)

// concurrencies are the numbers of dispatches (or hand-loop
// conversations) in flight at once.
var concurrencies = []int{1, 16}

// The commands started, built before any clock starts.
const (
	statePkg        = "github.com/secbear/neuron/services/state/cmd/state"
	operatorPkg     = "github.com/secbear/neuron/services/operator/cmd/operator"
	orchestratorPkg = "github.com/secbear/neuron/services/orchestrator/cmd/orchestrator"
	environmentPkg  = "github.com/secbear/neuron/services/environment/cmd/environment"
	handLoopPkg     = "github.com/secbear/neuron/internal/benchkit/handloop"
	floorPkg        = "github.com/secbear/neuron/internal/floor/cmd/floor"
)

const (
	agentID = "bench"
	model   = "mock-1"
	// The tool the mock asks for: the operator's read tool on a small
	// file of its workspace, the cheapest built-in tool without side
	// effects.
	toolName = "read"
	toolArgs = `{"path":"bench.txt"}`
	toolFile = "bench.txt"
	toolText = "The quick brown fox jumps over the lazy dog.\n"
	// In the sandbox (routeEnvProcess): the write tool, and the model's
	// host name, pinned by the egress proxy to the mock.
	sandboxToolArgs  = `{"path":"bench.txt","content":"The quick brown fox jumps over the lazy dog.\n"}`
	sandboxModelHost = "model.bench"
)

// The routes of BenchmarkPath: where the orchestrator sends the agent.
const (
	// routeOperator: the operator service.
	routeOperator = "operator"
	// routeEnvLocal: the environment service's local backend, which
	// forwards to the operator service (no isolation).
	routeEnvLocal = "environment-local"
	// routeEnvProcess: the environment service's process backend, a
	// fresh operator process per dispatch in the sandbox (Landlock,
	// namespaces, cgroup, seccomp), reaching the mock through the
	// invocation's egress proxy and State through its read-only bridge.
	routeEnvProcess = "environment-process"
	// routeFloor: the floor command in each role (state, operator,
	// orchestrator): the same processes, calls, stream messages, durable
	// commits and model calls as routeOperator with nothing else, so
	// what a dispatch costs there is what the design costs on this
	// machine.
	routeFloor = "floor"
)

// BenchmarkPath dispatches an agent through the real binaries: gRPC
// client -> orchestrator (bbolt journal) -> operator (directly, or
// through the environment service) -> the mock model, K tool calls, each
// dispatch in a session of its own, so its history is read from and
// written to State. Only the services' CPU is counted.
func BenchmarkPath(b *testing.B) {
	for _, route := range []string{routeOperator, routeEnvLocal, routeEnvProcess, routeFloor} {
		b.Run("route="+route, func(b *testing.B) {
			w := startWorld(b, route)
			for _, conc := range concurrencies {
				b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) { w.measure(b, conc) })
			}
		})
	}
}

// BenchmarkHandLoop runs the same conversations in the handloop
// command, in a process of its own, against the same mock; only its CPU
// is counted.
func BenchmarkHandLoop(b *testing.B) {
	skipUnlessLinux(b)
	bin := testenv.BuildStatic(b, handLoopPkg)
	mock := benchkit.StartMockModel(b, *toolCalls, toolName, toolArgs)
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, toolFile), []byte(toolText), 0o600); err != nil {
		b.Fatal(err)
	}
	h := startHandLoop(b, bin, mock.URL, dir)
	for _, conc := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			ps := []*measured{{name: "handloop", pid: h.pid}}
			start := snapshot(b, ps)
			stopPerf := startPerf(b, "handloop", conc, ps)
			b.ResetTimer()
			t0 := time.Now()
			calls, err := h.run(b.N, conc)
			elapsed := time.Since(t0)
			b.StopTimer()
			stopPerf()
			if err != nil {
				b.Fatal(err)
			}
			report(b, ps, start, calls, elapsed)
		})
	}
}

func skipUnlessLinux(b *testing.B) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		b.Skip("the whole-path benchmark reads each process's CPU time and peak RSS from /proc, which is not mounted")
	}
}

// measured is one process whose CPU time and peak RSS are reported.
type measured struct {
	name string
	pid  int
	// children: the CPU time of the process's children that have ended
	// (the sandboxed operators of the environment's process backend),
	// not its own; no peak RSS.
	children bool
}

// world is the running system of one route.
type world struct {
	mock   *benchkit.MockModel
	ours   []*measured
	client orchestratorv1.OrchestratorServiceClient
	run    string // distinguishes session ids of this process's runs
	seq    atomic.Int64
}

// startWorld builds the binaries, then starts the mock model and the
// services of route as `neuron up` starts them (dev mode, JSON logs at
// info to files, durable bbolt stores in a temporary directory), and
// waits until each is SERVING.
func startWorld(b *testing.B, route string) *world {
	skipUnlessLinux(b)
	if route == routeFloor {
		return startFloor(b)
	}
	stateBin := testenv.BuildStatic(b, statePkg)
	opBin := testenv.BuildStatic(b, operatorPkg)
	orchBin := testenv.BuildStatic(b, orchestratorPkg)
	var envBin string
	if route != routeOperator {
		envBin = testenv.BuildStatic(b, environmentPkg)
	}
	if route == routeEnvProcess {
		if err := sandbox.Supported(); err != nil {
			b.Skipf("the process backend cannot run here: %v", err)
		}
		if err := sandbox.CgroupSupported(); err != nil {
			b.Skipf("the process backend cannot run here: %v", err)
		}
	}
	w := &world{run: strconv.FormatInt(time.Now().UnixNano(), 36)}
	if route == routeEnvProcess {
		// The sandbox's workspace is a fresh, empty tmpfs, discarded
		// after the call: the agent writes the file instead of reading
		// it, the cheapest tool call that succeeds there.
		w.mock = benchkit.StartMockModel(b, *toolCalls, "write", sandboxToolArgs)
	} else {
		w.mock = benchkit.StartMockModel(b, *toolCalls, toolName, toolArgs)
	}
	dir := b.TempDir()
	ws := filepath.Join(dir, "workspace")
	if err := os.MkdirAll(ws, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, toolFile), []byte(toolText), 0o600); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := map[string]string{}
	for _, name := range []string{"state", "operator", "orchestrator", "environment"} {
		addr[name] = proc.FreeAddr(b)
	}
	common := func(name string) []string {
		return []string{"--dev", "--addr", addr[name], "--log-format", "json", "--shutdown-timeout", "5s"}
	}
	start := func(name, bin, service string, args ...string) {
		p := proc.Start(b, bin, proc.Options{Name: name, LogPath: filepath.Join(dir, name+".log"), EnvPrefix: "NEURON"},
			append(common(name), args...)...)
		p.WaitServing(ctx, b, healthpb.NewHealthClient(dial(b, addr[name])), service, 50*time.Millisecond)
		w.ours = append(w.ours, &measured{name: name, pid: p.Pid()})
	}
	start("state", stateBin, "layer0.state.v1.StateService", "--data-dir", filepath.Join(dir, "state"))
	var target string
	switch route {
	case routeOperator, routeEnvLocal:
		// Only the read tool (no bash, write, edit, effect tools): the
		// model requests carry one tool definition, as the hand loop's do.
		start("operator", opBin, "layer0.operator.v1.OperatorService",
			"--state-addr", addr["state"], "--lifecycle-addr", addr["orchestrator"], "--workspace", ws,
			"--compatible-base-url", w.mock.URL, "--model", model, "--tools", toolName, "--effect-tools=false")
		target = "operator: " + addr["operator"]
		if route == routeEnvLocal {
			start("environment", envBin, "layer0.environment.v1.EnvironmentService",
				"--backend", "local", "--operator-addr", addr["operator"], "--data-dir", filepath.Join(dir, "environment"))
			target = "environment: " + addr["environment"]
		}
	case routeEnvProcess:
		// The operator runs as the backend starts it (one-shot, its
		// workspace, the egress proxy and the state bridge on sockets),
		// with the model at a name the proxy pins to the mock.
		mockHost := strings.TrimSuffix(strings.TrimPrefix(w.mock.URL, "http://"), "/v1")
		start("environment", envBin, "layer0.environment.v1.EnvironmentService",
			"--backend", "process", "--operator-binary", opBin, "--data-dir", filepath.Join(dir, "environment"),
			"--state-addr", addr["state"], "--egress-static-hosts", sandboxModelHost+"="+mockHost,
			"--operator-args", "--compatible-base-url http://"+sandboxModelHost+"/v1 --model "+model+" --tools write --effect-tools=false")
		w.ours = append(w.ours, &measured{name: "sandboxes", pid: w.ours[len(w.ours)-1].pid, children: true})
		// As `neuron up` writes it for the process sandbox, with the
		// model's host allowed.
		target = "environment: " + addr["environment"] + "\n    spec: {timeout: 60s, isolation: [{process: {}}], " +
			`resources: {memory: "512Mi", max_processes: 64}, ` +
			"network: {default_action: NETWORK_ACTION_DENY, rules: [{destination: " + sandboxModelHost + ", action: NETWORK_ACTION_ALLOW}]}}"
	}
	agents := filepath.Join(dir, "agents.yaml")
	reg := fmt.Sprintf("agents:\n  - id: %s\n    %s\n    retry: {max_attempts: 1}\n", agentID, target)
	if err := os.WriteFile(agents, []byte(reg), 0o600); err != nil {
		b.Fatal(err)
	}
	start("orchestrator", orchBin, "layer0.orchestrator.v1.OrchestratorService",
		"--agents", agents, "--state-addr", addr["state"], "--data-dir", filepath.Join(dir, "orchestrator"))
	w.client = orchestratorv1.NewOrchestratorServiceClient(dial(b, addr["orchestrator"]))
	if err := w.dispatch(ctx); err != nil { // warm up every connection
		b.Fatal(err)
	}
	return w
}

// startFloor starts the mock model and the floor command in each of its
// roles, each a process of its own, like startWorld's routeOperator.
func startFloor(b *testing.B) *world {
	bin := testenv.BuildStatic(b, floorPkg)
	w := &world{run: strconv.FormatInt(time.Now().UnixNano(), 36)}
	w.mock = benchkit.StartMockModel(b, *toolCalls, toolName, toolArgs)
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, toolFile), []byte(toolText), 0o600); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := map[string]string{}
	start := func(role string, args ...string) {
		addr[role] = proc.FreeAddr(b)
		p := proc.Start(b, bin, proc.Options{Name: role, LogPath: filepath.Join(dir, role+".log")},
			append([]string{"-role", role, "-addr", addr[role]}, args...)...)
		p.WaitServing(ctx, b, healthpb.NewHealthClient(dial(b, addr[role])), "", 50*time.Millisecond)
		w.ours = append(w.ours, &measured{name: role, pid: p.Pid()})
	}
	start("state", "-data-dir", filepath.Join(dir, "state"))
	start("operator", "-state-addr", addr["state"], "-base-url", w.mock.URL, "-model", model, "-workspace", dir)
	start("orchestrator", "-state-addr", addr["state"], "-operator-addr", addr["operator"], "-data-dir", filepath.Join(dir, "orchestrator"))
	w.client = orchestratorv1.NewOrchestratorServiceClient(dial(b, addr["orchestrator"]))
	if err := w.dispatch(ctx); err != nil {
		b.Fatal(err)
	}
	return w
}

// dispatch runs one workflow: the agent, in a new session, through K
// tool calls to the final answer.
func (w *world) dispatch(ctx context.Context) error {
	session := fmt.Sprintf("bench-%s-%d", w.run, w.seq.Add(1))
	resp, err := w.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: agentID, Input: &operatorv1.OperatorInput{
		Message: content.Text("read bench.txt until the model is done"), SessionId: &session,
		Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER,
	}})
	if err != nil {
		return err
	}
	out := resp.GetOutput()
	if k := out.GetExitReason().GetKind(); k != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		return fmt.Errorf("workflow %s ended with exit %s: %v", resp.GetWorkflowId(), k, out.GetExitReason())
	}
	if turns := out.GetMetadata().GetTurnsUsed(); turns != uint32(*toolCalls+1) {
		return fmt.Errorf("workflow %s: %d turns, want %d", resp.GetWorkflowId(), turns, *toolCalls+1)
	}
	return nil
}

// measure is one sub-benchmark: b.N dispatches, conc at a time.
func (w *world) measure(b *testing.B, conc int) {
	route := strings.TrimPrefix(strings.Split(b.Name(), "/")[1], "route=")
	start := snapshot(b, w.ours)
	before := w.mock.Requests(b)
	stopPerf := startPerf(b, route, conc, w.ours)
	r := benchkit.Concurrent(b, conc, func(int, int) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return w.dispatch(ctx)
	})
	stopPerf()
	calls := w.mock.Requests(b) - before
	if want := int64(b.N * (*toolCalls + 1)); calls != want {
		b.Fatalf("the mock answered %d model calls, want %d", calls, want)
	}
	report(b, w.ours, start, calls, r.Elapsed)
	b.ReportMetric(benchkit.Micros(r.Percentile(0.50)), "p50-us")
	b.ReportMetric(benchkit.Micros(r.Percentile(0.99)), "p99-us")
}

// usage is what the measured processes had used at one moment.
type usage map[string]time.Duration

// snapshot resets each process's peak RSS (VmHWM) to its current RSS and
// reads its CPU time.
func snapshot(b *testing.B, ps []*measured) usage {
	u := usage{}
	for _, p := range ps {
		if p.children {
			u[p.name] = cpuTime(b, p)
			continue
		}
		// 5: reset the peak RSS (proc(5), /proc/pid/clear_refs).
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.pid), []byte("5"), 0); err != nil {
			b.Logf("resetting the peak RSS of %s: %v (the peak since its start is reported)", p.name, err)
		}
		u[p.name] = cpuTime(b, p)
	}
	return u
}

// report reports, per model call, the CPU time of all of ps and of each,
// the wall time per op, and each process's peak RSS over the run.
func report(b *testing.B, ps []*measured, start usage, calls int64, elapsed time.Duration) {
	if calls <= 0 {
		b.Fatal("no model calls")
	}
	var total time.Duration
	for _, p := range ps {
		d := cpuTime(b, p) - start[p.name]
		total += d
		b.ReportMetric(benchkit.Micros(d)/float64(calls), p.name+"-cpu-us/call")
		if !p.children {
			b.ReportMetric(peakRSS(b, p)/1024, p.name+"-rss-MiB")
		}
	}
	b.ReportMetric(benchkit.Micros(total)/float64(calls), "cpu-us/call")
	b.ReportMetric(float64(calls)/float64(b.N), "calls/op")
	b.ReportMetric(benchkit.Micros(elapsed)/float64(b.N), "wall-us/op")
}

// cpuTime is the process's CPU time (user and system, every thread, those
// that ended included), in nanoseconds: the process's CPU-time clock
// (clock_getcpuclockid(3)), read from outside.
func cpuTime(b *testing.B, p *measured) time.Duration {
	if p.children {
		return childrenCPU(b, p)
	}
	// MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of the kernel.
	clock := int32(^uint32(p.pid)<<3 | 2)
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		b.Fatalf("CPU time of %s (pid %d): %v", p.name, p.pid, err)
	}
	return time.Duration(ts.Nano())
}

// childrenCPU is the CPU time of the process's children that ended and
// were waited for (and of theirs), from /proc/PID/stat (cutime, cstime:
// clock ticks, 10 ms).
func childrenCPU(b *testing.B, p *measured) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		b.Fatalf("stat of %s: %v", p.name, err)
	}
	// The fields after the command, which is in parentheses.
	i := strings.LastIndexByte(string(data), ')')
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 (state); cutime and cstime are fields 16 and 17.
	if len(f) < 15 {
		b.Fatalf("stat of %s: %q", p.name, data)
	}
	cu, err1 := strconv.ParseInt(f[13], 10, 64)
	cs, err2 := strconv.ParseInt(f[14], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		b.Fatalf("stat of %s: %v", p.name, err)
	}
	const tick = 10 * time.Millisecond // sysconf(_SC_CLK_TCK) is 100 on Linux
	return time.Duration(cu+cs) * tick
}

// peakRSS is the process's VmHWM in KiB.
func peakRSS(b *testing.B, p *measured) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
	if err != nil {
		b.Fatalf("status of %s: %v", p.name, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb
		}
	}
	b.Fatalf("no VmHWM in the status of %s", p.name)
	return 0
}

// startPerf starts `perf record` on ps when -perf is set, writing
// DIR/<variant>-c<conc>.data and, beside it, .pids (a line "PID NAME" per
// process); each run of a sub-benchmark replaces them, so the last,
// longest, stays. It returns what stops the recording.
func startPerf(b *testing.B, variant string, conc int, ps []*measured) func() {
	if *profileDir == "" {
		return func() {}
	}
	if err := os.MkdirAll(*profileDir, 0o755); err != nil {
		b.Fatal(err)
	}
	var pids []string
	var names strings.Builder // which process each pid is, for the report
	for _, p := range ps {
		if p.children {
			continue // perf follows the children of the processes it records
		}
		pids = append(pids, strconv.Itoa(p.pid))
		fmt.Fprintf(&names, "%d %s\n", p.pid, p.name)
	}
	out := filepath.Join(*profileDir, fmt.Sprintf("%s-c%d.data", variant, conc))
	if err := os.WriteFile(strings.TrimSuffix(out, ".data")+".pids", []byte(names.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	_ = os.Remove(out) // else perf keeps it as .old
	cmd := exec.Command("perf", "record", "-F", "997", "-g", "-q", "-o", out, "-p", strings.Join(pids, ","))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Logf("perf record: %v (no profile)", err)
		return func() {}
	}
	time.Sleep(200 * time.Millisecond) // perf attaches
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		err := cmd.Wait()
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGINT {
			err = nil // how perf record ends when interrupted
		}
		if err != nil {
			b.Logf("perf record: %v: %s", err, stderr.String())
		}
	}
}

// handLoop is a running handloop process.
type handLoop struct {
	pid int
	in  io.Writer
	out *bufio.Reader
}

func startHandLoop(b *testing.B, bin, baseURL, dir string) *handLoop {
	cmd := exec.Command(bin, "--base-url", baseURL, "--model", model, "--dir", dir)
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		_ = cmd.Wait()
	})
	h := &handLoop{pid: cmd.Process.Pid, in: in, out: bufio.NewReader(out)}
	if line, err := h.out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("handloop did not start: %q %v", line, err)
	}
	return h
}

// run has the hand loop run n conversations, conc at a time, and returns
// the model calls they made.
func (h *handLoop) run(n, conc int) (int64, error) {
	if _, err := fmt.Fprintf(h.in, "run %d %d\n", n, conc); err != nil {
		return 0, err
	}
	line, err := h.out.ReadString('\n')
	if err != nil {
		return 0, err
	}
	done, ok := strings.CutPrefix(strings.TrimSpace(line), "done ")
	if !ok {
		return 0, errors.New("handloop: " + strings.TrimSpace(line))
	}
	calls, err := strconv.ParseInt(done, 10, 64)
	if err == nil && calls != int64(n*(*toolCalls+1)) {
		err = fmt.Errorf("handloop made %d model calls for %d conversations, want %d", calls, n, n*(*toolCalls+1))
	}
	return calls, err
}

func dial(b *testing.B, addr string) *grpc.ClientConn {
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}
