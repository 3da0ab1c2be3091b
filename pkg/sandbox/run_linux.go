package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// waitDelay bounds how long Run waits for the output pipes to close
	// after the command exited and its group was killed (only a process
	// that left the group can keep them open).
	waitDelay = 2 * time.Second
	// reapWait bounds how long Run waits for killed group members to
	// disappear.
	reapWait = 2 * time.Second
)

// Result is the outcome of a command that started.
type Result struct {
	// Stdout and Stderr are the captured output, at most
	// Policy.MaxOutput bytes each.
	Stdout, Stderr []byte
	// StdoutSize and StderrSize are the sizes of the whole output; when
	// larger than len(Stdout) / len(Stderr) the output was truncated.
	StdoutSize, StderrSize int64
	// ExitCode is the exit status, or -1 when the process was killed by
	// a signal.
	ExitCode int
	// Signal names the signal that killed the process ("SIGKILL"), or
	// is empty.
	Signal string
	// TimedOut is set when Policy.Timeout expired and Run killed the
	// process group.
	TimedOut bool
	// Duration is the wall-clock time from start to exit.
	Duration time.Duration
	// CPUTime is the CPU time (user and system) the run used: the
	// process's and the descendants' it waited for (wait4's rusage), or
	// the cgroup's count of every process in it where that is larger
	// and known (CgroupStats.CPUUsage).
	CPUTime time.Duration
	// Cgroup is what the run's control group recorded; nil without
	// Policy.Cgroup.
	Cgroup *CgroupStats
}

// Run runs argv confined by p, feeding it stdin (nil means /dev/null),
// and waits for it. argv[0] without a slash is looked up in the PATH of
// the child's environment.
//
// Run returns an error, and no Result, when the command could not be
// started: invalid policy, unsupported kernel (wrapping ErrUnsupported),
// a missing path or program, a failure to confine. Once the command has
// started, Run returns its Result whatever the exit status; a timeout is
// reported in Result.TimedOut, not as an error. If ctx is done first,
// Run kills the process group and returns the Result together with
// ctx.Err().
//
// Whatever way the command ends, Run kills what is left of its process
// group before returning (see the package documentation).
func Run(ctx context.Context, p Policy, argv []string, stdin io.Reader) (*Result, error) {
	if !mainCalled.Load() {
		return nil, errors.New("sandbox: sandbox.Main was not called first thing in main (or TestMain); refusing to re-execute this binary")
	}
	p, err := p.validate(argv)
	if err != nil {
		return nil, err
	}
	confined := true
	if err := Supported(); err != nil {
		if !p.AllowUnconfined {
			return nil, err
		}
		confined = false
	}
	if confined && p.RestrictNetwork {
		if v, _ := landlockABI(); v < netABI {
			return nil, fmt.Errorf("%w: RestrictNetwork needs Landlock ABI %d, the kernel has %d", ErrUnsupported, netABI, v)
		}
	}
	grants, err := p.grants()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.PrivateTmp {
		dir, err := os.MkdirTemp("", "sandbox-tmp-")
		if err != nil {
			return nil, fmt.Errorf("sandbox: private tmp: %w", err)
		}
		defer os.RemoveAll(dir)
		if p.RunAs != nil {
			if err := os.Chown(dir, int(p.RunAs.UID), int(p.RunAs.GID)); err != nil {
				return nil, fmt.Errorf("sandbox: private tmp: %w", err)
			}
		}
		grants = append(grants, grant{Path: dir, Write: true})
		p.Env = setEnv(p.Env, "TMPDIR", dir)
	}
	if err := p.checkFiles(grants); err != nil {
		return nil, err
	}
	cfg := childConfig{
		Files:           p.Files,
		Argv:            argv,
		Env:             p.Env,
		Dir:             p.Dir,
		Grants:          grants,
		Limits:          p.Limits,
		Confine:         confined,
		RestrictNetwork: p.RestrictNetwork && confined,
		RunAs:           p.RunAs,
	}
	if p.Namespaces.Mount {
		// The mount point of the child's new root: an empty directory
		// of the caller's, covered by a tmpfs in the child's namespace
		// only, removed after the run.
		root, err := os.MkdirTemp("", "sandbox-root-")
		if err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		defer os.Remove(root)
		cfg.Root = root
	}
	for _, f := range p.Files {
		cfg.Grants = append(cfg.Grants, grant{Path: filepath.Clean(f.Path)})
	}
	return run(ctx, p, cfg, stdin)
}

// checkFiles refuses Files that are not absolute, are given twice, or
// would be written into (or over) a granted path, which is the host's.
func (p Policy) checkFiles(grants []grant) error {
	seen := map[string]bool{}
	for _, f := range p.Files {
		path := filepath.Clean(f.Path)
		if !filepath.IsAbs(f.Path) || path == "/" {
			return fmt.Errorf("%w: %q is not an absolute file path", ErrFilePlacement, f.Path)
		}
		if seen[path] {
			return fmt.Errorf("%w: %s is given twice", ErrFilePlacement, path)
		}
		seen[path] = true
		for _, g := range grants {
			if within(path, g.Path) || within(g.Path, path) {
				return fmt.Errorf("%w: %s would cover or lie in %s, which the child is granted from the host", ErrFilePlacement, path, g.Path)
			}
		}
	}
	return nil
}

// within reports whether path is dir or lies beneath it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// grants lists the paths of p for Landlock, checking that the caller's
// own paths exist.
func (p Policy) grants() ([]grant, error) {
	fi, err := os.Stat(p.Workspace)
	if err != nil {
		return nil, fmt.Errorf("sandbox: workspace: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("sandbox: workspace %q is not a directory", p.Workspace)
	}
	gs := []grant{{Path: p.Workspace, Write: true}}
	for _, path := range defaultReadOnly {
		gs = append(gs, grant{Path: path, Optional: true})
	}
	for _, path := range defaultReadWrite {
		gs = append(gs, grant{Path: path, Write: true, Optional: true})
	}
	for _, list := range []struct {
		paths []string
		write bool
	}{{p.ReadOnly, false}, {p.ReadWrite, true}} {
		for _, path := range list.paths {
			if _, err := os.Stat(path); err != nil {
				return nil, fmt.Errorf("sandbox: %w", err)
			}
			gs = append(gs, grant{Path: path, Write: list.write})
		}
	}
	return gs, nil
}

// sysProcAttr is the trampoline's process attributes: its own process
// group, SIGKILL if the calling thread dies, and the namespaces.
func (n Namespaces) sysProcAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if n.User {
		a.Cloneflags |= syscall.CLONE_NEWUSER
		a.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		a.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		a.GidMappingsEnableSetgroups = false
	}
	if n.PID {
		a.Cloneflags |= syscall.CLONE_NEWPID
	}
	if n.Net {
		a.Cloneflags |= syscall.CLONE_NEWNET
	}
	if n.IPC {
		a.Cloneflags |= syscall.CLONE_NEWIPC
	}
	if n.UTS {
		a.Cloneflags |= syscall.CLONE_NEWUTS
	}
	if n.Mount {
		a.Cloneflags |= syscall.CLONE_NEWNS
	}
	return a
}

func run(ctx context.Context, p Policy, cfg childConfig, stdin io.Reader) (*Result, error) {
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	defer cfgR.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		cfgW.Close()
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	defer statusW.Close()

	var cg *cgroup
	if p.Cgroup != nil {
		if cg, err = newCgroup(*p.Cgroup); err != nil {
			cfgR.Close()
			cfgW.Close()
			statusR.Close()
			return nil, err
		}
		defer cg.remove()
	}

	stdout := &capBuffer{max: p.MaxOutput}
	stderr := &capBuffer{max: p.MaxOutput}
	cmd := &exec.Cmd{
		Path:        selfExe(),
		Args:        []string{"sandbox-trampoline"},
		Env:         []string{markerEnv + "=" + markerValue},
		Dir:         p.Dir,
		Stdin:       stdin,
		Stdout:      stdout,
		Stderr:      stderr,
		ExtraFiles:  []*os.File{cfgR, statusW}, // configFD, statusFD
		SysProcAttr: p.Namespaces.sysProcAttr(),
		WaitDelay:   waitDelay,
	}
	if p.Stdout != nil {
		cmd.Stdout = p.Stdout
	}
	if p.Stderr != nil {
		cmd.Stderr = p.Stderr
	}
	if p.Terminal {
		// A new session whose controlling terminal is fd 0 (setsid
		// makes the child its process group's leader as well).
		cmd.SysProcAttr.Setpgid = false
		cmd.SysProcAttr.Setsid = true
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		cfgW.Close()
		statusR.Close()
		return nil, fmt.Errorf("sandbox: start: %w", err)
	}
	cfgR.Close()
	statusW.Close()
	pid := cmd.Process.Pid // also the process group id
	if cg != nil {
		// The trampoline waits for its configuration before it does
		// anything, so it enters the group before the target exists.
		if err := cg.add(pid); err != nil {
			cfgW.Close()
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = cmd.Wait()
			statusR.Close()
			return nil, err
		}
	}

	go func() {
		// A child that died early makes this fail with EPIPE; the
		// status pipe then tells why.
		_ = json.NewEncoder(cfgW).Encode(cfg)
		cfgW.Close()
	}()
	status := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(statusR)
		statusR.Close()
		status <- string(b)
	}()
	exited := make(chan struct{})
	go func() {
		waitExitNoReap(pid)
		close(exited)
	}()

	var timer <-chan time.Time
	if p.Timeout > 0 {
		t := time.NewTimer(p.Timeout)
		defer t.Stop()
		timer = t.C
	}
	res := &Result{}
	var (
		ctxErr error
		ended  syscall.Signal // a default action Run carried out
	)
	for waiting := true; waiting; {
		select {
		case <-exited:
			waiting = false
		case <-timer:
			res.TimedOut = true
			waiting = false
		case <-ctx.Done():
			ctxErr = ctx.Err()
			waiting = false
		case sig := <-p.Signals:
			if signalGroup(pid, sig, p.Namespaces.PID) {
				ended = sig
			}
		}
	}
	// The leader is alive or an unreaped zombie, so pid still names our
	// process group: kill whatever is in it.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-exited
	res.Duration = time.Since(start)
	waitErr := cmd.Wait()
	waitGroupGone(pid)

	if msg := <-status; msg != "" {
		return nil, fmt.Errorf("sandbox: %s", msg)
	}
	var ee *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &ee) && !errors.Is(waitErr, exec.ErrWaitDelay) {
		return nil, fmt.Errorf("sandbox: %w", waitErr)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru != nil {
		res.CPUTime = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if cg != nil {
		st := cg.stats()
		res.Cgroup = &st
		res.CPUTime = max(res.CPUTime, st.CPUUsage)
	}
	res.Stdout, res.StdoutSize = stdout.buf, stdout.n
	res.Stderr, res.StderrSize = stderr.buf, stderr.n
	res.ExitCode = cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		res.Signal = unix.SignalName(ws.Signal())
		if ended != 0 && ws.Signal() == syscall.SIGKILL {
			res.Signal = unix.SignalName(ended)
		}
	}
	if ctxErr != nil {
		return res, ctxErr
	}
	return res, nil
}

// signalGroup sends sig to process group pgid, whose leader is the init
// process of its own pid namespace when nsInit. Such a leader ignores a
// signal it has no handler for; when sig would have ended it by default
// (and it does not ignore sig), signalGroup ends the group with SIGKILL
// instead and reports true.
func signalGroup(pgid int, sig syscall.Signal, nsInit bool) bool {
	_ = syscall.Kill(-pgid, sig)
	switch sig {
	case syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2:
	default:
		return false
	}
	if !nsInit {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pgid) + "/status")
	if err != nil {
		return false
	}
	bit := uint64(1) << (uint(sig) - 1)
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "SigCgt" && k != "SigIgn") {
			continue
		}
		if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil || mask&bit != 0 {
			return false // handled or ignored (or unreadable): the signal stands
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return true
}

// selfExe is the running binary for the trampoline: /proc/self/exe, or,
// inside a sandbox whose private root has no /proc, the path Main found.
func selfExe() string {
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		return "/proc/self/exe"
	}
	return selfPath
}

// waitExitNoReap blocks until process pid has exited, leaving it a
// zombie for cmd.Wait to reap.
func waitExitNoReap(pid int) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// waitGroupGone waits, at most reapWait, until no live process is left in
// process group pgid. Members killed after their parent died are
// reparented and may linger as zombies until init reaps them; zombies are
// harmless and do not count.
func waitGroupGone(pgid int) {
	deadline := time.Now().Add(reapWait)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) || !liveMembers(pgid) {
			return
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(delay)
	}
}

// liveMembers reports whether /proc shows a process in group pgid that
// is not a zombie. When /proc cannot be read it answers true.
func liveMembers(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// Fields after the parenthesised command: state ppid pgrp ...
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			return true
		}
	}
	return false
}

// capBuffer keeps the first max bytes written to it and counts them all.
// os/exec writes to it from one goroutine and Wait orders that before
// the reads.
type capBuffer struct {
	max int
	buf []byte
	n   int64
}

func (c *capBuffer) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	if room := c.max - len(c.buf); room > 0 {
		c.buf = append(c.buf, b[:min(room, len(b))]...)
	}
	return len(b), nil
}
