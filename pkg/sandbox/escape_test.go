package sandbox_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/secbear/neuron/pkg/sandbox"
)

// The escape tests run this test binary inside the sandbox as a probe
// (probeEnv names what to try) that makes raw system calls and prints
// one "name=result" line each, so that what the kernel answered is
// checked, not what some tool on the host happens to do.

const probeEnv = "NEURON_SANDBOX_PROBE"

// runProbe runs in the sandboxed copy of the test binary.
func runProbe(what string) {
	switch {
	case what == "syscalls":
		probeSyscalls()
	case strings.HasPrefix(what, "connect:"):
		c, err := net.Dial("unix", strings.TrimPrefix(what, "connect:"))
		if err != nil {
			fmt.Println("connect=refused:", err)
			return
		}
		buf := make([]byte, 64)
		n, _ := c.Read(buf)
		fmt.Printf("connect=answered:%s\n", buf[:n])
	case strings.HasPrefix(what, "stat:"):
		for _, p := range strings.Split(strings.TrimPrefix(what, "stat:"), ",") {
			_, err := os.Lstat(p)
			fmt.Printf("%s=%v\n", p, err == nil)
		}
	}
}

// errnoOf turns a raw system call result into "ok" or the errno's name.
func errnoOf(r uintptr, e syscall.Errno) string {
	if e != 0 {
		return unix.ErrnoName(e)
	}
	if int(r) >= 0 {
		unix.Close(int(r))
	}
	return "ok"
}

func probeSyscalls() {
	sock := func(domain, typ int) string {
		r, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(domain), uintptr(typ), 0)
		return errnoOf(r, e)
	}
	raw := func(nr uintptr, a ...uintptr) string {
		a = append(a, 0, 0, 0, 0, 0, 0)
		r, _, e := unix.RawSyscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
		return errnoOf(r, e)
	}
	var clone3Args [11]uint64 // struct clone_args (v2), all zero
	cstr := func(s string) uintptr { p, _ := unix.BytePtrFromString(s); return uintptr(unsafe.Pointer(p)) }
	results := []struct{ name, got string }{
		{"unshare_user", raw(unix.SYS_UNSHARE, unix.CLONE_NEWUSER)},
		{"unshare_net", raw(unix.SYS_UNSHARE, unix.CLONE_NEWNET)},
		{"unshare_mount", raw(unix.SYS_UNSHARE, unix.CLONE_NEWNS)},
		{"clone_newuser", raw(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD))},
		{"clone3", raw(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&clone3Args)), unsafe.Sizeof(clone3Args))},
		{"setns", raw(unix.SYS_SETNS, 0, 0)},
		{"packet_socket", sock(unix.AF_PACKET, unix.SOCK_RAW)},
		{"netlink_socket", sock(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC)},
		{"netlink_dgram", sock(unix.AF_NETLINK, unix.SOCK_DGRAM)},
		{"raw_inet", sock(unix.AF_INET, unix.SOCK_RAW)},
		{"raw_inet6_cloexec", sock(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)},
		{"alg_socket", sock(unix.AF_ALG, unix.SOCK_SEQPACKET)},
		{"mount", raw(unix.SYS_MOUNT, cstr("tmpfs"), cstr(os.TempDir()), cstr("tmpfs"))},
		{"ptrace", raw(unix.SYS_PTRACE, unix.PTRACE_TRACEME)},
		{"bpf", raw(unix.SYS_BPF, 0, 0, 0)},
		{"keyctl", raw(unix.SYS_KEYCTL, 0)},
		{"perf_event_open", raw(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0)},
		{"userfaultfd", raw(unix.SYS_USERFAULTFD, 0)},
		{"io_uring_setup", raw(unix.SYS_IO_URING_SETUP, 1, 0)},
		{"open_by_handle_at", raw(unix.SYS_OPEN_BY_HANDLE_AT, 0, 0, 0)},
		{"tiocsti", raw(unix.SYS_IOCTL, 0, unix.TIOCSTI, 0)},
		// What must keep working.
		{"inet_stream", sock(unix.AF_INET, unix.SOCK_STREAM)},
		{"inet6_dgram", sock(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC)},
		{"unix_stream", sock(unix.AF_UNIX, unix.SOCK_STREAM)},
		{"unshare_files", raw(unix.SYS_UNSHARE, unix.CLONE_FILES)},
	}
	for _, r := range results {
		fmt.Printf("%s=%s\n", r.name, r.got)
	}
}

// probePolicy is a policy that runs this test binary as a probe.
func probePolicy(t *testing.T, what string) (sandbox.Policy, []string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := policy(t)
	p.ReadOnly = []string{exe}
	p.Env = append(sandbox.DefaultEnv(p.Workspace), probeEnv+"="+what)
	return p, []string{exe}
}

// probeLines runs the probe and returns its name=result lines.
func probeLines(t *testing.T, p sandbox.Policy, argv []string) map[string]string {
	t.Helper()
	res := run(t, p, argv...)
	if res.ExitCode != 0 {
		t.Fatalf("probe exit %d signal %q stderr %q", res.ExitCode, res.Signal, res.Stderr)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		out[k] = v
	}
	return out
}

// isolations are the ways a caller runs the sandbox with every
// namespace: as an unprivileged caller would (a user namespace mapping
// the caller's uid), and as root with a dedicated uid (RunAs).
func isolations(t *testing.T) map[string]func(*sandbox.Policy) {
	t.Helper()
	all := sandbox.Namespaces{PID: true, Net: true, IPC: true, UTS: true, Mount: true}
	m := map[string]func(*sandbox.Policy){
		"user namespace": func(p *sandbox.Policy) {
			p.Namespaces = all
			p.Namespaces.User = true
		},
	}
	if os.Geteuid() == 0 {
		m["run as"] = func(p *sandbox.Policy) {
			p.Namespaces = all
			p.RunAs = &sandbox.IDs{UID: 1600000123, GID: 1600000123}
			if err := os.Chown(p.Workspace, 1600000123, 1600000123); err != nil {
				t.Fatal(err)
			}
		}
	}
	return m
}

// The seccomp filter refuses new namespaces, raw, packet, netlink and
// other exotic sockets, mounting, ptrace, bpf, keyrings, perf,
// userfaultfd, io_uring and handle-based opens, in every way the sandbox
// is run, including the plain one (no namespaces) a nested sandbox uses.
func TestSeccompFilter(t *testing.T) {
	requireLandlock(t)
	want := map[string]string{
		"unshare_user": "EPERM", "unshare_net": "EPERM", "unshare_mount": "EPERM",
		"clone_newuser": "EPERM", "clone3": "ENOSYS", "setns": "EPERM",
		"packet_socket": "EAFNOSUPPORT", "netlink_socket": "EAFNOSUPPORT", "netlink_dgram": "EAFNOSUPPORT",
		"raw_inet": "EPERM", "raw_inet6_cloexec": "EPERM", "alg_socket": "EAFNOSUPPORT",
		"mount": "EPERM", "ptrace": "EPERM", "bpf": "EPERM", "keyctl": "EPERM",
		"perf_event_open": "EPERM", "userfaultfd": "EPERM", "io_uring_setup": "EPERM",
		"open_by_handle_at": "EPERM", "tiocsti": "EPERM",
		"inet_stream": "ok", "inet6_dgram": "ok", "unix_stream": "ok", "unshare_files": "ok",
	}
	modes := isolations(t)
	modes["no namespaces"] = func(p *sandbox.Policy) {}
	for name, setup := range modes {
		t.Run(name, func(t *testing.T) {
			p, argv := probePolicy(t, "syscalls")
			setup(&p)
			got := probeLines(t, p, argv)
			for call, w := range want {
				if got[call] != w {
					t.Errorf("%s: got %q, want %q", call, got[call], w)
				}
			}
		})
	}
}

// The private root holds only what is granted: a Unix socket of the
// host (here one in a root-only directory and one in the world-writable
// temp directory, as a Docker engine's or a database's would be) does
// not exist for the child, nor do /proc, /sys, /run, /root or the
// caller's temp files. Without a private root (Landlock ABI below 9
// does not cover Unix-socket connect) the same socket answers, which
// the last case shows.
func TestPrivateRootHidesHostSockets(t *testing.T) {
	requireLandlock(t)
	private := t.TempDir() // 0700, the caller's
	socks := []string{filepath.Join(private, "engine.sock")}
	if f, err := os.CreateTemp("", "neuron-host-*.sock"); err == nil {
		f.Close()
		os.Remove(f.Name())
		socks = append(socks, f.Name())
	}
	for _, path := range socks {
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(path, 0o777)
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("HOST-SOCKET"))
				c.Close()
			}
		}()
	}
	for name, setup := range isolations(t) {
		t.Run(name, func(t *testing.T) {
			for _, sock := range socks {
				p, argv := probePolicy(t, "connect:"+sock)
				setup(&p)
				res := run(t, p, argv...)
				if !strings.Contains(string(res.Stdout), "connect=refused") || strings.Contains(string(res.Stdout), "HOST-SOCKET") {
					t.Errorf("%s: %q %q", sock, res.Stdout, res.Stderr)
				}
			}
			hidden := []string{"/proc/1", "/sys/fs", "/run", "/root", "/var", private, os.TempDir() + "/" + filepath.Base(socks[len(socks)-1])}
			p, argv := probePolicy(t, "stat:"+strings.Join(hidden, ","))
			setup(&p)
			for path, seen := range probeLines(t, p, argv) {
				if seen != "false" {
					t.Errorf("%s exists inside the sandbox", path)
				}
			}
		})
	}
	t.Run("without a private root", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("the control case needs the socket reachable by the sandbox's uid")
		}
		p, argv := probePolicy(t, "connect:"+socks[0])
		p.Namespaces = sandbox.Namespaces{User: true, PID: true, Net: true}
		res := run(t, p, argv...)
		if !strings.Contains(string(res.Stdout), "connect=answered:HOST-SOCKET") {
			t.Skipf("Landlock already refuses the connect on this kernel (ABI 9+): %q", res.Stdout)
		}
	})
}

// A socket granted by path (ReadWrite), as the egress and state sockets
// are, is reachable; only it.
func TestPrivateRootGrantedSocket(t *testing.T) {
	requireLandlock(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "granted.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	os.Chmod(sock, 0o666)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("GRANTED"))
			c.Close()
		}
	}()
	for name, setup := range isolations(t) {
		t.Run(name, func(t *testing.T) {
			p, argv := probePolicy(t, "connect:"+sock)
			setup(&p)
			p.ReadWrite = []string{sock}
			res := run(t, p, argv...)
			if !strings.Contains(string(res.Stdout), "connect=answered:GRANTED") {
				t.Errorf("%q %q", res.Stdout, res.Stderr)
			}
		})
	}
}

// RunAs: the child is the given uid with no capabilities and no
// supplementary groups, so a root-owned file it is granted by Landlock
// is still closed to it by its mode bits; the workspace it owns works.
func TestRunAs(t *testing.T) {
	requireLandlock(t)
	if os.Geteuid() != 0 {
		t.Skip("RunAs needs a root caller")
	}
	secret := filepath.Join(t.TempDir(), "root-only")
	if err := os.WriteFile(secret, []byte("ROOT-ONLY-4471"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := policy(t)
	isolations(t)["run as"](&p)
	p.ReadOnly = []string{secret}
	res := sh(t, p, "id -u; id -g; id -G; cat "+secret+"; echo hi > mine && cat mine")
	if got := string(res.Stdout); got != "1600000123\n1600000123\n1600000123\nhi\n" || strings.Contains(got, "ROOT-ONLY") {
		t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	fi, err := os.Stat(filepath.Join(p.Workspace, "mine"))
	if err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1600000123 {
		t.Errorf("the file the child wrote: %v %+v", err, fi)
	}
	for _, bad := range []*sandbox.IDs{{UID: 0, GID: 5}, {UID: 5, GID: 0}} {
		q := p
		q.RunAs = bad
		if _, err := sandbox.Run(t.Context(), q, []string{"/bin/true"}, nil); err == nil || !strings.Contains(err.Error(), "non-root") {
			t.Errorf("RunAs %+v: %v", bad, err)
		}
	}
	q := p
	q.Namespaces.User = true
	if _, err := sandbox.Run(t.Context(), q, []string{"/bin/true"}, nil); err == nil {
		t.Error("RunAs with a user namespace was accepted")
	}
}

// A descriptor the calling process holds without close-on-exec (as a
// server started with an open secret would) does not reach the child,
// whatever its number.
func TestInheritedDescriptorsClosed(t *testing.T) {
	requireLandlock(t)
	secret := filepath.Join(t.TempDir(), "inherited")
	if err := os.WriteFile(secret, []byte("INHERITED-SECRET-9913"), 0o600); err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, from := range []int{0, 40, 100, 300} {
		fd, err := unix.Open(secret, unix.O_RDONLY, 0) // no O_CLOEXEC
		if err != nil {
			t.Fatal(err)
		}
		if from > 0 { // the lowest free descriptor at or above from; F_DUPFD leaves close-on-exec clear
			n, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD, from)
			unix.Close(fd)
			if err != nil {
				t.Fatal(err)
			}
			fd = n
		}
		fds = append(fds, fd)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	modes := isolations(t)
	modes["no namespaces"] = func(p *sandbox.Policy) {}
	for name, setup := range modes {
		t.Run(name, func(t *testing.T) {
			p := policy(t)
			setup(&p)
			var script strings.Builder
			for _, fd := range fds {
				fmt.Fprintf(&script, "cat <&%d; ", fd)
			}
			script.WriteString("echo done")
			res := run(t, p, "/bin/bash", "-c", script.String())
			if strings.Contains(string(res.Stdout), "INHERITED-SECRET") || !strings.HasSuffix(string(res.Stdout), "done\n") {
				t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
			}
		})
	}
}
