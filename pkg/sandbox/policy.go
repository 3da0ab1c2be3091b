package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// DefaultMaxOutput is the cap on captured stdout, and separately on
// stderr, when Policy.MaxOutput is zero.
const DefaultMaxOutput = 1 << 20

// Policy says what a sandboxed process may do. The zero value of every
// field but Workspace is usable.
type Policy struct {
	// Workspace is the directory tree the child may read and write. It
	// must be an absolute path to an existing directory other than "/".
	Workspace string

	// ReadOnly lists extra files or directory trees the child may read
	// (and execute). They must exist. They add to the defaults that are
	// always granted: /usr, /bin, /sbin, /lib*, a short list of files in
	// /etc that programs need (the loader cache, users and groups, name
	// resolution, time zone, CA certificates; not /etc as a whole, where
	// /etc/shadow and private keys live), /dev/random and /dev/urandom,
	// and read-write /dev/null, /dev/zero and /dev/full. $HOME and /proc
	// are never granted by default.
	ReadOnly []string
	// ReadWrite lists extra files or directory trees the child may read
	// and write (e.g. a cache directory). They must exist.
	ReadWrite []string

	// Env is the child's entire environment, as KEY=VALUE entries:
	// nothing is inherited from the calling process. Nil means
	// DefaultEnv(Workspace); a non-nil empty slice means an empty
	// environment.
	Env []string

	// Dir is the child's working directory; relative paths are taken
	// relative to Workspace. Empty means Workspace.
	Dir string

	// Limits are resource limits set with setrlimit in the child.
	Limits Limits

	// Timeout bounds the run by wall clock; when it expires the whole
	// process group is killed with SIGKILL and Result.TimedOut is set.
	// Zero means no limit other than the context passed to Run.
	Timeout time.Duration

	// MaxOutput caps the captured bytes of stdout, and separately of
	// stderr. Bytes past the cap are read and discarded but counted in
	// Result.StdoutSize / StderrSize. Zero means DefaultMaxOutput.
	MaxOutput int

	// Stdout and Stderr, when set, receive the child's output as it is
	// written instead of having it captured: Result.Stdout, Stderr and
	// their sizes stay empty, and MaxOutput does not apply. An *os.File
	// (the write end of a pipe, a pseudo-terminal) is handed to the child
	// as it is, so nothing sits between the two: a reader that falls
	// behind makes the child's writes block, and what it has written is
	// still in the file when Run returns. Any other writer is fed by a
	// goroutine that Run stops waiting for two seconds after the child
	// ended.
	Stdout, Stderr io.Writer

	// Terminal says that the stdin given to Run is the follower end of a
	// pseudo-terminal (an *os.File): the child starts a new session with
	// it as its controlling terminal, instead of only a new process
	// group. Its process group id is still its pid.
	Terminal bool

	// Signals delivers signals to the child's whole process group while
	// it runs. With Namespaces.PID the child is the init process of its
	// namespace, which the kernel shields from every signal it installed
	// no handler for (SIGKILL aside): a signal whose default action ends
	// a process (SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2) that
	// the child neither catches nor ignores ends the group as that action
	// would, and Result.Signal names it.
	Signals <-chan syscall.Signal

	// PrivateTmp makes Run create an empty directory under os.TempDir(),
	// grant it read-write, set TMPDIR to it in the child environment
	// (replacing any TMPDIR in Env) and remove it after the run.
	PrivateTmp bool

	// RestrictNetwork makes Landlock deny TCP bind(2) and connect(2)
	// (Landlock ABI 4+; UDP too from ABI 10). Run fails when the kernel
	// cannot enforce it. For complete isolation use Namespaces.Net.
	RestrictNetwork bool

	// Namespaces puts the child in new Linux namespaces.
	Namespaces Namespaces

	// Files are placed read-only (mode 0400, owned by the child) at
	// absolute paths that only the child sees, for credentials a program
	// expects in a file. They need Namespaces.Mount: they are written
	// into the child's private root, never on the host. Run refuses a
	// path that is, holds or lies under a granted path (writing it would
	// reach the host's file), and a path given twice.
	Files []File

	// RunAs runs the child as this uid and gid on the host, with no
	// supplementary groups, instead of the caller's: an identity that
	// owns nothing on the host, so that what the mount namespace and
	// Landlock let it see it can still only use by its mode bits. The
	// caller must be root (it sets up the namespaces as root and then
	// switches), must not set Namespaces.User, and must make the
	// workspace and ReadWrite paths writable by it (Run does so for the
	// PrivateTmp directory and for Files). RLIMIT_NPROC, ignored for
	// root, then applies: pick an identity per run for a per-run count.
	RunAs *IDs

	// Cgroup, when set, puts the whole process tree in a fresh control
	// group with these limits (see Cgroup). Run fails with an error
	// wrapping ErrUnsupported when no cgroup can be created here.
	Cgroup *Cgroup

	// AllowUnconfined lets Run go ahead without Landlock when the kernel
	// does not support it at all; the other protections (environment,
	// limits, capabilities, timeout, namespaces) still apply, but
	// RestrictNetwork does not. For development machines only:
	// never set it in production, where the missing kernel feature must
	// be a hard error.
	AllowUnconfined bool
}

// Limits are setrlimit(2) limits of the child, set as both the soft and
// the hard limit so the child cannot raise them (RLIMIT_CPU's hard limit
// is one second above the soft one). Zero leaves a limit as inherited
// from the calling process.
type Limits struct {
	// CPUSeconds is RLIMIT_CPU: after this much CPU time the child
	// gets SIGXCPU, one second later SIGKILL.
	CPUSeconds uint64
	// AddressSpaceBytes is RLIMIT_AS, the size of the virtual address
	// space. Runtimes that reserve large address ranges up front (Go,
	// the JVM, V8) need generous values.
	AddressSpaceBytes uint64
	// OpenFiles is RLIMIT_NOFILE, one more than the highest file
	// descriptor number the child may open.
	OpenFiles uint64
	// FileSizeBytes is RLIMIT_FSIZE: a write past this size fails and the
	// writer gets SIGXFSZ.
	FileSizeBytes uint64
	// Processes is RLIMIT_NPROC, counted per user across the whole
	// system, not per sandbox. The kernel ignores it when the child's
	// uid is 0 on the host, which is the case for a server running as
	// root, with or without Namespaces.User (it maps the child's root to
	// the caller's uid). Such a server must bound the process tree
	// another way: Namespaces.PID (one kill ends it) plus the timeout.
	Processes uint64
}

// DefaultLimits are modest limits suited to running shell commands: 1024
// open files and 1 GiB per written file. They leave CPU time, address
// space and processes unlimited (the wall-clock timeout bounds a run).
func DefaultLimits() Limits {
	return Limits{OpenFiles: 1024, FileSizeBytes: 1 << 30}
}

// Cgroup limits bound the whole process tree of a run, which setrlimit
// cannot: RLIMIT_AS is per process and RLIMIT_NPROC per user (and
// ignored for root). With Policy.Cgroup set, Run creates a fresh control
// group for the run, below the caller's own, moves the child into it
// before the target starts (every descendant inherits it), reads its
// statistics when the run ends and removes it. The child cannot leave
// it: /sys is never granted by Landlock.
//
// Both cgroup v1 (memory and pids controllers) and v2 (a unified
// hierarchy whose parent group delegates memory and pids) are used.
type Cgroup struct {
	// MemoryBytes caps the memory (and, where the kernel accounts it,
	// memory plus swap) of the whole tree; the kernel's OOM killer
	// kills a process of the tree when it is reached. Zero: no cap.
	MemoryBytes int64
	// Pids caps the number of live processes and threads of the tree;
	// fork and clone fail with EAGAIN past it. Zero: no cap.
	Pids int64
	// CPUMillis caps the tree's CPU bandwidth in thousandths of a core
	// (1500 = one and a half cores), enforced by the CFS quota: the tree
	// is throttled, not killed. Zero: no cap.
	CPUMillis int64
}

// CgroupStats are what a run's cgroup recorded.
type CgroupStats struct {
	// PeakMemoryBytes is the tree's peak memory use.
	PeakMemoryBytes int64
	// OOMKills counts processes killed by the memory cap.
	OOMKills int64
	// MemoryLimitHits counts allocations that hit the memory cap.
	MemoryLimitHits int64
	// PidsLimitHits counts forks refused by the pids cap.
	PidsLimitHits int64
	// CPUThrottled counts the periods in which the CPU cap throttled
	// the tree.
	CPUThrottled int64
	// CPUUsage is the CPU time of every process of the tree: cgroup v2's
	// cpu.stat usage_usec, or cgroup v1's cpuacct.usage where cpuacct is
	// mounted with the cpu controller and a CPU cap made a cpu group
	// (else 0: unknown; Result.CPUTime then has wait4's count).
	CPUUsage time.Duration
}

// IDs are a host uid and gid.
type IDs struct {
	UID, GID uint32
}

// File is a file placed in the child's private view of the filesystem.
type File struct {
	// Path is where the child finds it, absolute.
	Path string
	// Data is its content.
	Data []byte
}

// Namespaces selects new Linux namespaces for the child. As root every
// combination works; an unprivileged caller must also set User.
type Namespaces struct {
	// User runs the child in a new user namespace as uid and gid 0,
	// mapped to the caller's uid and gid; setgroups is disabled.
	User bool
	// PID makes the child pid 1 of a new pid namespace. When it exits
	// the kernel kills every other process in the namespace. /proc is
	// not remounted (it is not granted by default anyway).
	PID bool
	// Net gives the child a new network namespace containing only a
	// loopback interface, which is down.
	Net bool
	// IPC gives the child new System V IPC and POSIX message queues.
	IPC bool
	// UTS gives the child its own hostname and domain name.
	UTS bool
	// Mount gives the child a private mount namespace whose root is a
	// fresh, read-only tmpfs holding only what the policy grants: each
	// granted path (the defaults, ReadOnly, ReadWrite, the workspace,
	// the private tmp directory) bind-mounted at its own path, read-only
	// unless granted for writing, nosuid, and nodev outside /dev; and
	// Files. Nothing else of the host exists for the child: no /proc,
	// no /sys, no /run, no home directories, and no Unix socket but
	// those granted by path (so a socket beside the workspace, such as
	// an egress or state socket, is reachable only when listed in
	// ReadWrite). It needs root, or User.
	Mount bool
}

// defaultReadOnly are the paths every sandboxed process may read and
// execute (see Policy.ReadOnly). Missing ones are skipped.
var defaultReadOnly = []string{
	"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
	"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.preload",
	"/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
	"/etc/hosts", "/etc/host.conf", "/etc/resolv.conf", "/etc/gai.conf",
	"/etc/services", "/etc/protocols",
	"/etc/localtime", "/etc/timezone",
	"/etc/ssl/certs", "/etc/ssl/openssl.cnf", "/etc/ca-certificates",
	"/etc/alternatives", "/etc/mime.types", "/etc/os-release", "/etc/gitconfig",
	"/dev/random", "/dev/urandom",
}

// defaultReadWrite are devices every sandboxed process may read and
// write. Missing ones are skipped.
var defaultReadWrite = []string{"/dev/null", "/dev/zero", "/dev/full"}

// DefaultEnv is a minimal environment for a child working in workspace:
// a system PATH, HOME and TMPDIR set to the workspace, and a UTF-8
// locale.
func DefaultEnv(workspace string) []string {
	return []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=" + workspace,
		"TMPDIR=" + workspace,
		"LANG=C.UTF-8",
	}
}

// ErrFilePlacement is wrapped by the errors of Run when a Policy.Files
// path cannot be placed (see Policy.Files).
var ErrFilePlacement = errors.New("sandbox: cannot place the file")

// markerEnv marks a trampoline invocation of the binary; see Main.
const (
	markerEnv   = "NEURON_SANDBOX_TRAMPOLINE"
	markerValue = "1"
)

// validate checks p and argv and returns a copy with defaults filled in.
func (p Policy) validate(argv []string) (Policy, error) {
	if len(argv) == 0 || argv[0] == "" {
		return p, errors.New("sandbox: empty argv")
	}
	if p.Workspace == "" || !filepath.IsAbs(p.Workspace) {
		return p, fmt.Errorf("sandbox: workspace %q must be an absolute path", p.Workspace)
	}
	p.Workspace = filepath.Clean(p.Workspace)
	if p.Workspace == "/" {
		return p, errors.New(`sandbox: workspace must not be "/"`)
	}
	switch {
	case p.Dir == "":
		p.Dir = p.Workspace
	case !filepath.IsAbs(p.Dir):
		p.Dir = filepath.Join(p.Workspace, p.Dir)
	}
	for _, list := range [][]string{p.ReadOnly, p.ReadWrite} {
		for _, path := range list {
			if !filepath.IsAbs(path) {
				return p, fmt.Errorf("sandbox: path %q must be absolute", path)
			}
		}
	}
	if p.Env == nil {
		p.Env = DefaultEnv(p.Workspace)
	}
	p.Env = append([]string(nil), p.Env...)
	for _, kv := range p.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return p, fmt.Errorf("sandbox: environment entry %q is not KEY=VALUE", kv)
		}
		if k == markerEnv {
			return p, fmt.Errorf("sandbox: environment must not contain %s", markerEnv)
		}
	}
	if p.MaxOutput < 0 {
		return p, fmt.Errorf("sandbox: negative MaxOutput %d", p.MaxOutput)
	}
	if p.MaxOutput == 0 {
		p.MaxOutput = DefaultMaxOutput
	}
	if p.Timeout < 0 {
		return p, fmt.Errorf("sandbox: negative Timeout %v", p.Timeout)
	}
	if p.RunAs != nil {
		switch {
		case p.RunAs.UID == 0 || p.RunAs.GID == 0:
			return p, errors.New("sandbox: RunAs must name a non-root uid and gid")
		case p.Namespaces.User:
			return p, errors.New("sandbox: RunAs and Namespaces.User exclude each other (with a user namespace the child runs as the caller's uid)")
		case os.Geteuid() != 0:
			return p, errors.New("sandbox: RunAs needs a root caller")
		}
	}
	if p.Terminal {
		if f, ok := p.Stdout.(*os.File); !ok || f == nil {
			return p, errors.New("sandbox: Terminal needs the pseudo-terminal's follower end as Stdout (and as stdin and Stderr)")
		}
	}
	if len(p.Files) > 0 && !p.Namespaces.Mount {
		return p, fmt.Errorf("%w: Policy.Files needs Namespaces.Mount (a private root)", ErrFilePlacement)
	}
	return p, nil
}

// setEnv returns env with key set to value, replacing earlier entries.
func setEnv(env []string, key, value string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k != key {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+value)
}
