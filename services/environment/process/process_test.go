package process

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/environment"
)

// fakeHost replaces the kernel probes for the test: nil for a probe
// means the host supports it.
func fakeHost(t *testing.T, landlock, cgroup error) {
	t.Helper()
	ll, cg, rp := landlockSupported, cgroupSupported, rootProbe
	t.Cleanup(func() { landlockSupported, cgroupSupported, rootProbe = ll, cg, rp })
	landlockSupported = func() error { return landlock }
	cgroupSupported = func() error { return cgroup }
	rootProbe = func() error { return nil }
}

// newBackend returns a process backend whose work directory is returned
// too. The operator binary is never started by these tests; any
// executable will do.
func newBackend(t *testing.T) (*Backend, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	b, err := New(Config{OperatorBinary: exe, WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	return b, work
}

// The specs a host without kernel support must refuse: every one the
// process backend would otherwise run.
func hostSpecs() map[string]*environmentv1.EnvironmentSpec {
	return map[string]*environmentv1.EnvironmentSpec{
		"empty spec": {},
		"process boundary": {Isolation: []*environmentv1.IsolationBoundary{{
			Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}}},
		"restrictive spec": {
			Isolation: []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}},
			Resources: &environmentv1.ResourceLimits{Memory: proto.String("256Mi"), MaxProcesses: proto.Uint32(64)},
			Network:   &environmentv1.NetworkPolicy{DefaultAction: environmentv1.NetworkAction_NETWORK_ACTION_DENY},
		},
	}
}

// refuses checks that Check refuses every host spec, and that a server
// with this backend answers Run with FAILED_PRECONDITION saying says,
// having provisioned nothing.
func refuses(t *testing.T, says ...string) {
	t.Helper()
	b, work := newBackend(t)
	s, err := environment.NewServer(environment.ServerConfig{Backends: []environment.Backend{b}, Default: "process", Process: "process"})
	if err != nil {
		t.Fatal(err)
	}
	for name, spec := range hostSpecs() {
		err := b.Check(spec)
		if errs.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s: Check = %v, want FAILED_PRECONDITION", name, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err = s.Run(ctx, &environmentv1.RunRequest{Input: &operatorv1.OperatorInput{Message: content.Text("hi")}, Spec: spec})
		cancel()
		if errs.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s: Run = %v, want FAILED_PRECONDITION", name, err)
			continue
		}
		for _, w := range says {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", name, err.Error(), w)
			}
		}
	}
	left, _ := os.ReadDir(work)
	for _, e := range left {
		if e.Name() != ".lock" { // the backend's own, from New
			t.Errorf("a refused spec provisioned %s in the work directory", e.Name())
		}
	}
}

func TestCheckRefusesHostWithoutLandlock(t *testing.T) {
	fakeHost(t, fmt.Errorf("%w: Landlock is not available (test host)", sandbox.ErrUnsupported), nil)
	refuses(t, "the process backend needs Landlock, which this host lacks", "test host")
}

func TestCheckRefusesHostWithoutCgroup(t *testing.T) {
	fakeHost(t, nil, fmt.Errorf("%w: no writable cgroup v2 hierarchy (test host)", sandbox.ErrUnsupported))
	refuses(t, "caps memory and processes with a cgroup, which this host cannot give it", "test host")
}

// A service that is not root cannot give an invocation its own uid and
// a capped workspace: it refuses rather than run one as itself.
func TestCheckRefusesNonRootService(t *testing.T) {
	fakeHost(t, nil, nil)
	rootProbe = func() error { return fmt.Errorf("it runs as uid 1000 (test host)") }
	refuses(t, "needs the service to run as root", "uid 1000 (test host)")
}

// Landlock is probed first: a host lacking both is told about Landlock.
func TestCheckRefusesHostWithoutEither(t *testing.T) {
	fakeHost(t, fmt.Errorf("no landlock (test host)"), fmt.Errorf("no cgroup (test host)"))
	refuses(t, "needs Landlock", "no landlock (test host)")
}

// With both probes passing, the same specs are accepted: the refusals
// above come from the probes alone.
func TestCheckAcceptsHostWithSupport(t *testing.T) {
	fakeHost(t, nil, nil)
	b, _ := newBackend(t)
	for name, spec := range hostSpecs() {
		if err := b.Check(spec); err != nil {
			t.Errorf("%s: Check = %v, want nil on a host with Landlock and a cgroup", name, err)
		}
	}
}

// In production the probes are the sandbox's own.
func TestProbesAreTheSandboxes(t *testing.T) {
	for name, pair := range map[string][2]any{
		"landlock": {landlockSupported, sandbox.Supported},
		"cgroup":   {cgroupSupported, sandbox.CgroupSupported},
	} {
		if reflect.ValueOf(pair[0]).Pointer() != reflect.ValueOf(pair[1]).Pointer() {
			t.Errorf("the %s probe is not the sandbox's", name)
		}
	}
}

// A service killed mid-run leaves its invocations' directories and
// workspace mounts behind; the next start removes them.
func TestNewSweepsWhatAKilledRunLeft(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a workspace needs root")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	ws := filepath.Join(work, "inv-0123456789abcdef", "workspace")
	if err := os.MkdirAll(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	unmount, err := mountWorkspace(ws, 1<<20, sandbox.IDs{UID: 1600000001, GID: 1600000001})
	if err != nil {
		t.Fatal(err)
	}
	defer unmount()
	if err := os.WriteFile(filepath.Join(ws, "notes.md"), []byte("left behind"), 0o600); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(work, "not-an-invocation")
	if err := os.Mkdir(keep, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{OperatorBinary: exe, WorkDir: work}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(ws)); !os.IsNotExist(err) {
		t.Errorf("the left-over invocation is still there: %v", err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), ws) {
		t.Errorf("the left-over workspace is still mounted")
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a directory that is not an invocation's was removed: %v", err)
	}
}

// Two services never share a work directory: each would sweep the
// other's invocations away.
func TestWorkDirOwnedByOneService(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if _, err := New(Config{OperatorBinary: exe, WorkDir: work}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{OperatorBinary: exe, WorkDir: work}); err == nil || !strings.Contains(err.Error(), "in use by another environment service") {
		t.Errorf("a second backend on the same work dir: %v", err)
	}
}
