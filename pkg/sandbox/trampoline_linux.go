package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// File descriptors the trampoline inherits (os/exec ExtraFiles start
// at 3).
const (
	configFD = 3 // read end of a pipe carrying the childConfig as JSON
	statusFD = 4 // close-on-exec write end: a setup error, or EOF on exec
)

// exitSetupFailed is the trampoline's exit code when it could not start
// the target; Run reports the message from the status pipe instead.
const exitSetupFailed = 125

// childConfig is what Run sends to the trampoline.
type childConfig struct {
	Argv            []string `json:"argv"`
	Env             []string `json:"env"`
	Dir             string   `json:"dir"`
	Grants          []grant  `json:"grants"`
	Limits          Limits   `json:"limits"`
	Confine         bool     `json:"confine"`
	RestrictNetwork bool     `json:"restrict_network,omitempty"`
	// Root, with Namespaces.Mount, is the empty directory on which the
	// child's new root is built (see newRoot); Files are written there.
	Root  string `json:"root,omitempty"`
	Files []File `json:"files,omitempty"`
	// RunAs is the identity the target runs as (Policy.RunAs).
	RunAs *IDs `json:"run_as,omitempty"`
}

// selfPath is this binary's path, found by Main, for when /proc is
// missing (see selfExe).
var selfPath string

// mainCalled records that Main ran (and was not a trampoline); Run
// refuses to re-execute a binary that would not recognise the marker.
var mainCalled atomic.Bool

// Main must be the first statement of main() in every binary that calls
// Run, and of TestMain in every test binary that does. In a normal
// invocation it returns at once. In a trampoline invocation started by
// Run it confines the process and replaces it with the target command,
// never returning; on failure it reports the error to Run and exits.
func Main() {
	if os.Getenv(markerEnv) != markerValue {
		if exe, err := os.Executable(); err == nil {
			selfPath = exe
		} else if filepath.IsAbs(os.Args[0]) {
			selfPath = os.Args[0] // no /proc: started by path inside a sandbox
		}
		mainCalled.Store(true)
		return
	}
	trampoline()
}

// trampoline runs in the child: the private root (Namespaces.Mount),
// Landlock, no capabilities, the identity switch (RunAs),
// no_new_privs, limits, close-on-exec for every inherited descriptor,
// the seccomp filter, then execve with exactly the policy's environment.
// All of it happens on one locked OS thread, the one that calls execve,
// so the per-thread attributes (credentials, no_new_privs, Landlock,
// seccomp) carry over.
func trampoline() {
	runtime.LockOSThread()
	// Started by hand with the marker set, fds 3 and 4 are not our
	// pipes: do not write into whatever they are.
	for _, fd := range []int{configFD, statusFD} {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			fmt.Fprintf(os.Stderr, "%s is set but this process was not started by sandbox.Run\n", markerEnv)
			os.Exit(exitSetupFailed)
		}
	}
	status := os.NewFile(statusFD, "sandbox-status")
	fail := func(format string, args ...any) {
		fmt.Fprintf(status, format, args...)
		os.Exit(exitSetupFailed)
	}
	if _, err := unix.FcntlInt(statusFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		fail("status pipe: %v", err)
	}

	var c childConfig
	cf := os.NewFile(configFD, "sandbox-config")
	err := json.NewDecoder(cf).Decode(&c)
	cf.Close()
	if err != nil {
		fail("reading configuration: %v", err)
	}
	if len(c.Argv) == 0 {
		fail("empty argv")
	}

	if c.Root != "" {
		if err := newRoot(c); err != nil {
			fail("building the private root: %v", err)
		}
	}
	path, err := lookPath(c.Argv[0], c.Env)
	if err != nil {
		fail("%v", err)
	}
	if c.Confine {
		if err := confine(c.Grants, c.RestrictNetwork); err != nil {
			fail("landlock: %v", err)
		}
	}
	// Capabilities go in two steps around the identity switch: the
	// bounding set needs CAP_SETPCAP, the switch CAP_SETUID/SETGID.
	if err := dropBoundingSet(); err != nil {
		fail("%v", err)
	}
	if c.RunAs != nil {
		if err := switchIDs(*c.RunAs); err != nil {
			fail("%v", err)
		}
	}
	if err := clearCapabilities(); err != nil {
		fail("%v", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fail("prctl(PR_SET_NO_NEW_PRIVS): %v", err)
	}
	if err := setLimits(c.Limits); err != nil {
		fail("%v", err)
	}
	// Descriptors the caller's process inherited without close-on-exec
	// (a server started with an fd open on a secret) must not reach the
	// target: mark every descriptor above stderr close-on-exec. The
	// status pipe already is, so a failure below still reports.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		fail("close_range: %v", err)
	}
	// Last, so that the setup above is not subject to it.
	if err := installSeccomp(); err != nil {
		fail("seccomp: %v", err)
	}
	err = syscall.Exec(path, c.Argv, c.Env)
	fail("exec %s: %v", c.Argv[0], err)
}

// setLimits sets the non-zero limits, soft and hard. It uses
// syscall.Setrlimit (not x/sys/unix) so that a set RLIMIT_NOFILE is not
// undone by the Go runtime's restore-on-exec.
func setLimits(l Limits) error {
	set := func(name string, resource int, soft, hard uint64) error {
		if soft == 0 {
			return nil
		}
		if err := syscall.Setrlimit(resource, &syscall.Rlimit{Cur: soft, Max: hard}); err != nil {
			return fmt.Errorf("setrlimit(%s, %d): %v", name, soft, err)
		}
		return nil
	}
	return errors.Join(
		// The extra second of hard limit turns the kill into SIGXCPU
		// first, which tells the cause apart from a timeout's SIGKILL.
		set("RLIMIT_CPU", unix.RLIMIT_CPU, l.CPUSeconds, l.CPUSeconds+1),
		set("RLIMIT_AS", unix.RLIMIT_AS, l.AddressSpaceBytes, l.AddressSpaceBytes),
		set("RLIMIT_NOFILE", unix.RLIMIT_NOFILE, l.OpenFiles, l.OpenFiles),
		set("RLIMIT_FSIZE", unix.RLIMIT_FSIZE, l.FileSizeBytes, l.FileSizeBytes),
		set("RLIMIT_NPROC", unix.RLIMIT_NPROC, l.Processes, l.Processes),
	)
}

// dropBoundingSet empties the bounding set, so that nothing the target
// executes can gain a capability. Without CAP_SETPCAP (an unprivileged
// caller) it cannot be changed, but then there is nothing to drop.
func dropBoundingSet() error {
	for c := 0; c <= 63; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			return nil // past the last capability the kernel knows
		}
		if errors.Is(err, unix.EPERM) {
			return nil // no CAP_SETPCAP
		}
		if err != nil {
			return fmt.Errorf("prctl(PR_CAPBSET_DROP, %d): %v", c, err)
		}
	}
	return nil
}

// clearCapabilities empties the ambient, inheritable, permitted and
// effective sets of the calling thread, so that the target, even when
// it runs as uid 0, has no capabilities (no module loading, raw
// sockets, network reconfiguration, DAC override, ...).
func clearCapabilities() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("prctl(PR_CAP_AMBIENT_CLEAR_ALL): %v", err)
	}
	var data [2]unix.CapUserData
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %v", err)
	}
	return nil
}

// switchIDs makes the calling thread, which execve then carries over,
// run as ids with no supplementary groups. Raw system calls, because
// the Go runtime's setuid family changes every thread, and only this
// one matters. Leaving uid 0 clears the permitted and effective
// capability sets.
func switchIDs(ids IDs) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return fmt.Errorf("setgroups: %v", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(ids.GID), uintptr(ids.GID), uintptr(ids.GID)); e != 0 {
		return fmt.Errorf("setresgid(%d): %v", ids.GID, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(ids.UID), uintptr(ids.UID), uintptr(ids.UID)); e != 0 {
		return fmt.Errorf("setresuid(%d): %v", ids.UID, e)
	}
	return nil
}

// lookPath resolves file like execvp, with the PATH of the child's
// environment (not the caller's).
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec %s: executable file not found in PATH %q", file, path)
}
