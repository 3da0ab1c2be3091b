package docker

import (
	"fmt"
	"math"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// The guards of this file refuse what a spec could use to change the
// container from inside its own limits: credentials placed where they
// change how programs behave, and quantities outside what the kernel and
// the engine accept. The lists of variables and files are
// services/environment/guard.go, shared with every backend.

// Ranges the kernel and the engine accept.
const (
	// maxPIDs is the kernel's PID_MAX_LIMIT on 64-bit systems: pids.max
	// refuses anything larger.
	maxPIDs = 4 << 20
	// maxCPUMillis is the most CPU whose NanoCPUs fit in an int64.
	maxCPUMillis = math.MaxInt64 / 1_000_000
)

// checkQuantities refuses, with INVALID_ARGUMENT, a quantity r sets that
// did not survive conversion to an integer in l: too large for an int64
// (it saturates, wraps negative or reads as zero, which would mean no
// limit at all).
func checkQuantities(r *environmentv1.ResourceLimits, l environment.Limits) error {
	for _, q := range []struct {
		field string
		set   *string
		v     int64
	}{{"cpu", r.Cpu, l.CPUMillis}, {"memory", r.Memory, l.MemoryBytes}, {"disk", r.Disk, l.DiskBytes}} {
		if q.set != nil && (q.v <= 0 || q.v == math.MaxInt64) {
			return fmt.Errorf("resources.%s %q is too large to be a limit: %w", q.field, *q.set, errs.InvalidArgument)
		}
	}
	return nil
}
