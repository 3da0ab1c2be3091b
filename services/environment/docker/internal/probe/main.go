// Command probe stands in for the operator binary in the docker backend's
// attack tests (services/environment/docker/attack_test.go): the backend
// runs it exactly as it runs the operator, as /operator in a container,
// with the input on stdin. Instead of an agent turn it looks around from
// inside the container, tries what an escaping process would try, and
// answers with an OperatorOutput whose text is a JSON report.Report.
//
// It is a test harness: no other program should import or ship it.
package main

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/secbear/neuron/services/environment/docker/internal/probe/report"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "health" {
		// A HEALTHCHECK of a hostile image: leave a mark if it ever
		// runs.
		_ = os.WriteFile("/workspace/healthcheck-ran", []byte("yes"), 0o644)
		return
	}
	in, _ := io.ReadAll(os.Stdin)
	r := probe()
	r.Input = len(in)
	text, err := json.Marshal(r)
	if err != nil {
		os.Exit(1)
	}
	out, _ := json.Marshal(map[string]any{
		"message":    map[string]any{"blocks": []any{map[string]any{"text": map[string]any{"text": string(text)}}}},
		"exitReason": map[string]any{"kind": "EXIT_KIND_COMPLETE"},
	})
	os.Stdout.Write(append(out, '\n'))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func probe() *report.Report {
	r := &report.Report{
		UID: os.Getuid(), GID: os.Getgid(), EUID: os.Geteuid(), PID: os.Getpid(),
		Status: map[string]string{}, Namespaces: map[string]string{}, Devices: map[string]string{},
		Writes: map[string]string{}, Dials: map[string]string{}, Syscalls: map[string]string{},
		Sizes: map[string]uint64{}, Cgroup: map[string]string{}, Files: map[string]string{},
		Dirs: map[string][]string{}, Env: os.Environ(),
	}
	r.Groups, _ = os.Getgroups()
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok && (strings.HasPrefix(k, "Cap") || k == "NoNewPrivs" || strings.HasPrefix(k, "Seccomp")) {
				r.Status[k] = strings.TrimSpace(v)
			}
		}
	}
	for _, ns := range []string{"cgroup", "ipc", "mnt", "net", "pid", "user", "uts"} {
		l, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			l = "error: " + err.Error()
		}
		r.Namespaces[ns] = l
	}
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			r.Interfaces = append(r.Interfaces, i.Name)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		r.MountInfo = string(b)
	}
	if entries, err := os.ReadDir("/dev"); err == nil {
		for _, e := range entries {
			if info, err := os.Lstat(filepath.Join("/dev", e.Name())); err == nil {
				r.Devices[e.Name()] = info.Mode().String()
			}
		}
	}
	_ = filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			if p == "/proc" || p == "/sys" {
				return filepath.SkipDir
			}
			return nil
		}
		// The directory entry of a mount point has the type of the
		// placeholder beneath the mount; Lstat sees what is mounted.
		if info, err := os.Lstat(p); err == nil && info.Mode()&fs.ModeSocket != 0 {
			r.Sockets = append(r.Sockets, p)
		}
		return nil
	})
	sort.Strings(r.Sockets)

	// Writes outside the workspace: the root, system files, the
	// engine-managed files, the mounted sockets' directories, the
	// kernel's knobs.
	for _, p := range []string{"/probe-root", "/etc/probe", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf",
		"/run/neuron/probe", "/run/neuron-state/probe", "/proc/sys/kernel/hostname", "/proc/sysrq-trigger",
		"/sys/kernel/probe", "/workspace/probe", "/tmp/probe"} {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
		if err == nil {
			_, err = f.Write([]byte("x"))
			f.Close()
		}
		r.Writes[p] = errString(err)
	}
	// The engine's sockets, wherever an escape would look for them.
	for _, p := range []string{"/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
		"/var/run/containerd/containerd.sock", "/run/docker/containerd/containerd.sock"} {
		c, err := net.Dial("unix", p)
		if err == nil {
			c.Close()
		}
		r.Dials[p] = errString(err)
	}
	// Network: a host address, the cloud metadata address.
	for _, a := range []string{"127.0.0.1:2375", "169.254.169.254:80", "1.1.1.1:53"} {
		c, err := net.Dial("tcp", a)
		if err == nil {
			c.Close()
		}
		r.Dials[a] = errString(err)
	}

	// Privileged calls.
	r.Syscalls["setuid0"] = errString(syscall.Setuid(0))
	r.Syscalls["mount_tmpfs"] = errString(syscall.Mount("none", "/tmp", "tmpfs", 0, ""))
	r.Syscalls["unshare_user"] = errString(syscall.Unshare(syscall.CLONE_NEWUSER))
	r.Syscalls["unshare_mount"] = errString(syscall.Unshare(syscall.CLONE_NEWNS))
	r.Syscalls["chroot"] = errString(syscall.Chroot("/tmp"))
	r.Syscalls["mknod"] = errString(syscall.Mknod("/tmp/sda", syscall.S_IFBLK|0o600, 8<<8))
	r.Syscalls["sethostname"] = errString(syscall.Sethostname([]byte("escaped")))

	for _, m := range []string{"/workspace", "/tmp", "/dev/shm"} {
		var st syscall.Statfs_t
		if err := syscall.Statfs(m, &st); err == nil {
			r.Sizes[m] = st.Blocks * uint64(st.Bsize)
		}
	}
	r.Filled, r.FillErr = fill("/workspace/fill")
	_ = os.Remove("/workspace/fill")

	for _, p := range []string{
		"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes",
		"/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us",
		"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/cpu.max",
	} {
		if b, err := os.ReadFile(p); err == nil {
			r.Cgroup[p] = strings.TrimSpace(string(b))
		}
	}
	// Files the test names in PROBE_READ (comma-separated), which it
	// injects as an env_var credential.
	for _, p := range strings.Split(os.Getenv("PROBE_READ"), ",") {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			r.Files[p] = "error: " + err.Error()
			continue
		}
		r.Files[p] = string(b)
	}
	for _, p := range []string{"/run/neuron", "/run/neuron-state", "/workspace", "/"} {
		entries, err := os.ReadDir(p)
		if err != nil {
			r.Dirs[p] = []string{"error: " + err.Error()}
			continue
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		r.Dirs[p] = names
	}
	return r
}

// fill writes to path until a write fails, and returns how much fit and
// the error (ENOSPC for a full tmpfs).
func fill(path string) (int64, string) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err.Error()
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	var n int64
	for n < 8<<30 {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return n, "ENOSPC"
			}
			return n, err.Error()
		}
	}
	return n, "no limit within 8 GiB"
}
