package sandbox

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Landlock is driven with raw system calls on the one locked OS thread
// that then calls execve, and not through go-landlock: on ABI < 8
// go-landlock enforces on all threads through libpsx, which (with cgo)
// finds the threads in /proc/<getpid()>/task and so hangs inside a new
// pid namespace, where getpid() is 1 and /proc is the parent's. Per-thread
// enforcement is enough here: execve replaces the whole process with the
// calling thread's credentials, Landlock domain and no_new_privs
// included, and nothing but the Go runtime runs on the other threads
// before that.

// ErrUnsupported is wrapped by the errors of Supported and Run when the
// kernel cannot enforce a policy.
var ErrUnsupported = errors.New("sandbox: the kernel cannot enforce the sandbox")

// minABI is the oldest Landlock ABI accepted: ABI 3 (Linux 6.2) is the
// first to restrict truncate(2), without which a confined process could
// still empty any file it can name.
const minABI = 3

// netABI is the first Landlock ABI that restricts TCP.
const netABI = 4

// Landlock rights newer than x/sys/unix knows.
const (
	accessFSResolveUnix       = 1 << 16 // ABI 9
	accessNetBindUDP          = 1 << 2  // ABI 10
	accessNetConnectSendUDP   = 1 << 3  // ABI 10
	erratumSignalScopeThreads = 1 << 1  // erratum 2 of ABI 6
)

// Access rights granted on paths.
const (
	// rightsRead lets the child read, list and execute.
	rightsRead = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	// rightsWrite is every write right except creating device nodes (a
	// block device in the workspace would expose a raw disk) and ioctl
	// on devices. It includes connecting to the UNIX sockets beneath a
	// write grant (ABI 9): sockets elsewhere, read-only system paths
	// included, are refused.
	rightsWrite = unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_REMOVE_DIR |
		unix.LANDLOCK_ACCESS_FS_REMOVE_FILE | unix.LANDLOCK_ACCESS_FS_MAKE_DIR |
		unix.LANDLOCK_ACCESS_FS_MAKE_REG | unix.LANDLOCK_ACCESS_FS_MAKE_SOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_SYM |
		unix.LANDLOCK_ACCESS_FS_REFER | unix.LANDLOCK_ACCESS_FS_TRUNCATE | accessFSResolveUnix
	// rightsFile are the rights the kernel accepts on a non-directory.
	rightsFile = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE |
		unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE |
		unix.LANDLOCK_ACCESS_FS_IOCTL_DEV | accessFSResolveUnix
)

// landlockABI returns the kernel's Landlock ABI version.
func landlockABI() (int, error) {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0, errno
	}
	return int(v), nil
}

// landlockErrata returns the bitmask of fixed Landlock errata.
func landlockErrata() uint64 {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_ERRATA)
	if errno != 0 {
		return 0
	}
	return uint64(v)
}

// Supported reports whether this kernel can confine a child with
// Landlock: nil when it can, otherwise an error wrapping ErrUnsupported
// that says why. It does not confine anything.
func Supported() error {
	v, err := landlockABI()
	if err != nil {
		return fmt.Errorf("%w: Landlock is not available (%v); it needs Linux 6.2+ built with CONFIG_SECURITY_LANDLOCK, landlock in the lsm= boot parameter, and no seccomp filter blocking its system calls", ErrUnsupported, err)
	}
	if v < minABI {
		return fmt.Errorf("%w: Landlock ABI %d is older than the required ABI %d (Linux 6.2)", ErrUnsupported, v, minABI)
	}
	return nil
}

// grant is one path the child may access.
type grant struct {
	Path  string `json:"path"`
	Write bool   `json:"write,omitempty"`
	// Optional grants are skipped when the path does not exist.
	Optional bool `json:"optional,omitempty"`
}

// handled returns the ruleset attributes for ABI abi: every filesystem
// right the kernel knows, TCP (and from ABI 10 UDP) when restrictNetwork,
// and the IPC scopes: abstract UNIX sockets and signals to processes
// outside the sandbox (ABI 6; signals only once erratum 2 is fixed, as
// before it threads of one sandboxed process could not signal each
// other).
func handled(abi int, errata uint64, restrictNetwork bool) unix.LandlockRulesetAttr {
	var a unix.LandlockRulesetAttr
	a.Access_fs = 1<<13 - 1 // ABI 1: EXECUTE ... MAKE_SYM
	if abi >= 2 {
		a.Access_fs |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		a.Access_fs |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 5 {
		a.Access_fs |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	if abi >= 9 {
		a.Access_fs |= accessFSResolveUnix
	}
	if restrictNetwork && abi >= 4 {
		a.Access_net = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
		if abi >= 10 {
			a.Access_net |= accessNetBindUDP | accessNetConnectSendUDP
		}
	}
	if abi >= 6 {
		a.Scoped = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
		if errata&erratumSignalScopeThreads != 0 {
			a.Scoped |= unix.LANDLOCK_SCOPE_SIGNAL
		}
	}
	return a
}

// confine enables Landlock on the calling thread, which must be locked
// to its goroutine and must be the one that calls execve, and sets its
// no_new_privs bit. Only the grants are accessible afterwards.
func confine(grants []grant, restrictNetwork bool) error {
	abi, err := landlockABI()
	if err != nil || abi < minABI {
		return Supported()
	}
	if restrictNetwork && abi < netABI {
		return fmt.Errorf("%w: network restriction needs Landlock ABI %d, the kernel has %d", ErrUnsupported, netABI, abi)
	}
	attr := handled(abi, landlockErrata(), restrictNetwork)
	rfd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("landlock_create_ruleset: %v", errno)
	}
	defer unix.Close(int(rfd))
	for _, g := range grants {
		if err := addRule(int(rfd), g, attr.Access_fs); err != nil {
			return err
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %v", err)
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rfd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_restrict_self: %v", errno)
	}
	return nil
}

// addRule allows g's rights beneath g.Path (following symlinks).
func addRule(rulesetFD int, g grant, handledFS uint64) error {
	fd, err := unix.Open(g.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		if g.Optional && errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "open", Path: g.Path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: g.Path, Err: err}
	}
	access := uint64(rightsRead)
	if g.Write {
		access |= rightsWrite
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		access &= rightsFile
	}
	rule := unix.LandlockPathBeneathAttr{Allowed_access: access & handledFS, Parent_fd: int32(fd)}
	if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rulesetFD), unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&rule)), 0, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_add_rule %s: %v", g.Path, errno)
	}
	return nil
}
