package sandbox_test

import (
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/sandbox"
)

// A run reports the CPU time its tree used, a forked child's included
// (the busy loop runs in a subshell the shell waits for), with and
// without a cgroup: at least the 10 ms a 200000-step shell loop takes on
// any machine.
func TestCPUTime(t *testing.T) {
	requireLandlock(t)
	for _, withCgroup := range []bool{false, true} {
		p := policy(t)
		if withCgroup {
			if err := sandbox.CgroupSupported(); err != nil {
				t.Logf("no cgroup here: %v", err)
				continue
			}
			p.Cgroup = &sandbox.Cgroup{}
		}
		res := sh(t, p, `(i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done); echo done`)
		checkExit(t, res, 0, "done\n", "")
		if res.CPUTime < 10*time.Millisecond {
			t.Errorf("cgroup %v: CPU time %v for a 200000-step loop", withCgroup, res.CPUTime)
		}
		t.Logf("cgroup %v: CPU time %v in %v (cgroup's own count: %+v)", withCgroup, res.CPUTime, res.Duration, res.Cgroup)
	}
}
