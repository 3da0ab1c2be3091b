// Package sandbox runs one subprocess confined by the Linux kernel: a
// Landlock filesystem ruleset (a read-write workspace plus read-only
// system paths, nothing else), a seccomp filter (no new namespaces, no
// raw, packet or netlink sockets, no mount, ptrace, bpf, keyctl,
// perf_event_open, userfaultfd, io_uring, ...; see seccomp_linux.go), no
// inherited descriptor above stderr, an environment given in full by the
// caller (nothing is inherited), resource limits, a wall-clock timeout
// that kills the whole process group, capped output capture and,
// optionally, fresh user, pid, network, IPC and UTS namespaces, a private
// root holding only what is granted (Namespaces.Mount: no host socket,
// /proc, /sys or /run exists for the child) and an unprivileged identity
// of its own (RunAs).
//
// # Trampoline
//
// Landlock confines the process that enables it and everything it starts,
// forever, so it must never be enabled in the calling server. Run
// therefore re-executes the running binary (/proc/self/exe) as a short-lived
// trampoline: the policy travels to it as JSON over an inherited pipe (not
// in its environment), and Main, which the program calls first thing in
// main, sees the marker, applies to itself Landlock, PR_SET_NO_NEW_PRIVS,
// the setrlimit limits and an empty capability set (bounding, ambient,
// inheritable, permitted, effective: a command run by a root server has
// no capabilities, so it cannot load modules, open raw sockets or
// reconfigure the network), and then execve's the target with exactly
// Policy.Env. A setup failure (bad path, Landlock error, target not found)
// comes back over a close-on-exec status pipe and makes Run return an
// error, so a command that never started is never mistaken for one that
// failed.
//
// Every binary that calls Run — and every test binary, through TestMain —
// must therefore start with:
//
//	func main() {
//		sandbox.Main()
//		...
//	}
//
//	func TestMain(m *testing.M) {
//		sandbox.Main()
//		os.Exit(m.Run())
//	}
//
// Run refuses to start anything if Main has not been called. Run is safe
// for concurrent use.
//
// # Failing closed
//
// Run fails with an error wrapping ErrUnsupported when the kernel cannot
// enforce the policy (no Landlock, or a Landlock ABI older than 3, or no
// network restriction when RestrictNetwork asks for it). Policy.AllowUnconfined
// turns the missing-Landlock case into an unconfined run; it exists for
// development machines only.
//
// # Process lifetime
//
// The child leads its own process group. When it exits, when the timeout
// fires or when ctx is cancelled, Run sends SIGKILL to the whole group
// (while the leader is still an unreaped zombie, so the group id cannot
// have been reused), reaps the leader and waits, for a bounded time, until
// no member of the group is left. Background jobs therefore never outlive
// Run. A process that leaves the group (setsid, setpgid) escapes this
// clean-up unless Namespaces.PID is set: the command is then pid 1 of its
// own pid namespace and the kernel kills every process in the namespace
// when it exits. If the calling process dies, the kernel sends SIGKILL to
// the leader (Pdeathsig); the rest of the group then survives unless
// Namespaces.PID is set.
//
// # What the sandbox does not cover
//
// With the Landlock ABI of Linux 6.18 (ABI 7), connect(2) on pathname UNIX
// sockets is not restricted by Landlock (ABI 9 adds that, and is used
// where the kernel has it): use Namespaces.Mount, in whose root no socket
// of the host exists unless granted. UDP is not restricted by
// RestrictNetwork (ABI 10), and RLIMIT_NPROC is ignored for root (use
// RunAs). Use Namespaces.Net for real network isolation and
// Namespaces.PID to bound the process tree. /proc is not granted by
// default: as root it would let the child read every process's
// environment, including the server's. A sandbox started inside another
// one (the operator's bash tool inside the environment's sandbox) cannot
// create namespaces (the outer filter refuses them): it runs with none,
// under the outer sandbox's, and adds its own Landlock ruleset, filter
// and limits.
package sandbox
