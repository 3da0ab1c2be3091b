//go:build linux

package sandbox

import "golang.org/x/sys/unix"

// auditArch is AUDIT_ARCH_X86_64; x32SyscallBit marks the x32 ABI's
// system call numbers.
const (
	auditArch     = 0xc000003e
	x32SyscallBit = 0x40000000
)

// archDenied are x86-64's obsolete or privileged system calls beyond
// deniedSyscalls.
var archDenied = []uintptr{
	unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_USELIB, unix.SYS_USTAT, unix.SYS_SYSFS, unix.SYS__SYSCTL,
	unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS, unix.SYS_QUERY_MODULE, unix.SYS_NFSSERVCTL,
}
