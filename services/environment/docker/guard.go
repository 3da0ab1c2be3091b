package docker

import "math"

// The docker backend's own guards are the ranges below, which the kernel
// and the engine accept. The credential variables and files every backend
// refuses, and the quantity overflow check, are in
// services/environment/guard.go.

// Ranges the kernel and the engine accept.
const (
	// maxPIDs is the kernel's PID_MAX_LIMIT on 64-bit systems: pids.max
	// refuses anything larger.
	maxPIDs = 4 << 20
	// maxCPUMillis is the most CPU whose NanoCPUs fit in an int64.
	maxCPUMillis = math.MaxInt64 / 1_000_000
)
