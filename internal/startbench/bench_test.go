//go:build linux

package startbench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
)

// idle is how long a started process is left alone before its memory is
// read: long enough for start-up's goroutines to settle and for the
// runtime's first background work to be over.
const idle = 2 * time.Second

// poll is the interval of the health Checks while a process starts.
const poll = time.Millisecond

// target is one binary under measurement.
type target struct {
	name string
	pkg  string
	// envPrefix: the benchmark's own variables with this prefix are not
	// passed on, so that flags are the whole configuration.
	envPrefix string
	// needsState: a State service is started (from the state target's
	// binary, before any clock) for the binary to use, and its address
	// passed in env.stateAddr.
	needsState bool
	// args is the command line for a process listening on addr, with
	// its data under dir (kept between iterations).
	args func(addr, dir string, env runEnv) []string
}

// runEnv is what a target's command line may refer to.
type runEnv struct {
	// bins holds the built binaries by target name.
	bins map[string]string
	// stateAddr is the address of a serving State service, for a target
	// with needsState.
	stateAddr string
}

var targets = []target{
	{name: "bare", pkg: "github.com/secbear/neuron/internal/startbench/testdata/bare",
		args: func(addr, _ string, _ runEnv) []string { return []string{"--addr", addr} }},
	{name: "state", pkg: "github.com/secbear/neuron/services/state/cmd/state", envPrefix: "NEURON_STATE",
		args: func(addr, dir string, _ runEnv) []string {
			return []string{"--dev", "--addr", addr, "--data-dir", filepath.Join(dir, "state")}
		}},
	{name: "operator", pkg: "github.com/secbear/neuron/services/operator/cmd/operator", envPrefix: "NEURON_OPERATOR",
		args: func(addr, dir string, _ runEnv) []string {
			return []string{"--dev", "--addr", addr, "--workspace", filepath.Join(dir, "workspace")}
		}},
	{name: "orchestrator", pkg: "github.com/secbear/neuron/services/orchestrator/cmd/orchestrator", envPrefix: "NEURON_ORCHESTRATOR",
		// The agent definitions live in the State service (the --agents
		// file seeds them at start), so the orchestrator is measured
		// with a State service serving beside it, started once before
		// its clock, as a deployment has one. (Before ea7c3c3 State
		// was dialled lazily and an address nothing listened on was
		// enough; with that address the orchestrator never serves now.)
		needsState: true,
		args: func(addr, dir string, env runEnv) []string {
			return []string{"--dev", "--addr", addr, "--agents", filepath.Join(dir, "agents.yaml"),
				"--data-dir", filepath.Join(dir, "journal"), "--state-addr", env.stateAddr}
		}},
	{name: "environment", pkg: "github.com/secbear/neuron/services/environment/cmd/environment", envPrefix: "NEURON_ENVIRONMENT",
		args: func(addr, dir string, env runEnv) []string {
			// The process backend, the default: it checks that the
			// operator binary is executable and runs nothing until a Run.
			return []string{"--dev", "--addr", addr, "--data-dir", filepath.Join(dir, "environment"),
				"--operator-binary", env.bins["operator"]}
		}},
}

// agents is the smallest agent registry the orchestrator accepts.
const agents = "defaults:\n  operator: 127.0.0.1:1\nagents:\n  - id: assistant\n"

// BenchmarkStartup starts each binary b.N times (use -benchtime Nx) and
// reports the medians described in the package comment.
func BenchmarkStartup(b *testing.B) {
	// Every build before any clock starts.
	targets := append(slices.Clone(targets), linkedTargets(b, targets)...)
	bins := map[string]string{}
	for _, tg := range targets {
		bins[tg.name] = testenv.BuildStatic(b, tg.pkg)
		if err := evict(bins[tg.name]); err != nil {
			b.Fatalf("%s: %v", tg.name, err)
		}
	}
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			dir := b.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "agents.yaml"), []byte(agents), 0o600); err != nil {
				b.Fatal(err)
			}
			fi, err := os.Stat(bins[tg.name])
			if err != nil {
				b.Fatal(err)
			}
			env := runEnv{bins: bins}
			if tg.needsState {
				env.stateAddr = startState(b, bins, dir)
			}
			start := func() sample { return startOnce(b, tg, env, dir) }
			start() // warm-up: the page cache, and the data directory created
			var samples []sample
			for b.Loop() {
				samples = append(samples, start())
			}
			b.ReportMetric(0, "ns/op") // the wall time of a loop is mostly the idle wait
			b.ReportMetric(median(samples, func(s sample) float64 { return s.serving.Seconds() * 1e3 }), "exec-to-serving-ms")
			b.ReportMetric(median(samples, func(s sample) float64 { return s.cpu.Seconds() * 1e3 }), "cpu-to-serving-ms")
			b.ReportMetric(median(samples, func(s sample) float64 { return s.mem.rss }), "idle-rss-MiB")
			b.ReportMetric(median(samples, func(s sample) float64 { return s.mem.anon }), "rss-anon-MiB")
			b.ReportMetric(median(samples, func(s sample) float64 { return s.mem.file }), "rss-file-MiB")
			b.ReportMetric(median(samples, func(s sample) float64 { return s.mem.peak }), "peak-rss-MiB")
			b.ReportMetric(float64(fi.Size())/(1<<20), "binary-MiB")
		})
	}
}

// evict drops the file at path from the page cache, so that the
// warm-up start reads it from disk as a deployed binary is read. Pages a
// build has just written can sit in the cache in larger blocks, which
// fault-around then maps into the process whole: the resident size of
// a freshly linked 100 MB binary came out a fifth higher than after
// reading it back.
func evict(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil { // dirty pages stay cached
		return fmt.Errorf("fdatasync: %w", err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise: %w", err)
	}
	return nil
}

// startState starts a State service (the state target's binary, as the
// state target runs it) with its data under dir, waits until it is
// SERVING and returns its address. It is stopped when b ends.
func startState(b *testing.B, bins map[string]string, dir string) string {
	b.Helper()
	addr := proc.FreeAddr(b)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	p := proc.Start(b, bins["state"], proc.Options{Name: "state", LogPath: filepath.Join(dir, "state-dep.log"), EnvPrefix: "NEURON_STATE"},
		"--dev", "--addr", addr, "--data-dir", filepath.Join(dir, "state-dep"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.WaitServing(ctx, b, healthpb.NewHealthClient(conn), "", 10*time.Millisecond)
	b.Cleanup(func() { p.Terminate(b) })
	return addr
}

// sample is one start of one binary.
type sample struct {
	serving time.Duration
	cpu     time.Duration // on a CPU until SERVING, all threads
	mem     memory
}

// startOnce starts tg's binary, waits until it is SERVING, leaves it
// idle, reads its memory and stops it.
func startOnce(b *testing.B, tg target, env runEnv, dir string) sample {
	b.Helper()
	addr := proc.FreeAddr(b)
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// The default backoff after a refused connection is a second:
		// retry at once instead, as the process is about to listen.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: poll, Multiplier: 1, MaxDelay: poll}, MinConnectTimeout: time.Second}))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	args := tg.args(addr, dir, env)
	logPath := filepath.Join(dir, tg.name+".log")

	t0 := time.Now()
	p := proc.Start(b, env.bins[tg.name], proc.Options{Name: tg.name, LogPath: logPath, EnvPrefix: tg.envPrefix}, args...)
	p.WaitServing(context.Background(), b, health, "", poll)
	serving := time.Since(t0)
	cpu, err := cpuTime(p.Pid())
	if err != nil {
		b.Fatalf("%s: %v", tg.name, err)
	}

	time.Sleep(idle)
	mem, err := readMemory(p.Pid())
	if err != nil {
		b.Fatalf("%s: %v", tg.name, err)
	}
	p.Terminate(b)
	return sample{serving: serving, cpu: cpu, mem: mem}
}

// cpuTime is the time pid's threads have spent on a CPU, from the first
// field of /proc/<pid>/task/<tid>/schedstat (nanoseconds; the tick-based
// utime and stime are too coarse for a start-up).
func cpuTime(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "schedstat"))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("no threads under /proc/%d/task: %v", pid, err)
	}
	var total time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: empty", t)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %v", t, err)
		}
		total += time.Duration(ns)
	}
	return total, nil
}

// memory is what /proc/<pid>/status says of a process, in MiB.
type memory struct {
	rss, anon, file, peak float64
}

// readMemory reads VmRSS, RssAnon, RssFile and VmHWM of pid.
func readMemory(pid int) (memory, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	var m memory
	fields := map[string]*float64{"VmRSS:": &m.rss, "RssAnon:": &m.anon, "RssFile:": &m.file, "VmHWM:": &m.peak}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		kv := strings.Fields(sc.Text()) // "VmRSS:	   26228 kB"
		if len(kv) != 3 || kv[2] != "kB" {
			continue
		}
		if p, ok := fields[kv[0]]; ok {
			kib, err := strconv.ParseFloat(kv[1], 64)
			if err != nil {
				return m, err
			}
			*p = kib / 1024
		}
	}
	return m, sc.Err()
}

// median of f over the samples.
func median(samples []sample, f func(sample) float64) float64 {
	v := make([]float64, len(samples))
	for i, s := range samples {
		v[i] = f(s)
	}
	slices.Sort(v)
	n := len(v)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
