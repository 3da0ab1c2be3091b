package environment_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
)

// The escape tests attack the process backend the way an agent's code
// would, through EnvironmentService/Run and the real operator's bash
// tool: each prints a short marker for what it reached, and the test
// fails when any marker of a way out comes back.

// serveUnix answers HTTP on a Unix socket at path with marker.
func serveUnix(t *testing.T, path, marker string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(path, "@") {
		os.Chmod(path, 0o777) // as permissive as a socket can be
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, marker) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// Host Unix sockets, the way a Docker engine's or a database's sit
// beside the service: path-named ones in a root-only directory and in
// the world-writable temp directory, and an abstract one. None can be
// reached; the path-named ones do not even exist inside.
func TestEscapeHostUnixSockets(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	private := shortTemp(t) // 0700, root's
	inPrivate := filepath.Join(private, "engine.sock")
	serveUnix(t, inPrivate, "ENGINE-ANSWERED")
	f, err := os.CreateTemp("", "neuron-db-*.sock")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name())
	inTmp := f.Name()
	serveUnix(t, inTmp, "DB-ANSWERED")
	abstract := "@neuron-escape-" + strconv.Itoa(os.Getpid())
	serveUnix(t, abstract, "ABSTRACT-ANSWERED")

	for _, tc := range []struct{ name, command string }{
		{"socket in a root-only directory", "curl -sS --max-time 5 --unix-socket " + inPrivate + " http://x/ ; test -e " + inPrivate + " && echo EXISTS"},
		{"socket in the temp directory", "curl -sS --max-time 5 --unix-socket " + inTmp + " http://x/ ; test -e " + inTmp + " && echo EXISTS"},
		{"abstract socket", "curl -sS --max-time 5 --abstract-unix-socket " + strings.TrimPrefix(abstract, "@") + " http://x/"},
		{"engine socket paths", "for s in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock /run/systemd/private; do test -e $s && echo EXISTS $s; done; echo checked"},
		{"host directories", "for d in /proc/1 /sys/fs /run /var /root /home " + private + "; do test -e $d && echo EXISTS $d; done; echo checked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := e.bash(t, tc.command, nil)
			for _, leak := range []string{"ANSWERED", "EXISTS"} {
				if strings.Contains(got, leak) {
					t.Errorf("the sandbox reached the host: %q", got)
				}
			}
		})
	}
}

// The invocation runs as a uid and gid of its own, not root's and not
// the service's, with no capabilities and no supplementary groups.
func TestEscapeRunsAsItsOwnUID(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	got, _ := e.bash(t, "echo uid=$(id -u) gid=$(id -g) groups=$(id -G)", nil)
	i := strings.Index(got, "uid=")
	if i < 0 {
		t.Fatalf("no id output: %q", got)
	}
	var uid, gid, groups int
	if _, err := fmt.Sscanf(got[i:], "uid=%d gid=%d groups=%d", &uid, &gid, &groups); err != nil {
		t.Fatalf("%q: %v", got, err)
	}
	if uid < 1_000_000 || uid == os.Getuid() || gid != uid || groups != gid {
		t.Errorf("the invocation runs as uid %d gid %d groups %d", uid, gid, groups)
	}
}

// A descriptor the service holds without close-on-exec (a service
// started by a parent that left one open on a secret) never reaches the
// invocation.
func TestEscapeInheritedDescriptors(t *testing.T) {
	requireSandbox(t)
	secret := filepath.Join(t.TempDir(), "root-only")
	if err := os.WriteFile(secret, []byte("INHERITED-FD-SECRET-6620"), 0o600); err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, from := range []int{50, 120, 400} {
		fd, err := unix.Open(secret, unix.O_RDONLY, 0) // no O_CLOEXEC
		if err != nil {
			t.Fatal(err)
		}
		n, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD, from)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, n)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	e := startEnv(t, envOptions{})
	var cmd strings.Builder
	for _, fd := range fds {
		fmt.Fprintf(&cmd, "cat <&%d 2>/dev/null; ", fd)
	}
	cmd.WriteString("echo checked")
	got, _ := e.bash(t, cmd.String(), nil)
	if strings.Contains(got, "INHERITED-FD-SECRET") || !strings.Contains(got, "checked") {
		t.Errorf("an inherited descriptor reached the sandbox: %q", got)
	}
}

// The kernel surface a nested user namespace would open: new
// namespaces, packet, raw and netlink sockets, mounts, ptrace. Each is
// refused, with the tools an agent would use.
func TestEscapeKernelSurface(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	py := func(code string) string {
		return `/usr/bin/python3 -c "` + code + `" 2>&1 | tail -c 60; echo`
	}
	for _, tc := range []struct{ name, command, success string }{
		{"user namespace", "unshare --user --map-root-user id -u 2>&1 && echo NESTED-OK", "NESTED-OK"},
		{"net namespace", "unshare --user --map-root-user --net ip link 2>&1 && echo NESTED-OK", "NESTED-OK"},
		{"mount namespace", "unshare --mount true 2>&1 && echo NESTED-OK", "NESTED-OK"},
		{"netlink", "ip link 2>&1 && echo NETLINK-OK", "NETLINK-OK"},
		{"packet socket", py("import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print('PACKET-OK')"), "PACKET-OK"},
		{"raw socket", py("import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1); print('RAW-OK')"), "RAW-OK"},
		{"ptrace", py("import ctypes; l=ctypes.CDLL(None); print('PTRACE-OK' if l.ptrace(0,0,0,0)==0 else 'refused')"), "PTRACE-OK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.command, "python3") {
				if _, err := os.Stat("/usr/bin/python3"); err != nil {
					t.Skip("no /usr/bin/python3 on this host")
				}
			}
			got, _ := e.bash(t, tc.command, nil)
			if strings.Contains(got, tc.success) {
				t.Errorf("the sandbox let it through: %q", got)
			}
		})
	}
}

// Disk: the workspace is capped by resources.disk, and by a default
// when the spec sets none; filling it ends the run with
// RESOURCE_EXHAUSTED and limits_hit "disk".
func TestEscapeDiskCap(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	// The default cap (1 GiB) is what the workspace holds.
	got, _ := e.bash(t, "echo size=$(( $(stat -f -c '%b*%S' .) ))", nil)
	if !strings.Contains(got, "size=1073741824") {
		t.Errorf("the workspace is not capped at the default 1 GiB: %q", got)
	}
	disk := "32Mi"
	_, err := e.run(t, `/tool bash {"command":"dd if=/dev/zero of=big bs=1M count=100; echo wrote","timeout_seconds":30}`, &environmentv1.EnvironmentSpec{
		Resources: &environmentv1.ResourceLimits{Disk: &disk},
	})
	wantCode(t, err, codes.ResourceExhausted, "workspace", "33554432")
}
