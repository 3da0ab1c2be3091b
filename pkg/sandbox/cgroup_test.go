package sandbox_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/secbear/neuron/pkg/sandbox"
)

func requireCgroup(t *testing.T) {
	t.Helper()
	requireLandlock(t)
	if err := sandbox.CgroupSupported(); err != nil {
		t.Skipf("no delegable cgroup here, tree limits cannot be tested: %v", err)
	}
}

// A tree that forks past the pids cap gets EAGAIN, and the cgroup
// records the refusals.
func TestCgroupPidsLimit(t *testing.T) {
	requireCgroup(t)
	p := policy(t)
	p.Cgroup = &sandbox.Cgroup{Pids: 8}
	// 20 background sleeps: the shell itself plus 7 children fit.
	res := sh(t, p, `n=0; for i in $(seq 20); do sleep 5 2>/dev/null & n=$((n+1)); done; wait; echo started`)
	if res.Cgroup == nil {
		t.Fatal("no cgroup statistics")
	}
	if res.Cgroup.PidsLimitHits == 0 {
		t.Errorf("pids limit never hit: %+v, stderr %q", res.Cgroup, res.Stderr)
	}
	if !strings.Contains(string(res.Stderr), "fork") && !strings.Contains(string(res.Stderr), "Resource temporarily unavailable") {
		t.Errorf("the shell did not report failed forks: %q", res.Stderr)
	}
}

// A process that allocates past the memory cap is killed by the OOM
// killer, and the cgroup says so; the cgroup is removed after the run.
func TestCgroupMemoryLimit(t *testing.T) {
	requireCgroup(t)
	p := policy(t)
	p.Cgroup = &sandbox.Cgroup{MemoryBytes: 64 << 20}
	// tail must hold the whole 512 MiB line in memory.
	res := sh(t, p, `head -c 536870912 /dev/zero | tail -n 1 >/dev/null; echo "tail exit $?"`)
	if res.Cgroup == nil || res.Cgroup.OOMKills == 0 {
		t.Fatalf("no OOM kill recorded: %+v, stdout %q", res.Cgroup, res.Stdout)
	}
	if !strings.Contains(string(res.Stdout), "tail exit 137") {
		t.Errorf("tail was not killed by SIGKILL: %q", res.Stdout)
	}
	if res.Cgroup.PeakMemoryBytes < 32<<20 || res.Cgroup.PeakMemoryBytes > 80<<20 {
		t.Errorf("peak memory %d, want near the 64 MiB cap", res.Cgroup.PeakMemoryBytes)
	}
	leftovers, _ := filepath.Glob("/sys/fs/cgroup/*/*neuron-sandbox-*")
	more, _ := filepath.Glob("/sys/fs/cgroup/memory/*/*/neuron-sandbox-*")
	for _, d := range append(leftovers, more...) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s left behind", d)
		}
	}
}

// Without limits a run still reports its peak memory.
func TestCgroupStatsOnly(t *testing.T) {
	requireCgroup(t)
	p := policy(t)
	p.Cgroup = &sandbox.Cgroup{}
	res := sh(t, p, `echo ok`)
	checkExit(t, res, 0, "ok\n", "")
	if res.Cgroup == nil || res.Cgroup.PeakMemoryBytes <= 0 || res.Cgroup.OOMKills != 0 || res.Cgroup.PidsLimitHits != 0 {
		t.Errorf("stats %+v", res.Cgroup)
	}
}

// A CPU cap throttles a busy loop: over the run, the tree gets about
// its share of CPU, whatever the wall-clock time was.
func TestCgroupCPUQuota(t *testing.T) {
	requireCgroup(t)
	p := policy(t)
	p.Cgroup = &sandbox.Cgroup{CPUMillis: 100}
	// Report the throttling the kernel recorded for this very group.
	res := sh(t, p, `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo done`)
	checkExit(t, res, 0, "done\n", "")
	if res.Cgroup == nil || res.Cgroup.CPUThrottled == 0 {
		t.Errorf("the busy loop was never throttled under a 0.1 core cap: %+v", res.Cgroup)
	}
}

// Files appear, read-only, at their absolute paths in the child's own
// root, and nowhere on the host.
func TestFiles(t *testing.T) {
	requireLandlock(t)
	p := policy(t)
	p.Namespaces = sandbox.Namespaces{User: true, Mount: true}
	p.Files = []sandbox.File{
		{Path: "/run/neuron-sandbox-test/secrets/token", Data: []byte("tok-123")},
		{Path: "/run/neuron-sandbox-test/other", Data: []byte("two")},
		{Path: "/etc/neuron-sandbox-test-token", Data: []byte("three")},
	}
	res := sh(t, p, `cat /run/neuron-sandbox-test/secrets/token; echo; cat /run/neuron-sandbox-test/other; echo; cat /etc/neuron-sandbox-test-token; echo; echo x > /run/neuron-sandbox-test/other && echo WROTE`)
	if string(res.Stdout) != "tok-123\ntwo\nthree\n" {
		t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	for _, leaked := range []string{"/run/neuron-sandbox-test", "/etc/neuron-sandbox-test-token"} {
		if _, err := os.Stat(leaked); err == nil {
			t.Errorf("%s leaked onto the host", leaked)
		}
	}
	for _, bad := range []struct{ path, says string }{
		{"/etc/passwd", "granted"},
		{"/usr/share/neuron-no-such/x", "granted"},
		{p.Workspace + "/token", "granted"},
		{"/", "absolute"},
		{"relative/x", "absolute"},
	} {
		q := p
		q.Files = []sandbox.File{{Path: bad.path, Data: []byte("x")}}
		_, err := sandbox.Run(t.Context(), q, []string{"/bin/true"}, nil)
		if !errors.Is(err, sandbox.ErrFilePlacement) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%s: got %v, want ErrFilePlacement saying %q", bad.path, err, bad.says)
		}
	}
	q := p
	q.Namespaces = sandbox.Namespaces{User: true}
	if _, err := sandbox.Run(t.Context(), q, []string{"/bin/true"}, nil); !errors.Is(err, sandbox.ErrFilePlacement) {
		t.Errorf("files without a private root: %v", err)
	}
}
