package environment_test

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/services/environment"
)

// The attack tests drive the real operator binary, one-shot inside the
// process backend, through the environment service's gRPC API. The
// scripted model's "/tool bash {...}" rule runs one shell command through
// the operator's bash tool and answers with the first 200 characters of
// its result, which is how each test sees what the attacker saw.

// secretFile creates a file holding marker in a fresh directory under
// parent and returns its path.
func secretFile(t *testing.T, parent, marker string) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, ".neuron-attack-")
	if err != nil {
		t.Skipf("cannot create a test file under %s: %v", parent, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(p, []byte(marker+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAttackFilesystem(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	home, _ := os.UserHomeDir()
	inHome := secretFile(t, home, "HOME-SECRET-7731")
	outside := secretFile(t, os.TempDir(), "OUTSIDE-SECRET-5512")
	for _, tc := range []struct{ name, command, secret string }{
		{"home directory key", "cat " + inHome + " && echo READ-OK", "HOME-SECRET-7731"},
		{"etc shadow", "cat /etc/shadow && echo READ-OK", "root:"},
		{"pid 1 environment", "cat /proc/1/environ && echo READ-OK", "PATH="},
		{"dot-dot escape", "cat ../../../../../../../.." + outside + " && echo READ-OK", "OUTSIDE-SECRET-5512"},
		{"symlink escape", "ln -s " + outside + " link && cat link && echo READ-OK", "OUTSIDE-SECRET-5512"},
		{"write outside", "echo pwned > " + filepath.Dir(outside) + "/pwned && echo WRITE-OK", "WRITE-OK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := e.bash(t, tc.command, nil)
			if !strings.Contains(got, "bash failed") || strings.Contains(got, tc.secret) || strings.Contains(got, "READ-OK") {
				t.Errorf("the sandbox let it through: %q", got)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(outside), "pwned")); err == nil {
		t.Error("a file was written outside the workspace")
	}
	// The workspace itself is writable and readable.
	got, _ := e.bash(t, "echo hello > notes.txt && cat notes.txt", nil)
	if !strings.Contains(got, "bash returned") || !strings.Contains(got, "hello") {
		t.Errorf("workspace not usable: %q", got)
	}
}

func TestAttackServiceEnvironmentInvisible(t *testing.T) {
	requireSandbox(t)
	t.Setenv("NEURON_TEST_SERVICE_SECRET", "svc-secret-4411")
	e := startEnv(t, envOptions{})
	got, _ := e.bash(t, "env | grep -c -e NEURON_TEST_SERVICE_SECRET -e svc-secret-4411; env | grep -c ^PATH=", nil)
	if !strings.Contains(got, "--- stdout ---\n0\n1\n") {
		t.Errorf("the service's environment is visible inside, or PATH is missing: %q", got)
	}
}

func TestAttackNetwork(t *testing.T) {
	requireSandbox(t)
	// A host service on loopback the sandbox must not reach.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	e := startEnv(t, envOptions{egressResolver: fakeResolver{
		"metadata.test": {netip.MustParseAddr("169.254.169.254")},
		"local.test":    {netip.MustParseAddr("127.0.0.1")},
	}})

	// Default deny: no network at all, not even the host's loopback.
	got, _ := e.bash(t, "echo hi > /dev/tcp/127.0.0.1/"+itoa(port)+" && echo CONNECTED", nil)
	if strings.Contains(got, "CONNECTED") || !strings.Contains(got, "bash failed") {
		t.Errorf("reached the host's loopback: %q", got)
	}
	// Allowed by the policy, but the names resolve to forbidden
	// addresses: the egress proxy refuses them.
	spec := &environmentv1.EnvironmentSpec{Network: &environmentv1.NetworkPolicy{
		DefaultAction: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW,
	}}
	for _, url := range []string{"http://metadata.test/latest/meta-data/", "http://local.test:" + itoa(port) + "/", "http://169.254.169.254/", "http://127.0.0.1:" + itoa(port) + "/"} {
		got, _ = e.bash(t, `curl -sS --max-time 10 --unix-socket "$NEURON_EGRESS_SOCKET" `+url+`; echo " curl=$?"`, spec)
		if !strings.Contains(got, "egress denied") {
			t.Errorf("%s: the egress proxy did not refuse it: %q", url, got)
		}
	}
	// Direct connections still fail with the proxy running.
	got, _ = e.bash(t, "echo hi > /dev/tcp/127.0.0.1/"+itoa(port)+" && echo CONNECTED", spec)
	if strings.Contains(got, "CONNECTED") {
		t.Errorf("reached the host's loopback directly: %q", got)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host listener accepted %d connections from the sandbox", n)
	}
	if !strings.Contains(e.logs.String(), "egress denied") && !strings.Contains(e.logs.String(), "denied") {
		t.Errorf("denials not logged")
	}
}

func TestAttackResourceLimits(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	limited := func(mem string, procs uint32) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Memory: proto.String(mem), MaxProcesses: proto.Uint32(procs)}}
	}
	t.Run("fork bomb", func(t *testing.T) {
		got, resp := e.bash(t, `bomb7f3() { bomb7f3 | bomb7f3 & }; bomb7f3; sleep 3; echo survived`, limited("512Mi", 48))
		if !contains(resp.GetUsage().GetLimitsHit(), "processes") {
			t.Errorf("process limit not reported: usage %v, text %q", resp.GetUsage(), got)
		}
		if left := sandboxProcesses(t, "bomb7f3"); len(left) > 0 {
			t.Errorf("processes outlived the run: %v", left)
		}
	})
	t.Run("memory hog", func(t *testing.T) {
		got, resp := e.bash(t, `head -c 2000000000 /dev/zero | tail -n 1 >/dev/null; echo "hog exit $?"`, limited("256Mi", 64))
		if !contains(resp.GetUsage().GetLimitsHit(), "memory") || !strings.Contains(got, "hog exit 137") {
			t.Errorf("memory hog not stopped by the memory limit: usage %v, text %q", resp.GetUsage(), got)
		}
		if peak := resp.GetUsage().GetPeakMemoryBytes(); peak == 0 || peak > 300<<20 {
			t.Errorf("peak memory %d, want under the 256Mi limit", peak)
		}
	})
	t.Run("1 GB of tool output", func(t *testing.T) {
		got, _ := e.bash(t, `head -c 1000000000 /dev/zero | tr '\0' a`, nil)
		if !strings.Contains(got, "truncated") {
			t.Errorf("huge output not truncated: %.300q", got)
		}
	})
	t.Run("operator output over max_output_bytes", func(t *testing.T) {
		_, err := e.run(t, strings.Repeat("x", 4000), &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{MaxOutputBytes: proto.Uint64(1024)}})
		wantCode(t, err, codes.ResourceExhausted, "max_output_bytes")
	})
}

func TestAttackTimeoutKillsEverything(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	spec := &environmentv1.EnvironmentSpec{Timeout: durationpb.New(3 * time.Second)}
	_, err := e.run(t, `/tool bash {"command": "sleep 987654 & (setsid sleep 987654 &); sleep 987654", "timeout_seconds": 600}`, spec)
	wantCode(t, err, codes.DeadlineExceeded, "timeout")
	if left := sandboxProcesses(t, "sleep 987654"); len(left) > 0 {
		t.Errorf("processes outlived the timeout: %v", left)
	}
}

func TestAttackInjectedCredentialNeverComesBack(t *testing.T) {
	requireSandbox(t)
	const token = "tok-9f8e7d6c5b4a39281706"
	e := startEnv(t, envOptions{secrets: environment.MapSecrets{"ci-token": token}})
	spec := &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{
		Name:      "ci-token",
		Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "CI_TOKEN"}}},
	}, {
		Name:      "ci-token",
		Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_File{File: &environmentv1.FileInjection{Path: "/run/neuron-test-secrets/token"}}},
	}}}
	got, resp := e.bash(t, `[ "$CI_TOKEN" = "`+token+`" ] && [ "$(cat /run/neuron-test-secrets/token)" = "$CI_TOKEN" ] && echo USABLE; echo "leak: $CI_TOKEN"; printf %s "$CI_TOKEN" | base64`, spec)
	if _, err := os.Stat("/run/neuron-test-secrets"); err == nil {
		t.Error("the file credential appeared on the host")
	}
	if !strings.Contains(got, "USABLE") {
		t.Errorf("the credential is not usable inside: %q", got)
	}
	if !strings.Contains(got, "leak: [REDACTED]") {
		t.Errorf("the echoed credential was not redacted: %q", got)
	}
	b, _ := proto.Marshal(resp)
	if strings.Contains(string(b), token) || strings.Contains(e.logs.String(), token) {
		t.Error("the credential came back in the response or the service's logs")
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func itoa(n int) string { return strconv.Itoa(n) }
