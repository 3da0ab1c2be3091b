//go:build !linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// ErrUnsupported is wrapped by the errors of Supported and Run when the
// kernel cannot enforce a policy.
var ErrUnsupported = errors.New("sandbox: the kernel cannot enforce the sandbox")

// Result is the outcome of a command that started.
type Result struct {
	Stdout, Stderr         []byte
	StdoutSize, StderrSize int64
	ExitCode               int
	Signal                 string
	TimedOut               bool
	Duration               time.Duration
	CPUTime                time.Duration
	Cgroup                 *CgroupStats
}

// Main does nothing on this platform.
func Main() {}

// Supported always fails on this platform: the sandbox needs Linux.
func Supported() error {
	return fmt.Errorf("%w: Landlock needs Linux", ErrUnsupported)
}

// Run always fails on this platform: the sandbox needs Linux.
func Run(ctx context.Context, p Policy, argv []string, stdin io.Reader) (*Result, error) {
	return nil, Supported()
}

// CgroupSupported always fails on this platform: cgroups need Linux.
func CgroupSupported() error {
	return fmt.Errorf("%w: cgroups need Linux", ErrUnsupported)
}
