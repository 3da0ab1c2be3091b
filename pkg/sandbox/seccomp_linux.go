package sandbox

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The seccomp filter every sandboxed target runs under, installed by the
// trampoline last, just before execve (after no_new_privs, so it needs
// no privilege). It keeps the kernel surface behind most local privilege
// escalations out of reach even where a namespace would grant the
// capability (a user namespace gives its root CAP_NET_ADMIN and
// CAP_SYS_ADMIN over its own namespaces):
//
//   - no new namespaces: clone and unshare with any CLONE_NEW* flag and
//     setns are refused (EPERM); clone3, whose flags a filter cannot
//     read, answers ENOSYS, on which glibc and Go fall back to clone;
//   - sockets only of the families AF_UNIX, AF_INET and AF_INET6, and
//     of those no raw or packet sockets (netlink, packet, key, alg,
//     vsock, bluetooth, ... are EAFNOSUPPORT);
//   - no mounting (mount, umount2, pivot_root, chroot and the new mount
//     API), no ptrace or process_vm_*, no bpf, keyctl, add_key,
//     request_key, perf_event_open, userfaultfd, io_uring, kexec, module
//     loading, swap, reboot, clock setting, syslog, quotactl, handle-based
//     opens (open_by_handle_at reads files by inode, past any path
//     rule), kcmp, pidfd_getfd, fanotify, acct, vhangup;
//   - no TIOCSTI or TIOCLINUX ioctl (typing into a terminal);
//   - only the native system call ABI: another architecture's (i386
//     on x86-64) kills the process, and x32 numbers answer ENOSYS.
//
// It is a deny list over an allow-by-default base, not an allow list:
// the targets are arbitrary programs (shells, compilers, interpreters)
// whose system calls cannot be enumerated up front, and what it denies
// is the set container runtimes' default profiles deny as well.

// Values from <linux/seccomp.h>, <linux/filter.h> and <linux/audit.h>.
const (
	seccompRetKillProcess = 0x80000000
	seccompRetErrno       = 0x00050000
	seccompRetAllow       = 0x7fff0000

	bpfLdWAbs  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeqK    = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJsetK   = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfJgeK    = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfAndK    = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	bpfRetK    = unix.BPF_RET | unix.BPF_K
	offsetNr   = 0
	offsetArch = 4
)

// offsetArg is the offset of the low 32 bits of argument i in struct
// seccomp_data (little-endian; every argument checked here fits in them).
func offsetArg(i int) uint32 { return uint32(16 + 8*i) }

// nsFlags are every CLONE_NEW* flag.
const nsFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWTIME

// deniedSyscalls answer EPERM. Architecture-specific ones are added by
// archDenied.
var deniedSyscalls = []uintptr{
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT, unix.SYS_SETNS,
	unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT,
	unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_KCMP, unix.SYS_PIDFD_GETFD,
	unix.SYS_BPF, unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD, unix.SYS_FANOTIFY_INIT,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_REBOOT, unix.SYS_ACCT, unix.SYS_VHANGUP,
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
	unix.SYS_SYSLOG, unix.SYS_QUOTACTL, unix.SYS_NAME_TO_HANDLE_AT, unix.SYS_OPEN_BY_HANDLE_AT,
	unix.SYS_LOOKUP_DCOOKIE,
}

// bpfProg assembles a filter with symbolic jump targets.
type bpfProg struct {
	ins    []unix.SockFilter
	jumps  map[int][2]string // instruction index -> (true, false) labels
	labels map[string]int
}

func (p *bpfProg) stmt(code uint16, k uint32) {
	p.ins = append(p.ins, unix.SockFilter{Code: code, K: k})
}

// jump adds a conditional jump; "" as a target means the next
// instruction.
func (p *bpfProg) jump(code uint16, k uint32, jt, jf string) {
	p.jumps[len(p.ins)] = [2]string{jt, jf}
	p.stmt(code, k)
}

func (p *bpfProg) label(name string) { p.labels[name] = len(p.ins) }

func (p *bpfProg) ret(v uint32) { p.stmt(bpfRetK, v) }

// assemble resolves the labels into relative offsets.
func (p *bpfProg) assemble() ([]unix.SockFilter, error) {
	for i, targets := range p.jumps {
		for n, name := range targets {
			if name == "" {
				continue
			}
			at, ok := p.labels[name]
			off := at - (i + 1)
			if !ok || off < 0 || off > 255 {
				return nil, fmt.Errorf("seccomp filter: bad jump from %d to %q", i, name)
			}
			if n == 0 {
				p.ins[i].Jt = uint8(off)
			} else {
				p.ins[i].Jf = uint8(off)
			}
		}
	}
	return p.ins, nil
}

// seccompFilter builds the filter described above for this
// architecture.
func seccompFilter() ([]unix.SockFilter, error) {
	p := &bpfProg{jumps: map[int][2]string{}, labels: map[string]int{}}
	errno := func(e unix.Errno) uint32 { return seccompRetErrno | uint32(e) }

	p.stmt(bpfLdWAbs, offsetArch)
	p.jump(bpfJeqK, auditArch, "native", "")
	p.ret(seccompRetKillProcess)
	p.label("native")
	p.stmt(bpfLdWAbs, offsetNr)
	if x32SyscallBit != 0 {
		p.jump(bpfJgeK, x32SyscallBit, "enosys", "")
	}
	for _, nr := range append(deniedSyscalls, archDenied...) {
		p.jump(bpfJeqK, uint32(nr), "eperm", "")
	}
	p.jump(bpfJeqK, unix.SYS_CLONE3, "enosys", "")
	p.jump(bpfJeqK, unix.SYS_CLONE, "nsflags", "")
	p.jump(bpfJeqK, unix.SYS_UNSHARE, "nsflags", "")
	p.jump(bpfJeqK, unix.SYS_SOCKET, "family", "")
	p.jump(bpfJeqK, unix.SYS_SOCKETPAIR, "family", "")
	p.jump(bpfJeqK, unix.SYS_IOCTL, "ioctl", "")
	p.ret(seccompRetAllow)

	// clone(flags, ...), unshare(flags): no namespace flag.
	p.label("nsflags")
	p.stmt(bpfLdWAbs, offsetArg(0))
	p.jump(bpfJsetK, nsFlags, "eperm", "")
	p.ret(seccompRetAllow)

	// socket(domain, type, protocol), socketpair(domain, type, ...).
	p.label("family")
	p.stmt(bpfLdWAbs, offsetArg(0))
	p.jump(bpfJeqK, unix.AF_UNIX, "allow", "")
	p.jump(bpfJeqK, unix.AF_INET, "type", "")
	p.jump(bpfJeqK, unix.AF_INET6, "type", "")
	p.ret(errno(unix.EAFNOSUPPORT))
	p.label("type")
	p.stmt(bpfLdWAbs, offsetArg(1))
	p.stmt(bpfAndK, 0xf) // without SOCK_NONBLOCK and SOCK_CLOEXEC
	p.jump(bpfJeqK, unix.SOCK_RAW, "eperm", "")
	p.jump(bpfJeqK, unix.SOCK_PACKET, "eperm", "")
	p.ret(seccompRetAllow)

	// ioctl(fd, request, ...).
	p.label("ioctl")
	p.stmt(bpfLdWAbs, offsetArg(1))
	p.jump(bpfJeqK, unix.TIOCSTI, "eperm", "")
	p.jump(bpfJeqK, unix.TIOCLINUX, "eperm", "")
	p.label("allow")
	p.ret(seccompRetAllow)

	p.label("eperm")
	p.ret(errno(unix.EPERM))
	p.label("enosys")
	p.ret(errno(unix.ENOSYS))
	return p.assemble()
}

// installSeccomp installs the filter on the calling thread, which must
// have no_new_privs set and be the one that calls execve.
func installSeccomp() error {
	filter, err := seccompFilter()
	if err != nil {
		return err
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if _, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return fmt.Errorf("%w: installing the seccomp filter: %v", ErrUnsupported, e)
	}
	return nil
}
