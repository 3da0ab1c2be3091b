//go:build linux

package sandbox

import "golang.org/x/sys/unix"

// auditArch is AUDIT_ARCH_AARCH64; arm64 has no second ABI numbering.
const (
	auditArch     = 0xc00000b7
	x32SyscallBit = 0
)

// archDenied are arm64's privileged system calls beyond deniedSyscalls.
var archDenied = []uintptr{unix.SYS_NFSSERVCTL}
