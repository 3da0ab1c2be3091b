package docker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// LabelSandbox is the label of a sandbox session's container; its value
// is the sandbox's workspace name.
const LabelSandbox = "neuron.dev/sandbox"

// sandboxPath is the PATH of a sandbox's commands: a command named
// without a '/' is looked up there, as on the process backend.
const sandboxPath = "PATH=/usr/local/bin:/usr/bin:/bin"

// Bounds of a sandbox command's end.
const (
	// execPoll is how often a running command's exec is inspected: the
	// engine has no call that waits for an exec, and a command whose
	// background processes hold its output open ends before its stream.
	execPoll = 100 * time.Millisecond
	// execStreamWait bounds the wait for the command's output stream
	// once every process of the command is gone.
	execStreamWait = 10 * time.Second
	// keeperWait bounds the wait for the sandbox's first processes.
	keeperWait = 10 * time.Second
)

var (
	_ environment.StreamExecutor = (*Backend)(nil)
	_ environment.SandboxHost    = (*Backend)(nil)
)

// box is one sandbox session's container.
type box struct {
	name  string // the sandbox's workspace name
	id    string // the container
	dir   string // its per-sandbox directory on the host
	stops []func()
	// egress: the container has the egress proxy's socket.
	egress bool
	// ns is the container's pid namespace as the service sees it
	// (/proc/PID/ns/pid of its init), and keepers are its own processes
	// (the engine's init and the process it waits on), by pid and start
	// time. Empty ns: the service does not see the container's
	// processes (it runs on another host or in another pid namespace
	// than the engine), and the container is killed whole where a
	// command's processes would be.
	ns      string
	keepers map[int]string
}

// OpenSandbox starts the container of a sandbox session (inv is made from
// the sandbox's spec; inv.Workspace is its workspace): the isolation of a
// run's container (see Run: network none, read-only root, no privilege,
// all capabilities dropped, the limits, the egress proxy's socket and the
// file credentials mounted alone), its workspace a volume mounted at
// /workspace, and the engine's init as its first process waiting on the
// operator binary, which waits on a standard input nobody writes: no
// agent turn ever runs in it. Commands run beside them through the
// engine's exec API (ExecStream). Environment-variable credentials are
// given to each command, not to the container.
func (b *Backend) OpenSandbox(ctx context.Context, inv *environment.Invocation) (err error) {
	if inv.Workspace == nil {
		return fmt.Errorf("a sandbox needs its workspace: %w", errs.Internal)
	}
	if err := b.Check(inv.Spec); err != nil {
		return err
	}
	lim := b.limits(inv.Limits)
	if err := checkLimits(lim); err != nil {
		return err
	}
	if err := b.checkCredentials(inv.Credentials); err != nil {
		return err
	}
	withLimits := *inv
	withLimits.Limits = lim
	inv = &withLimits
	log := inv.Log
	if log == nil {
		log = b.log
	}
	log = log.With("sandbox", inv.Workspace.Name)

	bx := &box{name: inv.Workspace.Name}
	defer func() {
		if err != nil {
			b.discard(context.WithoutCancel(ctx), bx, log)
		}
	}()
	if bx.dir, err = os.MkdirTemp(b.workDir, invDirPattern); err != nil {
		return fmt.Errorf("creating the sandbox's directory: %v: %w", err, errs.Retryable)
	}
	var mounts []mount.Mount
	if inv.Egress != nil {
		m, stop, err := startSocket(bx.dir, "egress", EgressSocket, "the egress proxy", inv.Egress)
		if err != nil {
			return err
		}
		bx.stops = append(bx.stops, stop)
		bx.egress = true
		mounts = append(mounts, m)
	}
	fm, err := writeFileCredentials(bx.dir, inv.Credentials)
	if err != nil {
		return err
	}
	mounts = append(mounts, fm...)
	image := b.image(inv.Spec)
	vol, err := b.ensureVolume(ctx, inv.Workspace.Name, image)
	if err != nil {
		return err
	}
	mounts = append(mounts, workspaceMount(vol, inv.Workspace.Name, false))
	hc := b.hostConfig(inv, map[string]string{"/tmp": tmpfsOptions(tmpSize)}, mounts)
	// The engine's init (tini) is the first process: it reaps what the
	// commands leave behind.
	hc.Init = ptrTo(true)
	created, err := b.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: "neuron-" + inv.Workspace.Name,
		Config: &container.Config{
			Image:      image,
			Entrypoint: []string{b.operatorPath},
			Cmd:        environment.OneShotArgs(),
			Env:        []string{sandboxPath},
			User:       ContainerUser,
			WorkingDir: Workspace,
			// Its standard input stays open and is never written: the
			// operator waits on it for as long as the sandbox lasts.
			OpenStdin:   true,
			Labels:      map[string]string{LabelSandbox: inv.Workspace.Name},
			Healthcheck: &container.HealthConfig{Test: []string{"NONE"}},
		},
		HostConfig: hc,
	})
	if err != nil {
		if ctx.Err() == nil && cerrdefs.IsNotFound(err) {
			return fmt.Errorf("image %q: no such image on the docker engine; build it with make images: %w", image, errs.FailedPrecondition)
		}
		return b.engineErr(ctx, "creating the sandbox's container", err)
	}
	bx.id = created.ID
	if err := b.verify(ctx, created.ID, image, mounts, vol); err != nil {
		return err
	}
	// A workspace past its cap is refused before anything runs.
	capBytes := inv.Workspace.Cap()
	if size, err := b.usage(ctx, created.ID, capBytes); err != nil {
		return err
	} else if size > capBytes {
		return overCap(inv.Workspace.Name, size, capBytes, "before the sandbox started")
	}
	if err := b.startBox(ctx, bx, log); err != nil {
		return err
	}
	b.boxMu.Lock()
	defer b.boxMu.Unlock()
	if b.boxes == nil {
		b.boxes = map[string]*box{}
	}
	if b.boxes[bx.name] != nil {
		return fmt.Errorf("sandbox %s is already open: %w", bx.name, errs.Internal)
	}
	b.boxes[bx.name] = bx
	log.Info("sandbox container started", "container", bx.id, "sees_processes", bx.ns != "")
	return nil
}

// startBox starts bx's container and learns its own processes.
func (b *Backend) startBox(ctx context.Context, bx *box, log *slog.Logger) error {
	if _, err := b.cli.ContainerStart(ctx, bx.id, client.ContainerStartOptions{}); err != nil {
		return b.engineErr(ctx, "starting the sandbox's container", err)
	}
	bx.ns, bx.keepers = "", nil
	ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	res, err := b.cli.ContainerInspect(ictx, bx.id, client.ContainerInspectOptions{})
	if err != nil {
		return b.engineErr(ctx, "inspecting the sandbox's container", err)
	}
	st := res.Container.State
	if st == nil || !st.Running || st.Pid <= 0 {
		return fmt.Errorf("the sandbox's container did not keep running (does image %q have its operator binary at %s?): %w", res.Container.Config.Image, b.operatorPath, errs.FailedPrecondition)
	}
	ns, ok := initNamespace(st.Pid)
	if !ok {
		log.Warn("the service does not see the sandbox container's processes (the engine runs on another host or in another pid namespace): a command's signals other than SIGKILL are not delivered, and the container is restarted to end a command's processes")
		return nil
	}
	// The init and the operator it starts are the container's own; any
	// other process is a command's.
	deadline := time.Now().Add(keeperWait)
	for {
		procs := nsProcs(ns, nil)
		if len(procs) >= 2 {
			bx.ns, bx.keepers = ns, procs
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the sandbox's container started no operator within %v (does image %q have its operator binary at %s?): %w", keeperWait, res.Container.Config.Image, b.operatorPath, errs.FailedPrecondition)
		}
		select {
		case <-ctx.Done():
			return b.engineErr(ctx, "starting the sandbox's container", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// CloseSandbox removes sandbox name's container, directory and workspace
// volume; a sandbox it does not have is not an error.
func (b *Backend) CloseSandbox(ctx context.Context, name string) error {
	b.boxMu.Lock()
	bx := b.boxes[name]
	delete(b.boxes, name)
	b.boxMu.Unlock()
	if bx == nil {
		return nil
	}
	b.discard(ctx, bx, b.log.With("sandbox", name))
	if _, err := b.DeleteWorkspace(ctx, name); err != nil {
		return fmt.Errorf("removing sandbox %s's workspace: %w", name, err)
	}
	return nil
}

// discard removes what bx holds but its volume.
func (b *Backend) discard(ctx context.Context, bx *box, log *slog.Logger) {
	if bx.id != "" {
		b.remove(ctx, bx.id, log)
	}
	for _, stop := range bx.stops {
		stop()
	}
	if bx.dir != "" {
		if err := os.RemoveAll(bx.dir); err != nil {
			log.Warn("could not remove the sandbox's directory", "dir", bx.dir, "error", err)
		}
	}
}

// ExecStream runs argv in the sandbox's container through the engine's
// exec API, as the container's user in /workspace, with the invocation's
// environment-variable credentials (and the egress proxy's socket in
// $NEURON_EGRESS_SOCKET when the sandbox has one): its standard streams
// are w's (a terminal of the engine's own with w.TTY: w's is set raw and
// only carries bytes), w.Signals go to the command's processes, w.Resizes
// to its terminal. The workspace's cap is checked before the command and
// after it (a command that leaves it past the cap is RESOURCE_EXHAUSTED).
// When the command's first process ends, its other processes are killed;
// at inv.Timeout or when ctx ends, all of them are.
func (b *Backend) ExecStream(ctx context.Context, inv *environment.Invocation, argv []string, w environment.ExecWiring) (*environment.ExecResult, error) {
	if inv.Workspace == nil {
		return nil, fmt.Errorf("a sandbox command needs its session's workspace: %w", errs.Internal)
	}
	if w.Stdin == nil || w.Stdout == nil || w.Stderr == nil {
		return nil, fmt.Errorf("a streamed command needs its stdin, stdout and stderr: %w", errs.Internal)
	}
	b.boxMu.Lock()
	bx := b.boxes[inv.Workspace.Name]
	b.boxMu.Unlock()
	if bx == nil {
		return nil, fmt.Errorf("sandbox %s has no container on the docker backend (the service restarted?); create another sandbox: %w", inv.Workspace.Name, errs.FailedPrecondition)
	}
	if err := b.checkCredentials(inv.Credentials); err != nil {
		return nil, err
	}
	log := inv.Log
	if log == nil {
		log = b.log
	}
	log = log.With("sandbox", bx.name)
	if err := b.ensureRunning(ctx, bx, log); err != nil {
		return nil, err
	}
	capBytes := inv.Workspace.Cap()
	if size, err := b.usage(ctx, bx.id, capBytes); err != nil {
		return nil, err
	} else if size > capBytes {
		return nil, overCap(bx.name, size, capBytes, "before the command")
	}
	defer b.touch(VolumeName(bx.name))

	env := append([]string{sandboxPath}, environment.CredentialEnv(inv.Credentials)...)
	if bx.egress {
		env = append(env, "NEURON_EGRESS_SOCKET="+EgressSocket)
	}
	opts := client.ExecCreateOptions{
		User: ContainerUser, TTY: w.TTY, AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Env: env, WorkingDir: Workspace, Cmd: argv,
	}
	if w.TTY {
		// w's terminal is raw (environment.ExecWiring): the engine's
		// does the line discipline.
		if rows, cols, err := termSize(w.Stdin); err == nil {
			opts.ConsoleSize = client.ConsoleSize{Height: uint(rows), Width: uint(cols)}
		}
	}
	ex, err := b.cli.ExecCreate(ctx, bx.id, opts)
	if err != nil {
		return nil, b.engineErr(ctx, "creating the command", err)
	}
	att, err := b.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{TTY: w.TTY, ConsoleSize: opts.ConsoleSize})
	if err != nil {
		return nil, b.engineErr(ctx, "starting the command", err)
	}
	defer att.Close()
	// Signals wait for the command's process, and the engine may not
	// apply the size asked for at the start before the command reads it.
	if err := b.awaitStart(ctx, ex.ID); err != nil {
		return nil, err
	}
	if w.TTY && opts.ConsoleSize.Height > 0 {
		if _, err := b.cli.ExecResize(ctx, ex.ID, client.ExecResizeOptions{Height: opts.ConsoleSize.Height, Width: opts.ConsoleSize.Width}); err != nil {
			log.Debug("sizing the command's terminal", "error", err)
		}
	}
	go func() {
		// Ends at the client's end of input, or when the caller closes
		// w.Stdin after ExecStream returns.
		if _, err := io.Copy(att.Conn, w.Stdin); err == nil {
			_ = att.CloseWrite()
		}
	}()
	copied := make(chan error, 1)
	go func() {
		var err error
		if w.TTY {
			_, err = io.Copy(w.Stdout, att.Reader)
		} else {
			_, err = stdcopy.StdCopy(w.Stdout, w.Stderr, att.Reader)
		}
		copied <- err
	}()

	timer := time.NewTimer(inv.Timeout)
	defer timer.Stop()
	poll := time.NewTicker(execPoll)
	defer poll.Stop()
	var (
		sent     syscall.Signal
		timedOut bool
		streamed bool
	)
	signals, resizes := w.Signals, w.Resizes
wait:
	for {
		select {
		case <-ctx.Done():
			b.endCommand(context.WithoutCancel(ctx), bx, log)
			return nil, ctx.Err()
		case <-timer.C:
			timedOut = true
			b.endCommand(ctx, bx, log)
			break wait
		case sig, ok := <-signals:
			if !ok {
				signals = nil
				continue
			}
			sent = sig
			b.signal(ctx, bx, sig, log)
		case sz, ok := <-resizes:
			if !ok {
				resizes = nil
				continue
			}
			if _, err := b.cli.ExecResize(ctx, ex.ID, client.ExecResizeOptions{Height: uint(sz.GetRows()), Width: uint(sz.GetCols())}); err != nil {
				log.Warn("resizing the command's terminal", "error", err)
			}
		case err := <-copied:
			copied, streamed = nil, true
			if err != nil && ctx.Err() == nil {
				log.Warn("reading the command's output", "error", err)
			}
			if done, err := b.execEnded(ctx, ex.ID); err != nil {
				return nil, err
			} else if done {
				break wait
			}
		case <-poll.C:
			if done, err := b.execEnded(ctx, ex.ID); err != nil {
				return nil, err
			} else if done {
				break wait
			}
		}
	}
	// The first process ended (or the timeout killed them all): what
	// the command left running goes too, which ends the stream.
	b.endCommand(context.WithoutCancel(ctx), bx, log)
	if !streamed {
		select {
		case <-copied:
		case <-time.After(execStreamWait):
			log.Warn("the command's output stream did not end after its processes", "wait", execStreamWait.String())
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	res := &environment.ExecResult{TimedOut: timedOut}
	if timedOut {
		res.Code, res.Signal = -1, "SIGKILL"
	} else {
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), inspectTimeout)
		defer cancel()
		in, err := b.cli.ExecInspect(ictx, ex.ID, client.ExecInspectOptions{})
		if err != nil {
			return nil, b.engineErr(ctx, "inspecting the ended command", err)
		}
		res.Code = in.ExitCode
		// A process ended by a signal exits 128+n through the engine;
		// only a signal this call sent is reported as one (a shell's
		// "exit 143" is an exit).
		if sent != 0 && in.ExitCode == 128+int(sent) {
			res.Code, res.Signal = -1, unix.SignalName(sent)
		}
	}
	if size, err := b.usage(context.WithoutCancel(ctx), bx.id, capBytes); err != nil {
		return nil, err
	} else if size > capBytes {
		return nil, overCap(bx.name, size, capBytes, "after the command")
	}
	return res, nil
}

// execEnded reports whether exec id's first process has ended.
func (b *Backend) execEnded(ctx context.Context, id string) (bool, error) {
	ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	in, err := b.cli.ExecInspect(ictx, id, client.ExecInspectOptions{})
	if err != nil {
		return false, b.engineErr(ctx, "inspecting the command", err)
	}
	return !in.Running, nil
}

// awaitStart waits until exec id has a process (or has ended already).
func (b *Backend) awaitStart(ctx context.Context, id string) error {
	deadline := time.Now().Add(keeperWait)
	for {
		ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
		in, err := b.cli.ExecInspect(ictx, id, client.ExecInspectOptions{})
		cancel()
		if err != nil {
			return b.engineErr(ctx, "inspecting the command", err)
		}
		if in.PID > 0 || (!in.Running && in.ExitCode != 0) || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// ensureRunning restarts bx's container when it is not running (it was
// killed whole to end a command).
func (b *Backend) ensureRunning(ctx context.Context, bx *box, log *slog.Logger) error {
	ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	res, err := b.cli.ContainerInspect(ictx, bx.id, client.ContainerInspectOptions{})
	if err != nil {
		return b.engineErr(ctx, "inspecting the sandbox's container", err)
	}
	if st := res.Container.State; st != nil && st.Running {
		return nil
	}
	log.Info("restarting the sandbox's container")
	return b.startBox(ctx, bx, log)
}

// signal delivers sig to every process of the running command (each
// process of the container but its own two: commands run one at a time).
// When the service does not see them, SIGKILL kills the container whole
// and other signals are not delivered (logged).
func (b *Backend) signal(ctx context.Context, bx *box, sig syscall.Signal, log *slog.Logger) {
	if bx.ns == "" {
		if sig == syscall.SIGKILL {
			b.kill(ctx, bx.id, log)
			return
		}
		log.Warn("signal not delivered: the service does not see the sandbox container's processes", "signal", unix.SignalName(sig))
		return
	}
	for _, pid := range sortedPids(nsProcs(bx.ns, bx.keepers)) {
		sendSignal(pid, bx.ns, sig)
	}
}

// endCommand kills every process of the command (of the container but
// its own), or the container whole when the service does not see them
// or they do not die.
func (b *Backend) endCommand(ctx context.Context, bx *box, log *slog.Logger) {
	if bx.ns != "" {
		for range 50 {
			procs := nsProcs(bx.ns, bx.keepers)
			if len(procs) == 0 {
				return
			}
			for pid := range procs {
				sendSignal(pid, bx.ns, syscall.SIGKILL)
			}
			time.Sleep(5 * time.Millisecond)
		}
		log.Warn("a command's processes outlived SIGKILL; killing the sandbox's container")
	}
	b.kill(ctx, bx.id, log)
}

// initNamespace returns the pid namespace of a container whose init the
// engine reports as pid, when the service sees that process: it must
// be the engine's init (docker-init), so that a pid the engine reports
// from another pid namespace is never taken for one of the service's.
func initNamespace(pid int) (string, bool) {
	cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !strings.HasSuffix(strings.SplitN(string(cmd), "\x00", 2)[0], "docker-init") {
		return "", false
	}
	ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid")
	if err != nil {
		return "", false
	}
	return ns, true
}

// nsProcs returns the processes in pid namespace ns, by pid and start
// time, less those in except (same pid and start time).
func nsProcs(ns string, except map[int]string) map[int]string {
	out := map[int]string{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		if got, err := os.Readlink(dir + "/ns/pid"); err != nil || got != ns {
			continue
		}
		start := startTime(pid)
		if start == "" {
			continue
		}
		if s, ok := except[pid]; ok && s == start {
			continue
		}
		out[pid] = start
	}
	return out
}

// startTime is field 22 of /proc/PID/stat: with the pid, it names one
// process whatever pids are reused.
func startTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// sendSignal sends sig to pid through a pidfd, once the pidfd is known
// to name a process of pid namespace ns (a pid reused by another
// process meanwhile is not signalled).
func sendSignal(pid int, ns string, sig syscall.Signal) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if got, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid"); err != nil || got != ns {
		return
	}
	_ = unix.PidfdSendSignal(fd, sig, nil, 0)
}

// sortedPids returns m's pids, lowest (usually the oldest) first.
func sortedPids(m map[int]string) []int {
	out := make([]int, 0, len(m))
	for pid := range m {
		out = append(out, pid)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// termSize returns terminal f's size.
func termSize(f *os.File) (rows, cols uint16, err error) {
	err = termControl(f, func(fd int) error {
		ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
		if err == nil {
			rows, cols = ws.Row, ws.Col
		}
		return err
	})
	return rows, cols, err
}

// termControl runs fn on f's descriptor without taking it out of f's
// hands.
func termControl(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { ioErr = fn(int(fd)) }); err != nil {
		return err
	}
	return ioErr
}

func ptrTo[T any](v T) *T { return &v }
