package sandbox

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	cgroupRoot   = "/sys/fs/cgroup"
	cgroupPrefix = "neuron-sandbox-"
)

// cgroup is one run's control group: one directory per v1 controller, or
// one v2 directory.
type cgroup struct {
	v2     bool
	memory string // v1 memory dir, or the v2 dir
	pids   string // v1 pids dir, or the v2 dir
	cpu    string // v1 cpu dir, or the v2 dir; "" when no CPU cap
}

// cfsPeriod is the CFS bandwidth period, in microseconds.
const cfsPeriod = 100000

// CgroupSupported reports whether Run can enforce Policy.Cgroup here:
// nil when it can, else an error wrapping ErrUnsupported naming what is
// missing.
func CgroupSupported() error {
	_, _, err := cgroupParents()
	return err
}

// cgroupParents returns where a run's groups are created: the caller's
// own memory and pids groups (v1), or its v2 group, which must delegate
// both controllers.
func cgroupParents() (memory, pids string, err error) {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", "", fmt.Errorf("%w: reading /proc/self/cgroup: %v", ErrUnsupported, err)
	}
	var v2path string
	sc := bufio.NewScanner(bytes.NewReader(own))
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			switch c {
			case "memory":
				memory = filepath.Join(cgroupRoot, "memory", f[2])
			case "pids":
				pids = filepath.Join(cgroupRoot, "pids", f[2])
			}
		}
		if f[0] == "0" && f[1] == "" {
			v2path = f[2]
		}
	}
	if memory != "" && pids != "" && writableDir(memory) && writableDir(pids) {
		return memory, pids, nil
	}
	if v2path != "" {
		dir := filepath.Join(cgroupRoot, v2path)
		if st, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control")); err == nil {
			ctl := " " + strings.TrimSpace(string(st)) + " "
			if strings.Contains(ctl, " memory ") && strings.Contains(ctl, " pids ") && writableDir(dir) {
				return dir, dir, nil
			}
		}
	}
	return "", "", fmt.Errorf("%w: no writable memory and pids cgroup (v1 controllers mounted under %s, or a v2 group of this process delegating memory and pids); run the service with cgroup delegation or as root", ErrUnsupported, cgroupRoot)
}

func writableDir(dir string) bool {
	return unix.Access(dir, unix.W_OK) == nil
}

// newCgroup creates a run's groups with the limits of c.
func newCgroup(c Cgroup) (*cgroup, error) {
	memParent, pidsParent, err := cgroupParents()
	if err != nil {
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := cgroupPrefix + hex.EncodeToString(b[:])
	g := &cgroup{v2: memParent == pidsParent, memory: filepath.Join(memParent, name), pids: filepath.Join(pidsParent, name)}
	if c.CPUMillis > 0 {
		if g.v2 {
			g.cpu = g.memory
		} else if g.cpu, err = cgroupV1Parent("cpu"); err != nil {
			return nil, err
		} else {
			g.cpu = filepath.Join(g.cpu, name)
		}
	}
	for _, d := range g.dirs() {
		if err := os.Mkdir(d, 0o700); err != nil {
			g.remove()
			return nil, fmt.Errorf("sandbox: cgroup: %w", err)
		}
	}
	var writes []struct{ file, value string }
	if g.v2 {
		if c.MemoryBytes > 0 {
			writes = append(writes, struct{ file, value string }{"memory.max", strconv.FormatInt(c.MemoryBytes, 10)},
				struct{ file, value string }{"memory.swap.max", "0"})
		}
		if c.Pids > 0 {
			writes = append(writes, struct{ file, value string }{"pids.max", strconv.FormatInt(c.Pids, 10)})
		}
		if c.CPUMillis > 0 {
			writes = append(writes, struct{ file, value string }{"cpu.max", fmt.Sprintf("%d %d", c.CPUMillis*cfsPeriod/1000, cfsPeriod)})
		}
		for _, w := range writes {
			err := os.WriteFile(filepath.Join(g.memory, w.file), []byte(w.value), 0)
			if err != nil && !(w.file == "memory.swap.max" && errors.Is(err, os.ErrNotExist)) {
				g.remove()
				return nil, fmt.Errorf("sandbox: cgroup %s: %w", w.file, err)
			}
		}
		return g, nil
	}
	if c.MemoryBytes > 0 {
		v := strconv.FormatInt(c.MemoryBytes, 10)
		if err := os.WriteFile(filepath.Join(g.memory, "memory.limit_in_bytes"), []byte(v), 0); err != nil {
			g.remove()
			return nil, fmt.Errorf("sandbox: cgroup memory.limit_in_bytes: %w", err)
		}
		// Memory plus swap, where swap accounting is on: without it a
		// capped tree could page out instead of being stopped.
		if err := os.WriteFile(filepath.Join(g.memory, "memory.memsw.limit_in_bytes"), []byte(v), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			g.remove()
			return nil, fmt.Errorf("sandbox: cgroup memory.memsw.limit_in_bytes: %w", err)
		}
	}
	if c.Pids > 0 {
		if err := os.WriteFile(filepath.Join(g.pids, "pids.max"), []byte(strconv.FormatInt(c.Pids, 10)), 0); err != nil {
			g.remove()
			return nil, fmt.Errorf("sandbox: cgroup pids.max: %w", err)
		}
	}
	if c.CPUMillis > 0 {
		err := os.WriteFile(filepath.Join(g.cpu, "cpu.cfs_period_us"), []byte(strconv.Itoa(cfsPeriod)), 0)
		if err == nil {
			err = os.WriteFile(filepath.Join(g.cpu, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(c.CPUMillis*cfsPeriod/1000, 10)), 0)
		}
		if err != nil {
			g.remove()
			return nil, fmt.Errorf("sandbox: cgroup cpu quota: %w", err)
		}
	}
	return g, nil
}

func (g *cgroup) dirs() []string {
	if g.v2 {
		return []string{g.memory}
	}
	if g.cpu != "" {
		return []string{g.memory, g.pids, g.cpu}
	}
	return []string{g.memory, g.pids}
}

// cgroupV1Parent returns this process's group in the v1 hierarchy of
// controller, when it is mounted and writable.
func cgroupV1Parent(controller string) (string, error) {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("%w: reading /proc/self/cgroup: %v", ErrUnsupported, err)
	}
	for _, line := range strings.Split(string(own), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == controller {
				dir := filepath.Join(cgroupRoot, controller, f[2])
				if writableDir(dir) {
					return dir, nil
				}
			}
		}
	}
	return "", fmt.Errorf("%w: no writable %s cgroup controller for a CPU cap", ErrUnsupported, controller)
}

// add moves process pid into the groups.
func (g *cgroup) add(pid int) error {
	for _, d := range g.dirs() {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("sandbox: moving the child into cgroup %s: %w", d, err)
		}
	}
	return nil
}

// stats reads what the groups recorded.
func (g *cgroup) stats() CgroupStats {
	var s CgroupStats
	if g.cpu != "" {
		s.CPUThrottled = readKeyed(filepath.Join(g.cpu, "cpu.stat"))["nr_throttled"]
	}
	if g.v2 {
		// Every v2 group has cpu.stat's usage, with or without the cpu
		// controller.
		s.CPUUsage = time.Duration(readKeyed(filepath.Join(g.memory, "cpu.stat"))["usage_usec"]) * time.Microsecond
	} else if g.cpu != "" {
		s.CPUUsage = time.Duration(readInt(filepath.Join(g.cpu, "cpuacct.usage"))) // ns; only where cpu and cpuacct share a mount
	}
	if g.v2 {
		s.PeakMemoryBytes = readInt(filepath.Join(g.memory, "memory.peak"))
		ev := readKeyed(filepath.Join(g.memory, "memory.events"))
		s.OOMKills, s.MemoryLimitHits = ev["oom_kill"], ev["max"]
		s.PidsLimitHits = readKeyed(filepath.Join(g.pids, "pids.events"))["max"]
		return s
	}
	s.PeakMemoryBytes = readInt(filepath.Join(g.memory, "memory.max_usage_in_bytes"))
	s.MemoryLimitHits = readInt(filepath.Join(g.memory, "memory.failcnt"))
	s.OOMKills = readKeyed(filepath.Join(g.memory, "memory.oom_control"))["oom_kill"]
	s.PidsLimitHits = readKeyed(filepath.Join(g.pids, "pids.events"))["max"]
	return s
}

// remove deletes the groups, retrying briefly while killed members are
// still being torn down.
func (g *cgroup) remove() {
	for _, d := range g.dirs() {
		for delay := time.Millisecond; ; delay *= 2 {
			err := os.Remove(d)
			if err == nil || errors.Is(err, os.ErrNotExist) || delay > 500*time.Millisecond {
				break
			}
			time.Sleep(delay)
		}
	}
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// readKeyed parses a "key value" per line file.
func readKeyed(path string) map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			out[k] = n
		}
	}
	return out
}
