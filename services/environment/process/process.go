// Package process is the environment service's default backend on Linux:
// each invocation is a fresh process of the operator binary in one-shot
// mode, confined by pkg/sandbox.
//
// What the invocation gets:
//
//   - its own uid and gid on the host, drawn per invocation from a range
//     no account uses (it owns nothing there but its workspace), with no
//     capabilities and no supplementary groups;
//   - a private root (pivot_root into a tmpfs) holding only its
//     workspace, the system directories and the operator binary
//     read-only, and the invocation's egress, state and progress
//     sockets: no other Unix socket of the host, no /proc, /sys, /run,
//     /var or home directory exists for it;
//   - a workspace that is a tmpfs of resources.disk (Config.DiskBytes,
//     1 GiB, when the spec sets none); filling it is RESOURCE_EXHAUSTED;
//   - a clean environment: a system PATH, HOME and TMPDIR in its own
//     directories, the env_var credentials of the spec, and for sidecar
//     credentials only a provider base URL and a placeholder key; nothing
//     of the service's own environment;
//   - file credentials at their paths, read-only, written into its
//     private root;
//   - a Landlock ruleset over the same paths, as a second layer;
//   - a seccomp filter (no new namespaces, no raw, packet or netlink
//     sockets, no mount, ptrace, bpf, ...: see pkg/sandbox) and no
//     descriptor of the service's beyond its stdio;
//   - new pid, network, IPC and UTS namespaces: no network but a
//     loopback that is down, no view of the host's processes;
//   - a cgroup capping memory, processes and CPU bandwidth, and rlimits
//     for CPU time, file size and open files;
//   - a wall-clock timeout that kills the whole tree, and a cap on the
//     output read back.
//
// Network egress, when the spec allows any, goes only through the
// invocation's egress proxy on a Unix socket outside the workspace: the
// operator's model traffic is pointed at it (--egress-proxy) and its path
// is in $NEURON_EGRESS_SOCKET for tools.
//
// A spec the backend cannot enforce is refused before anything starts:
// another isolation kind, GPUs, or a host without Landlock, a usable
// cgroup or root (which switching uids and mounting the workspace need);
// a file credential whose path lies in what the sandbox is granted is
// refused when the run starts.
package process

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/environment"
)

// Config configures the process backend.
type Config struct {
	// OperatorBinary is the absolute path of the operator binary.
	OperatorBinary string
	// OperatorArgs are passed before the per-invocation arguments (e.g.
	// "--tools", "read,write,edit,bash", "--script", "/etc/neuron/script.json").
	OperatorArgs []string
	// WorkDir holds one directory per invocation, removed after it.
	WorkDir string
	// ReadOnly lists extra files or directories the invocation may read
	// (files named in OperatorArgs, a model catalog, ...).
	ReadOnly []string
	// Log is the backend's logger.
	Log *slog.Logger
	// DiskBytes caps each workspace when the spec sets no resources.disk:
	// the workspace is a tmpfs of that size (its pages count against
	// the invocation's memory limit too). Zero means DefaultDiskBytes.
	DiskBytes int64
}

// DefaultDiskBytes is the workspace cap when neither the spec nor the
// configuration sets one.
const DefaultDiskBytes = 1 << 30

// sandboxIDBase and sandboxIDRange are where each invocation's uid and
// gid are drawn from (as root): ids no account on the host has, so the
// sandboxed process owns nothing there, and distinct per invocation, so
// RLIMIT_NPROC and file ownership do not cross tenants.
const (
	sandboxIDBase  = 1_600_000_000
	sandboxIDRange = 1 << 24
)

// Probes of the host's support for Landlock and for a usable cgroup,
// made by Check; variables only so that tests can stand in for a host
// that lacks them.
var (
	landlockSupported = sandbox.Supported
	cgroupSupported   = sandbox.CgroupSupported
)

// Backend runs invocations as confined processes.
type Backend struct {
	cfg Config
	// lock holds an exclusive flock on the work directory for the
	// backend's lifetime: one service owns it, so it may sweep it.
	lock *os.File
}

// New checks cfg and returns the backend. Kernel support is checked per
// spec (Check), so that a host without it refuses specs clearly rather
// than failing to start.
func New(cfg Config) (*Backend, error) {
	if !filepath.IsAbs(cfg.OperatorBinary) {
		return nil, fmt.Errorf("process backend: the operator binary %q must be an absolute path", cfg.OperatorBinary)
	}
	if fi, err := os.Stat(cfg.OperatorBinary); err != nil || fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("process backend: the operator binary %q is not an executable file", cfg.OperatorBinary)
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = filepath.Join(os.TempDir(), "neuron-environment")
	}
	wd, err := filepath.Abs(cfg.WorkDir)
	if err != nil {
		return nil, err
	}
	cfg.WorkDir = wd
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("process backend: work dir: %w", err)
	}
	lock, err := lockWorkDir(cfg.WorkDir)
	if err != nil {
		return nil, err
	}
	for _, p := range cfg.ReadOnly {
		if _, err := os.Stat(p); err != nil || !filepath.IsAbs(p) {
			return nil, fmt.Errorf("process backend: read-only path %q must be an existing absolute path", p)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.DiskBytes < 0 {
		return nil, fmt.Errorf("process backend: negative disk cap %d", cfg.DiskBytes)
	}
	if cfg.DiskBytes == 0 {
		cfg.DiskBytes = DefaultDiskBytes
	}
	if n := sweep(cfg.WorkDir, cfg.Log); n > 0 {
		cfg.Log.Warn("removed what invocations of an earlier run of this service left behind (it stopped without cleaning up)", "work_dir", cfg.WorkDir, "invocations", n)
	}
	return &Backend{cfg: cfg, lock: lock}, nil
}

// Name implements environment.Backend.
func (b *Backend) Name() string { return "process" }

// PersistentWorkspaces implements environment.Persistent: a workspace
// that lasts is copied into the invocation's capped tmpfs before the
// run and stored back after it.
func (b *Backend) PersistentWorkspaces() bool { return true }

// Close releases the work directory, so that another backend (a service
// started again in this process, say) may own it. Call it once no
// invocation runs.
func (b *Backend) Close() {
	if b.lock != nil {
		_ = b.lock.Close()
	}
}

// Check implements environment.Backend.
func (b *Backend) Check(spec *environmentv1.EnvironmentSpec) error {
	if err := environment.Unsupported(b.Name(), spec, environment.KindProcess, environment.KindNetworkPolicy); err != nil {
		return err
	}
	if err := landlockSupported(); err != nil {
		return fmt.Errorf("the process backend needs Landlock, which this host lacks (%v): %w", err, errs.FailedPrecondition)
	}
	if err := cgroupSupported(); err != nil {
		return fmt.Errorf("the process backend caps memory and processes with a cgroup, which this host cannot give it (%v): %w", err, errs.FailedPrecondition)
	}
	r := spec.GetResources()
	if r == nil {
		r = &environmentv1.ResourceLimits{}
	}
	if r.Gpu != nil {
		return fmt.Errorf("the process backend cannot assign GPUs (resources.gpu); use the container or kubernetes backend: %w", errs.FailedPrecondition)
	}
	if err := rootProbe(); err != nil {
		return fmt.Errorf("the process backend runs each invocation as a uid of its own, in a size-capped workspace, which needs the service to run as root (%v): %w", err, errs.FailedPrecondition)
	}
	return nil
}

// rootProbe is nil when the service can switch uids and mount a
// workspace; a variable only so that tests can stand in for a host
// where it cannot.
var rootProbe = func() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("it runs as uid %d", os.Geteuid())
	}
	return nil
}

// Run implements environment.Backend.
func (b *Backend) Run(ctx context.Context, inv *environment.Invocation) (*environment.Result, error) {
	dir := filepath.Join(b.cfg.WorkDir, inv.ID)
	ws := filepath.Join(dir, "workspace")
	if err := os.MkdirAll(ws, 0o700); err != nil {
		return nil, fmt.Errorf("creating the invocation's workspace: %v: %w", err, errs.Retryable)
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			inv.Log.Warn("removing the invocation directory", "dir", dir, "error", err.Error())
		}
	}()
	// The invocation's own identity, and its workspace: a tmpfs of the
	// disk cap, owned by it (the invocation directory around it stays
	// the service's, 0700).
	ids := newIDs()
	disk := inv.Limits.DiskBytes
	if disk == 0 {
		disk = b.cfg.DiskBytes
	}
	unmount, err := mountWorkspace(ws, disk, ids)
	if err != nil {
		return nil, fmt.Errorf("mounting the invocation's workspace: %v: %w", err, errs.Retryable)
	}
	defer unmount()
	if inv.Workspace != nil {
		if err := inv.Workspace.Load(ws, int(ids.UID), int(ids.GID)); err != nil {
			return nil, fmt.Errorf("loading workspace %s: %w", inv.Workspace.Name, err)
		}
	}

	argv := append([]string{b.cfg.OperatorBinary}, b.cfg.OperatorArgs...)
	argv = append(argv, "--workspace", ws)
	env := append(sandbox.DefaultEnv(ws), environment.CredentialEnv(inv.Credentials)...)
	if inv.Egress != nil {
		sock := filepath.Join(dir, "egress.sock")
		stop, err := inv.Egress(sock)
		if err != nil {
			return nil, fmt.Errorf("starting the egress proxy: %v: %w", err, errs.Retryable)
		}
		defer stop()
		argv = append(argv, "--egress-proxy", "unix://"+sock)
		env = append(env, "NEURON_EGRESS_SOCKET="+sock)
	}
	if inv.State != nil {
		sock := filepath.Join(dir, "state.sock")
		stop, err := inv.State(sock)
		if err != nil {
			return nil, fmt.Errorf("starting the state bridge: %v: %w", err, errs.Retryable)
		}
		defer stop()
		// Plaintext over a socket in the invocation's private directory.
		argv = append(argv, "--state-addr", "unix://"+sock, "--plaintext")
	}
	if inv.Progress != nil {
		// The operator's progress events, for RunStream. Tools do
		// not get the variable (toolEnv); the socket takes one
		// connection, the operator's.
		sock := filepath.Join(dir, "progress.sock")
		stop, err := inv.Progress.Serve(sock)
		if err != nil {
			return nil, fmt.Errorf("starting the progress socket: %v: %w", err, errs.Retryable)
		}
		defer stop()
		env = append(env, environment.ProgressEnv+"="+sock)
	}
	// Tools get the env_var credentials and the egress socket too: the
	// bash tool otherwise starts commands with a minimal environment.
	if names := toolEnv(inv, env); names != "" {
		argv = append(argv, "--tool-env", names)
	}
	var files, sockets []string
	for _, c := range inv.Credentials {
		if f := c.Injection.GetFile(); f != nil {
			files = append(files, f.GetPath())
		}
	}
	for _, sock := range []string{"egress.sock", "state.sock", "progress.sock"} {
		if _, err := os.Stat(filepath.Join(dir, sock)); err == nil {
			sockets = append(sockets, filepath.Join(dir, sock))
		}
	}
	if len(files) > 0 {
		argv = append(argv, "--tool-read-only", strings.Join(files, ","))
	}
	argv = append(argv, environment.OneShotArgs()...)

	lim := inv.Limits
	policy := sandbox.Policy{
		Workspace: ws,
		ReadOnly:  append([]string{b.cfg.OperatorBinary}, b.cfg.ReadOnly...),
		// The only sockets of the host that exist in its private root.
		ReadWrite:  sockets,
		RunAs:      &ids,
		Env:        env,
		PrivateTmp: true,
		Timeout:    inv.Timeout,
		MaxOutput:  int(min(lim.MaxOutputBytes, 1<<30)),
		Limits: sandbox.Limits{
			CPUSeconds:    uint64((lim.CPUTime + time.Second - 1) / time.Second),
			OpenFiles:     1024,
			FileSizeBytes: 1 << 30,
		},
		Namespaces: sandbox.Namespaces{Mount: true, PID: true, Net: true, IPC: true, UTS: true},
		Cgroup:     &sandbox.Cgroup{MemoryBytes: lim.MemoryBytes, Pids: int64(lim.MaxProcesses), CPUMillis: lim.CPUMillis},
	}
	for _, c := range inv.Credentials {
		if f := c.Injection.GetFile(); f != nil {
			policy.Files = append(policy.Files, sandbox.File{Path: f.GetPath(), Data: []byte(c.Value)})
		}
	}
	res, err := sandbox.Run(ctx, policy, argv, bytes.NewReader(inv.InputJSON))
	var saveErr error
	if res != nil && inv.Workspace != nil {
		// What the run left, whatever its outcome; the sandbox's
		// processes are all gone.
		if saveErr = inv.Workspace.Save(ws); saveErr != nil {
			inv.Log.Warn("storing the workspace", "workspace", inv.Workspace.Name, "error", saveErr.Error())
		}
	}
	if res == nil {
		if err == nil {
			err = errors.New("no result")
		}
		if errors.Is(err, sandbox.ErrFilePlacement) {
			return nil, fmt.Errorf("a file credential cannot be placed: %v; choose a path outside the workspace and the system directories, such as /run/secrets/NAME: %w", err, errs.FailedPrecondition)
		}
		if errors.Is(err, sandbox.ErrUnsupported) {
			return nil, fmt.Errorf("%v: %w", err, errs.FailedPrecondition)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("could not start the sandboxed operator: %v: %w", err, errs.Retryable)
	}
	out := &environment.Result{Usage: usage(res), Logs: res.Stderr}
	switch {
	case err != nil:
		return out, err // the caller's context: canceled or past its deadline
	case res.TimedOut:
		return out, fmt.Errorf("the invocation ran past its timeout of %v; every process of it was killed: %w", inv.Timeout, errs.DeadlineExceeded)
	case res.StdoutSize > int64(len(res.Stdout)):
		return out, fmt.Errorf("the operator wrote %d bytes of output, more than max_output_bytes (%d); it was discarded: %w", res.StdoutSize, lim.MaxOutputBytes, errs.ResourceExhausted)
	case res.Signal != "" && res.Cgroup != nil && res.Cgroup.OOMKills > 0:
		return out, fmt.Errorf("the operator was killed at the memory limit of %d bytes: %w", lim.MemoryBytes, errs.ResourceExhausted)
	case res.Signal == "SIGXCPU" || (res.Signal == "SIGKILL" && lim.CPUTime > 0 && res.Cgroup != nil && res.Cgroup.OOMKills == 0 && cpuBound(res, lim)):
		return out, fmt.Errorf("the operator used up its CPU time limit of %v: %w", lim.CPUTime, errs.ResourceExhausted)
	case res.Signal != "":
		return out, fmt.Errorf("the operator was killed by %s (%s): %w", res.Signal, environment.LastLine(res.Stderr), errs.Internal)
	case workspaceFull(ws):
		out.Usage.LimitsHit = append(out.Usage.LimitsHit, "disk")
		return out, fmt.Errorf("the invocation filled its workspace, capped at %d bytes (resources.disk); ask for more disk or write less: %w", disk, errs.ResourceExhausted)
	}
	output, err := environment.DecodeOutput(res.Stdout, res.Stderr, res.ExitCode)
	if err != nil {
		return out, err
	}
	if saveErr != nil {
		return out, fmt.Errorf("the run ended, but its workspace %s could not be stored: %w", inv.Workspace.Name, saveErr)
	}
	out.Output = output
	return out, nil
}

// toolEnv names the variables of env that the operator's tools should
// see: the env_var credentials and the egress socket.
func toolEnv(inv *environment.Invocation, env []string) string {
	var names []string
	for _, c := range inv.Credentials {
		if e := c.Injection.GetEnvVar(); e != nil {
			names = append(names, e.GetVarName())
		}
	}
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == "NEURON_EGRESS_SOCKET" {
			names = append(names, k)
		}
	}
	return strings.Join(names, ",")
}

// cpuBound guesses whether a SIGKILL came from RLIMIT_CPU's hard limit
// (one second after SIGXCPU, which a process may catch): the run lasted
// at least the CPU limit.
func cpuBound(res *sandbox.Result, lim environment.Limits) bool {
	return res.Duration >= lim.CPUTime
}

// usage reports what the sandbox measured.
func usage(res *sandbox.Result) *environmentv1.ResourceUsage {
	u := &environmentv1.ResourceUsage{}
	if res.CPUTime > 0 {
		u.CpuTime = durationpb.New(res.CPUTime)
	}
	if cg := res.Cgroup; cg != nil {
		u.PeakMemoryBytes = uint64(max(cg.PeakMemoryBytes, 0))
		if cg.OOMKills > 0 {
			u.LimitsHit = append(u.LimitsHit, "memory")
		}
		if cg.PidsLimitHits > 0 {
			u.LimitsHit = append(u.LimitsHit, "processes")
		}
		if cg.CPUThrottled > 0 {
			u.LimitsHit = append(u.LimitsHit, "cpu")
		}
	}
	if res.StdoutSize > int64(len(res.Stdout)) {
		u.LimitsHit = append(u.LimitsHit, "output")
	}
	return u
}

// newIDs draws an invocation's uid and gid (the same number).
func newIDs() sandbox.IDs {
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := sandboxIDBase + binary.BigEndian.Uint32(b[:])%sandboxIDRange
	return sandbox.IDs{UID: id, GID: id}
}

// mountWorkspace mounts a tmpfs of size bytes on ws, owned by ids, and
// returns what unmounts it.
func mountWorkspace(ws string, size int64, ids sandbox.IDs) (func(), error) {
	opts := fmt.Sprintf("size=%d,mode=0700,uid=%d,gid=%d", size, ids.UID, ids.GID)
	if err := unix.Mount("tmpfs", ws, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return nil, err
	}
	return func() { _ = unix.Unmount(ws, unix.MNT_DETACH) }, nil
}

// workspaceFull reports whether the workspace's tmpfs has no free block
// left: the invocation ran into its disk cap.
func workspaceFull(ws string) bool {
	var st unix.Statfs_t
	return unix.Statfs(ws, &st) == nil && st.Bfree == 0
}

// lockWorkDir takes an exclusive flock on dir, held by the returned file
// for the life of the process: two services sharing a work directory
// would remove each other's invocations.
func lockWorkDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("process backend: work dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("process backend: work dir %s is in use by another environment service; give each service its own --data-dir", dir)
		}
		return nil, fmt.Errorf("process backend: locking the work dir %s: %w", dir, err)
	}
	return f, nil
}

// sweep removes the invocation directories a killed run of the service
// left in dir, unmounting their workspace first, and says how many.
func sweep(dir string, log *slog.Logger) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "inv-") {
			continue
		}
		inv := filepath.Join(dir, e.Name())
		_ = unix.Unmount(filepath.Join(inv, "workspace"), unix.MNT_DETACH) // EINVAL when not mounted
		if err := os.RemoveAll(inv); err != nil {
			log.Warn("removing a left-over invocation directory", "dir", inv, "error", err.Error())
			continue
		}
		n++
	}
	return n
}

// Exec implements environment.Executor: it runs argv, a command of a
// sandbox session, under the isolation Run gives the operator (its own
// uid, private root, seccomp, Landlock, namespaces, cgroup, rlimits, a
// size-capped tmpfs workspace loaded from and stored back to the
// session's workspace), with stdin as its standard input. Only the
// state bridge and the progress socket are left out: they serve the
// operator.
func (b *Backend) Exec(ctx context.Context, inv *environment.Invocation, argv []string, stdin []byte) (*environment.ExecResult, error) {
	return b.exec(ctx, inv, argv, bytes.NewReader(stdin), nil)
}

// ExecStream implements environment.StreamExecutor: Exec, with the
// command's standard streams (a pseudo-terminal with w.TTY) and signals
// wired as w says rather than captured.
func (b *Backend) ExecStream(ctx context.Context, inv *environment.Invocation, argv []string, w environment.ExecWiring) (*environment.ExecResult, error) {
	if w.Stdin == nil || w.Stdout == nil || w.Stderr == nil {
		return nil, fmt.Errorf("a streamed command needs its stdin, stdout and stderr: %w", errs.Internal)
	}
	return b.exec(ctx, inv, argv, w.Stdin, &w)
}

// exec runs a sandbox command, its output captured or, with w, streamed.
func (b *Backend) exec(ctx context.Context, inv *environment.Invocation, argv []string, stdin io.Reader, w *environment.ExecWiring) (*environment.ExecResult, error) {
	if inv.Workspace == nil {
		return nil, fmt.Errorf("a sandbox command needs its session's workspace: %w", errs.Internal)
	}
	dir := filepath.Join(b.cfg.WorkDir, inv.ID)
	ws := filepath.Join(dir, "workspace")
	if err := os.MkdirAll(ws, 0o700); err != nil {
		return nil, fmt.Errorf("creating the command's workspace: %v: %w", err, errs.Retryable)
	}
	defer os.RemoveAll(dir)
	ids := newIDs()
	disk := inv.Limits.DiskBytes
	if disk == 0 {
		disk = b.cfg.DiskBytes
	}
	unmount, err := mountWorkspace(ws, disk, ids)
	if err != nil {
		return nil, fmt.Errorf("mounting the command's workspace: %v: %w", err, errs.Retryable)
	}
	defer unmount()
	if err := inv.Workspace.Load(ws, int(ids.UID), int(ids.GID)); err != nil {
		return nil, fmt.Errorf("loading workspace %s: %w", inv.Workspace.Name, err)
	}
	if !strings.Contains(argv[0], "/") {
		p, ok := lookPath(argv[0])
		if !ok {
			return nil, fmt.Errorf("command %q is not in the sandbox's PATH (/usr/local/bin:/usr/bin:/bin): %w", argv[0], errs.NotFound)
		}
		argv = append([]string{p}, argv[1:]...)
	}
	env := append(sandbox.DefaultEnv(ws), environment.CredentialEnv(inv.Credentials)...)
	var sockets []string
	if inv.Egress != nil {
		sock := filepath.Join(dir, "egress.sock")
		stop, err := inv.Egress(sock)
		if err != nil {
			return nil, fmt.Errorf("starting the egress proxy: %v: %w", err, errs.Retryable)
		}
		defer stop()
		env = append(env, "NEURON_EGRESS_SOCKET="+sock)
		sockets = append(sockets, sock)
	}
	lim := inv.Limits
	policy := sandbox.Policy{
		Workspace:  ws,
		ReadOnly:   b.cfg.ReadOnly,
		ReadWrite:  sockets,
		RunAs:      &ids,
		Env:        env,
		PrivateTmp: true,
		Timeout:    inv.Timeout,
		MaxOutput:  int(min(lim.MaxOutputBytes, 1<<30)),
		Limits: sandbox.Limits{
			CPUSeconds:    uint64((lim.CPUTime + time.Second - 1) / time.Second),
			OpenFiles:     1024,
			FileSizeBytes: 1 << 30,
		},
		Namespaces: sandbox.Namespaces{Mount: true, PID: true, Net: true, IPC: true, UTS: true},
		Cgroup:     &sandbox.Cgroup{MemoryBytes: lim.MemoryBytes, Pids: int64(lim.MaxProcesses), CPUMillis: lim.CPUMillis},
	}
	for _, c := range inv.Credentials {
		if f := c.Injection.GetFile(); f != nil {
			policy.Files = append(policy.Files, sandbox.File{Path: f.GetPath(), Data: []byte(c.Value)})
		}
	}
	if w != nil {
		policy.Stdout, policy.Stderr, policy.Terminal, policy.Signals = w.Stdout, w.Stderr, w.TTY, w.Signals
	}
	res, err := sandbox.Run(ctx, policy, argv, stdin)
	if res == nil {
		if err == nil {
			err = errors.New("no result")
		}
		if errors.Is(err, sandbox.ErrFilePlacement) {
			return nil, fmt.Errorf("a file credential cannot be placed: %v: %w", err, errs.FailedPrecondition)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("could not start the command: %v: %w", err, errs.Retryable)
	}
	out := &environment.ExecResult{Stdout: res.Stdout, Stderr: res.Stderr, Code: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut}
	out.LimitsHit = usage(res).GetLimitsHit()
	if workspaceFull(ws) {
		out.LimitsHit = append(out.LimitsHit, "disk")
	}
	if serr := inv.Workspace.Save(ws); serr != nil {
		return out, fmt.Errorf("the command ended, but workspace %s could not be stored: %w", inv.Workspace.Name, serr)
	}
	return out, err
}

// lookPath finds name in the sandbox's PATH.
func lookPath(name string) (string, bool) {
	for _, d := range []string{"/usr/local/bin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}
