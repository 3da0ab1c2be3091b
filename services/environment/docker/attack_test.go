package docker

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/docker/internal/probe/report"
)

// The attack tests: a spec, and an image, asking for more than the
// backend grants. Specs the backend must refuse are refused before
// anything is created (TestAttackSpecsRefused, no engine needed; and
// TestAttackEngine's "refused through the server"); what it runs is
// checked twice, on the created container's configuration through the
// engine API and from inside by a probe binary standing in for the
// operator (internal/probe), against a private dockerd.

const (
	probePkg = "github.com/secbear/neuron/services/environment/docker/internal/probe"
	// probeImage is hostile where an image can be: it asks for root and
	// carries a HEALTHCHECK, which would run commands in the container.
	probeImage = "neuron-probe:attack-test"
	// volumeImage also declares a VOLUME, which the engine would create
	// as a writable directory on the host's disk.
	volumeImage = "neuron-probe-volume:attack-test"
)

const probeDockerfile = `FROM scratch
COPY probe /operator
USER 0:0
HEALTHCHECK --interval=1s CMD ["/operator", "health"]
ENTRYPOINT ["/operator"]
`

func fileInj(p string) *environmentv1.CredentialInjection {
	return &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_File{File: &environmentv1.FileInjection{Path: p}}}
}

func envInj(name string) *environmentv1.CredentialInjection {
	return &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: name}}}
}

func containerBoundary(image string) *environmentv1.IsolationBoundary {
	return &environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{Image: image}}}
}

// attackSpec is one hostile spec and the exact code and words of its
// refusal.
type attackSpec struct {
	name string
	spec *environmentv1.EnvironmentSpec
	code codes.Code
	says []string
}

// hostileSpecs are specs asking for more than the docker backend grants,
// each refused by Check.
func hostileSpecs() []attackSpec {
	creds := func(name string, inj *environmentv1.CredentialInjection) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{Name: "key", Injection: inj}}}
	}
	res := func(r *environmentv1.ResourceLimits) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Resources: r}
	}
	boundary := func(b *environmentv1.IsolationBoundary) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{containerBoundary(""), b}}
	}
	fp := codes.FailedPrecondition
	out := []attackSpec{
		// File credentials over the engine's and the kernel's files, the
		// root, system directories, and with ".." segments.
		{"file over the root", creds("key", fileInj("/")), fp, []string{`"/"`, "system directory"}},
		{"file over /etc", creds("key", fileInj("/etc")), fp, []string{"system directory"}},
		{"file over /usr/bin", creds("key", fileInj("/usr/bin")), fp, []string{"system directory"}},
		{"file over /var/run", creds("key", fileInj("/var/run")), fp, []string{"system directory"}},
		{"file in /proc", creds("key", fileInj("/proc/self/attr/current")), fp, []string{"/proc"}},
		{"file at /proc/sysrq-trigger", creds("key", fileInj("/proc/sysrq-trigger")), fp, []string{"/proc"}},
		{"file in /sys", creds("key", fileInj("/sys/fs/cgroup/memory/memory.limit_in_bytes")), fp, []string{"/sys"}},
		{"file in /dev", creds("key", fileInj("/dev/mem")), fp, []string{"/dev"}},
		{"file with .. segments", creds("key", fileInj("/etc/neuron/../../var/run/docker.sock")), fp, []string{"not clean"}},
		{"file with a trailing slash", creds("key", fileInj("/etc/neuron/")), fp, []string{"not clean"}},
		{"relative file", creds("key", fileInj("var/run/docker.sock")), fp, []string{"not absolute"}},
		{"file at /etc/shadow", creds("key", fileInj("/etc/shadow")), fp, []string{"/etc/shadow", "users"}},
		{"file at /etc/passwd", creds("key", fileInj("/etc/passwd")), fp, []string{"users"}},
		{"file at /etc/ld.so.preload", creds("key", fileInj("/etc/ld.so.preload")), fp, []string{"dynamic loader"}},
		{"file in /etc/ld.so.conf.d", creds("key", fileInj("/etc/ld.so.conf.d/evil.conf")), fp, []string{"dynamic loader"}},
		{"file over the CA bundle", creds("key", fileInj("/etc/ssl/certs/ca-certificates.crt")), fp, []string{"certificates"}},
		{"file at /etc/hosts", creds("key", fileInj("/etc/hosts")), fp, []string{"container runtime"}},
		{"file over the operator", creds("key", fileInj("/operator")), fp, []string{"needs"}},
		{"file over the workspace", creds("key", fileInj("/workspace")), fp, []string{"needs"}},
		{"file over the egress socket", creds("key", fileInj("/run/neuron/egress.sock")), fp, []string{"/run/neuron"}},
		{"file in the state socket's directory", creds("key", fileInj("/run/neuron-state/x")), fp, []string{"/run/neuron-state"}},
		{"two files at one path", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{
			{Name: "a", Injection: fileInj("/etc/neuron/key")}, {Name: "b", Injection: fileInj("/etc/neuron/key")},
		}}, fp, []string{"already uses"}},
		// Isolation the backend does not give.
		{"process boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}), fp, []string{"process"}},
		{"custom privileged boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Custom{Custom: &environmentv1.CustomIsolation{BoundaryType: "privileged"}}}), fp, []string{"custom:privileged"}},
		{"microvm", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Microvm{Microvm: &environmentv1.MicroVmIsolation{}}}), fp, []string{"microvm"}},
		{"wasm", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Wasm{Wasm: &environmentv1.WasmIsolation{Runtime: "host"}}}), fp, []string{"wasm"}},
		{"gvisor without a runtime", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Gvisor{Gvisor: &environmentv1.GvisorIsolation{}}}), fp, []string{"gvisor"}},
		// Devices and quantities out of range.
		{"gpu", res(&environmentv1.ResourceLimits{Gpu: ptr("8")}), fp, []string{"resources.gpu"}},
		{"memory below the engine's minimum", res(&environmentv1.ResourceLimits{Memory: ptr("1Ki")}), fp, []string{"resources.memory"}},
		{"memory that reads as zero", res(&environmentv1.ResourceLimits{Memory: ptr("1e30")}), codes.InvalidArgument, []string{"resources.memory", "too large"}},
		{"memory that saturates", res(&environmentv1.ResourceLimits{Memory: ptr("9Ei")}), codes.InvalidArgument, []string{"resources.memory"}},
		{"cpu that wraps negative", res(&environmentv1.ResourceLimits{Cpu: ptr("9Ei")}), codes.InvalidArgument, []string{"resources.cpu"}},
		{"cpu that reads as zero", res(&environmentv1.ResourceLimits{Cpu: ptr("1e30")}), codes.InvalidArgument, []string{"resources.cpu"}},
		{"cpu beyond NanoCPUs", res(&environmentv1.ResourceLimits{Cpu: ptr("1e13")}), codes.InvalidArgument, []string{"resources.cpu"}},
		{"disk that reads as zero", res(&environmentv1.ResourceLimits{Disk: ptr("1e30")}), codes.InvalidArgument, []string{"resources.disk"}},
		{"processes beyond the kernel's", res(&environmentv1.ResourceLimits{MaxProcesses: ptr[uint32](1 << 31)}), codes.InvalidArgument, []string{"resources.max_processes", "kernel"}},
	}
	// Variables that change how the loader, a shell or a client behaves,
	// or that belong to the service.
	for _, v := range []string{"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "ld_preload", "PATH", "BASH_ENV", "ENV", "IFS",
		"SHELLOPTS", "PS4", "BASH_FUNC_ls%%", "GCONV_PATH", "GLIBC_TUNABLES", "MALLOC_CHECK_", "HOSTALIASES", "HOME", "TMPDIR",
		"DOCKER_HOST", "DOCKER_CONFIG", "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "HTTPS_PROXY", "http_proxy", "SSL_CERT_FILE",
		"GODEBUG", "NEURON_EGRESS_SOCKET", "NEURON_OPERATOR_TOOLS"} {
		out = append(out, attackSpec{"env " + v, creds("key", envInj(v)), fp, []string{"environment variable", v}})
	}
	return out
}

// TestAttackSpecsRefused: each hostile spec is refused by Check, and by
// Run before anything is provisioned (the engine here does not exist:
// Run would fail UNAVAILABLE if it got that far).
func TestAttackSpecsRefused(t *testing.T) {
	for _, tc := range hostileSpecs() {
		t.Run(tc.name, func(t *testing.T) {
			workDir := shortDir(t)
			b, err := New(Config{Host: "unix:///nonexistent/docker.sock", DefaultImage: "x:1", WorkDir: workDir})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			wantCode(t, b.Check(tc.spec), tc.code, tc.says...)

			inv := invocation(t, "attack", &operatorv1.OperatorInput{Message: content.Text("hi")})
			inv.Spec = tc.spec
			for _, c := range tc.spec.GetCredentials() {
				inv.Credentials = append(inv.Credentials, environment.Credential{Name: c.GetName(), Value: "v", Injection: c.GetInjection()})
			}
			_, err = b.Run(context.Background(), inv)
			wantCode(t, err, tc.code, tc.says...)
			assertEmptyDir(t, workDir)
		})
	}

	// Credentials the server resolved but the spec does not show (Run
	// checks what it places, not only the spec).
	t.Run("resolved credentials", func(t *testing.T) {
		b, err := New(Config{Host: "unix:///nonexistent/docker.sock", DefaultImage: "x:1", WorkDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for _, inj := range []*environmentv1.CredentialInjection{envInj("LD_PRELOAD"), fileInj("/proc/1/root")} {
			inv := invocation(t, "attack", &operatorv1.OperatorInput{Message: content.Text("hi")})
			inv.Credentials = []environment.Credential{{Name: "key", Value: "v", Injection: inj}}
			_, err := b.Run(context.Background(), inv)
			wantCode(t, err, codes.FailedPrecondition, "credentials[0]")
		}
	})
}

// TestAttackSafeCredentialsAllowed: the guards refuse only what they
// must; ordinary names and paths still work.
func TestAttackSafeCredentialsAllowed(t *testing.T) {
	b, err := New(Config{Host: "unix:///nonexistent/docker.sock", DefaultImage: "x:1", WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	spec := &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{
		{Name: "a", Injection: envInj("ANTHROPIC_API_KEY")},
		{Name: "b", Injection: envInj("GITHUB_TOKEN")},
		{Name: "c", Injection: envInj("PATHNAME")},
		{Name: "d", Injection: fileInj("/etc/neuron/key")},
		{Name: "e", Injection: fileInj("/var/run/docker.sock")},
		{Name: "f", Injection: fileInj("/workspace/.netrc")},
		{Name: "g", Injection: fileInj("/home/nonroot/.config/gh/hosts.yml")},
	}, Resources: &environmentv1.ResourceLimits{Cpu: ptr("2"), Memory: ptr("7Ei"), Disk: ptr("10Gi"), MaxProcesses: ptr[uint32](maxPIDs)}}
	if err := b.Check(spec); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

// TestDefaultLimits: a container gets the backend's CPU, memory,
// process, disk and output limits where neither the spec nor the
// service's defaults set one; the output bound holds whatever they say.
func TestDefaultLimits(t *testing.T) {
	b, err := New(Config{Host: "unix:///nonexistent/docker.sock", WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := b.limits(environment.Limits{CPUMillis: -1000})
	want := environment.Limits{CPUMillis: 1000, MemoryBytes: 2 << 30, DiskBytes: 1 << 30, MaxProcesses: 256, MaxOutputBytes: 16 << 20}
	if got != want {
		t.Fatalf("limits %+v, want %+v", got, want)
	}
	spec := environment.Limits{CPUMillis: 250, MemoryBytes: 64 << 20, DiskBytes: 8 << 20, MaxProcesses: 9, MaxOutputBytes: 1 << 62}
	if got := b.limits(spec); got.CPUMillis != 250 || got.MemoryBytes != 64<<20 || got.DiskBytes != 8<<20 || got.MaxProcesses != 9 || got.MaxOutputBytes != 1<<30 {
		t.Fatalf("limits %+v: want the spec's, output bounded at 1 GiB", got)
	}

	b2, err := New(Config{Host: "unix:///nonexistent/docker.sock", WorkDir: t.TempDir(), DefaultLimits: environment.Limits{DiskBytes: 5 << 20, CPUMillis: 300}})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if got := b2.limits(environment.Limits{}); got.DiskBytes != 5<<20 || got.CPUMillis != 300 || got.MemoryBytes != 2<<30 {
		t.Fatalf("limits %+v with Config.DefaultLimits", got)
	}

	if _, err := New(Config{Host: "unix:///nonexistent/docker.sock", WorkDir: t.TempDir(), DefaultLimits: environment.Limits{MemoryBytes: 1}}); err == nil {
		t.Fatal("New accepted a default memory limit below the engine's minimum")
	}
}

// TestAttackEngine runs hostile specs and a hostile image through a
// private dockerd.
func TestAttackEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dockerd and builds images")
	}
	if _, err := os.Stat(caBundle); err != nil {
		t.Skipf("no CA bundle at %s for the image: apt-get install ca-certificates", caBundle)
	}
	eng := testenv.Docker(t)
	probe := filepath.Join(t.TempDir(), "probe")
	if err := os.Link(testenv.BuildStatic(t, probePkg), probe); err != nil {
		t.Fatal(err)
	}
	cli, err := client.New(client.WithHost(eng.Host))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	dir := t.TempDir()
	for tag, df := range map[string]string{probeImage: probeDockerfile, volumeImage: probeDockerfile + "VOLUME /data\n"} {
		p := filepath.Join(dir, strings.Split(tag, ":")[0]+".Dockerfile")
		if err := os.WriteFile(p, []byte(df), 0o644); err != nil {
			t.Fatal(err)
		}
		buildImage(t, cli, p, probe, tag)
	}

	workDir := t.TempDir()
	b, err := New(Config{
		Host:         eng.Host,
		DefaultImage: probeImage,
		WorkDir:      workDir,
		// A small default disk, so that filling it is quick.
		DefaultLimits: environment.Limits{DiskBytes: 24 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	host := hostNamespaces(t)

	clean := func(t *testing.T) {
		t.Helper()
		if left := containers(t, cli); len(left) != 0 {
			t.Fatalf("%d containers left behind, e.g. %s (%s)", len(left), left[0].ID, left[0].State)
		}
		vols, err := cli.VolumeList(ctx, client.VolumeListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(vols.Items) != 0 {
			t.Fatalf("%d volumes left behind, e.g. %s", len(vols.Items), vols.Items[0].Name)
		}
		assertEmptyDir(t, workDir)
	}

	t.Run("hostile spec probed from inside", func(t *testing.T) {
		got := inspectAfterCreate(t, b, cli)
		inv := invocation(t, "probe", &operatorv1.OperatorInput{Message: content.Text("escape")})
		allow := environmentv1.NetworkAction_NETWORK_ACTION_ALLOW
		inv.Spec = &environmentv1.EnvironmentSpec{
			Isolation: []*environmentv1.IsolationBoundary{
				containerBoundary(probeImage),
				{Kind: &environmentv1.IsolationBoundary_NetworkPolicy{NetworkPolicy: &environmentv1.NetworkPolicyIsolation{Rules: []*environmentv1.NetworkRule{
					{Destination: "0.0.0.0/0", Action: allow}, {Destination: "::/0", Action: allow},
				}}}},
			},
			Network: &environmentv1.NetworkPolicy{DefaultAction: allow, Rules: []*environmentv1.NetworkRule{{Destination: "127.0.0.1", Action: allow}}},
			Credentials: []*environmentv1.CredentialRef{
				{Name: "engine-socket", Injection: fileInj("/var/run/docker.sock")},
				{Name: "key", Injection: fileInj("/etc/neuron/key")},
				{Name: "paths", Injection: envInj("PROBE_READ")},
			},
			Resources: &environmentv1.ResourceLimits{Cpu: ptr("500m"), Memory: ptr("256Mi"), Disk: ptr("8Mi"), MaxProcesses: ptr[uint32](32), CpuTime: durationpb.New(30 * time.Second)},
		}
		lim, err := environment.ParseLimits(inv.Spec.Resources, environment.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		lim.MaxOutputBytes = 1 << 20
		inv.Limits = lim
		inv.Credentials = []environment.Credential{
			{Name: "engine-socket", Value: "engine-socket-secret", Injection: inv.Spec.Credentials[0].Injection},
			{Name: "key", Value: "key-secret", Injection: inv.Spec.Credentials[1].Injection},
			{Name: "paths", Value: "/var/run/docker.sock,/etc/neuron/key", Injection: inv.Spec.Credentials[2].Injection},
		}
		var egressCalls, stateCalls atomic.Int32
		inv.Egress = serveSocket(t, &egressCalls)
		inv.State = serveSocket(t, &stateCalls)

		res, err := b.Run(ctx, inv)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		r := decodeReport(t, res.Output)
		if testing.Verbose() {
			t.Logf("probe report: %s", content.TextOf(res.Output.GetMessage()))
		}
		c := got.get(t)
		assertHostConfig(t, c, workDir)
		assertLimits(t, c.HostConfig, 256<<20, 500_000_000, 32, 8<<20)
		assertMounts(t, c, workDir, map[string]string{
			EgressSocket: "egress/egress.sock", StateSocket: "state/state.sock",
			"/var/run/docker.sock": "credentials/0", "/etc/neuron/key": "credentials/1",
		})
		assertInside(t, r, host)

		// The credentials are files, not the engine's socket.
		if r.Files["/var/run/docker.sock"] != "engine-socket-secret" || r.Files["/etc/neuron/key"] != "key-secret" {
			t.Errorf("credential files read %q", r.Files)
		}
		if got := r.Sockets; !slices.Equal(got, []string{StateSocket, EgressSocket}) {
			t.Errorf("sockets inside %q, want only the state and egress sockets", got)
		}
		for d, want := range map[string]string{"/run/neuron": "egress.sock", "/run/neuron-state": "state.sock"} {
			if got := r.Dirs[d]; !slices.Equal(got, []string{want}) {
				t.Errorf("%s holds %q, want only %s", d, got, want)
			}
		}
		for _, m := range []string{"/run/neuron", "/run/neuron-state"} {
			if hasMountPoint(r.MountInfo, m) {
				t.Errorf("%s is a mount point: a socket's directory is mounted, not the socket alone", m)
			}
		}
		// The disk limit: the workspace is 8 MiB and full at 8 MiB.
		if r.Sizes["/workspace"] != 8<<20 || r.Filled > 8<<20 || r.FillErr != "ENOSPC" {
			t.Errorf("workspace of %d bytes took %d bytes before %q; want 8 MiB, ENOSPC", r.Sizes["/workspace"], r.Filled, r.FillErr)
		}
		clean(t)
	})

	t.Run("default disk and CPU", func(t *testing.T) {
		got := inspectAfterCreate(t, b, cli)
		inv := invocation(t, "defaults", &operatorv1.OperatorInput{Message: content.Text("fill")})
		res, err := b.Run(ctx, inv)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		r := decodeReport(t, res.Output)
		// No disk and no CPU in the spec nor the invocation's limits:
		// Config.DefaultLimits' 24 MiB and the package's one core.
		c := got.get(t)
		assertLimits(t, c.HostConfig, 512<<20, 1_000_000_000, 128, 24<<20)
		if r.Sizes["/workspace"] != 24<<20 || r.Filled > 24<<20 || r.FillErr != "ENOSPC" {
			t.Errorf("workspace of %d bytes took %d bytes before %q; want 24 MiB, ENOSPC", r.Sizes["/workspace"], r.Filled, r.FillErr)
		}
		clean(t)
	})

	t.Run("image volume refused", func(t *testing.T) {
		var started atomic.Bool
		b.afterCreate = func(context.Context, string) { started.Store(true) }
		t.Cleanup(func() { b.afterCreate = nil })
		inv := invocation(t, "volume", &operatorv1.OperatorInput{Message: content.Text("hi")})
		inv.Spec.Isolation = []*environmentv1.IsolationBoundary{containerBoundary(volumeImage)}
		_, err := b.Run(ctx, inv)
		wantCode(t, err, codes.FailedPrecondition, "VOLUME", "/data")
		if started.Load() {
			t.Error("the container with a volume got past verification")
		}
		clean(t)
	})

	t.Run("hostile image names", func(t *testing.T) {
		for _, image := range []string{"docker:dind", "registry.example/evil:latest", "--privileged", "/var/run/docker.sock", "../../etc", "probe:../../x"} {
			inv := invocation(t, "image", &operatorv1.OperatorInput{Message: content.Text("hi")})
			inv.Spec.Isolation = []*environmentv1.IsolationBoundary{containerBoundary(image)}
			_, err := b.Run(ctx, inv)
			wantCode(t, err, codes.FailedPrecondition)
			clean(t)
		}
		// Nothing was pulled: the engine still holds only the two
		// probe images (and what the builds left).
		imgs, err := cli.ImageList(ctx, client.ImageListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, img := range imgs.Items {
			for _, tag := range img.RepoTags {
				if tag != probeImage && tag != volumeImage && tag != "<none>:<none>" {
					t.Errorf("image %s appeared on the engine", tag)
				}
			}
		}
	})

	t.Run("refused through the server", func(t *testing.T) {
		var created atomic.Int32
		b.afterCreate = func(context.Context, string) { created.Add(1) }
		t.Cleanup(func() { b.afterCreate = nil })
		srv, err := environment.NewServer(environment.ServerConfig{
			Backends: []environment.Backend{b}, Default: backendName, Container: backendName,
			Secrets: environment.MapSecrets{"key": "v", "a": "v", "b": "v"},
			Egress: func(string, environment.NetworkPolicy, []environment.Credential, *slog.Logger) (func(), error) {
				t.Error("an egress proxy was started for a refused spec")
				return func() {}, nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range hostileSpecs() {
			_, err := srv.Run(ctx, &environmentv1.RunRequest{
				Input: &operatorv1.OperatorInput{Message: content.Text("hi")},
				Spec:  tc.spec,
			})
			if err == nil {
				t.Errorf("%s: the server ran it", tc.name)
				continue
			}
			if tc.name == "memory below the engine's minimum" && errs.Code(err) == codes.InvalidArgument {
				// A service floor above the engine's minimum refuses it
				// first (Defaults.MinMemoryBytes, where there is one).
				continue
			}
			wantCode(t, err, tc.code, tc.says...)
		}
		if n := created.Load(); n != 0 {
			t.Errorf("%d containers created for refused specs", n)
		}
		clean(t)
	})
}

// shortDir is a temporary directory with a short path (a subtest's
// t.TempDir can be too long for a socket below it).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "dka")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// serveSocket returns an Invocation.Egress (or State) that serves HTTP on
// the socket and counts requests.
func serveSocket(t *testing.T, calls *atomic.Int32) func(string) (func(), error) {
	return func(path string) (func(), error) {
		l, err := net.Listen("unix", path)
		if err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			calls.Add(1)
			w.WriteHeader(http.StatusForbidden)
		})}
		go func() { _ = srv.Serve(l) }()
		return func() { _ = srv.Close() }, nil
	}
}

func decodeReport(t *testing.T, out *operatorv1.OperatorOutput) *report.Report {
	t.Helper()
	var r report.Report
	if err := json.Unmarshal([]byte(content.TextOf(out.GetMessage())), &r); err != nil {
		t.Fatalf("the probe's report: %v\n%s", err, content.TextOf(out.GetMessage()))
	}
	return &r
}

// hostNamespaces are this process's namespaces, which the container's
// must differ from.
func hostNamespaces(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, ns := range []string{"cgroup", "ipc", "mnt", "net", "pid", "uts"} {
		l, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			t.Fatalf("namespace %s: %v", ns, err)
		}
		out[ns] = l
	}
	return out
}

// assertHostConfig checks what the container was created with, through
// the engine's API.
func assertHostConfig(t *testing.T, c *container.InspectResponse, workDir string) {
	t.Helper()
	hc, cfg := c.HostConfig, c.Config
	if hc.Privileged {
		t.Error("privileged")
	}
	if len(hc.CapAdd) != 0 || !slices.Equal(hc.CapDrop, []string{"ALL"}) {
		t.Errorf("cap add %v, cap drop %v; want none added, ALL dropped", hc.CapAdd, hc.CapDrop)
	}
	if !slices.Contains(hc.SecurityOpt, "no-new-privileges") {
		t.Errorf("security opts %v lack no-new-privileges", hc.SecurityOpt)
	}
	for _, o := range hc.SecurityOpt {
		if strings.Contains(o, "unconfined") || strings.HasPrefix(o, "seccomp") || strings.HasPrefix(o, "apparmor") {
			t.Errorf("security opt %q replaces a default profile", o)
		}
	}
	if string(hc.NetworkMode) != "none" {
		t.Errorf("network mode %q, want none", hc.NetworkMode)
	}
	if hc.PidMode != "" || !hc.IpcMode.IsPrivate() || hc.UTSMode != "" || hc.UsernsMode != "" || !hc.CgroupnsMode.IsPrivate() {
		t.Errorf("namespaces: pid %q ipc %q uts %q userns %q cgroupns %q; want private", hc.PidMode, hc.IpcMode, hc.UTSMode, hc.UsernsMode, hc.CgroupnsMode)
	}
	if !hc.ReadonlyRootfs {
		t.Error("writable root file system")
	}
	if len(hc.Devices) != 0 || len(hc.DeviceRequests) != 0 || len(hc.DeviceCgroupRules) != 0 {
		t.Errorf("devices %v, requests %v, rules %v", hc.Devices, hc.DeviceRequests, hc.DeviceCgroupRules)
	}
	if len(hc.Binds) != 0 || len(hc.VolumesFrom) != 0 || len(hc.Links) != 0 || len(hc.PortBindings) != 0 || hc.PublishAllPorts {
		t.Errorf("binds %v, volumes from %v, links %v, ports %v/%v", hc.Binds, hc.VolumesFrom, hc.Links, hc.PortBindings, hc.PublishAllPorts)
	}
	if len(hc.Sysctls) != 0 || hc.OomKillDisable != nil && *hc.OomKillDisable {
		t.Errorf("sysctls %v, oom kill disabled %v", hc.Sysctls, hc.OomKillDisable)
	}
	if hc.Runtime != "" && hc.Runtime != "runc" {
		t.Errorf("runtime %q", hc.Runtime)
	}
	if cfg.User != ContainerUser {
		t.Errorf("user %q, want %s whatever the image says", cfg.User, ContainerUser)
	}
	if cfg.Healthcheck == nil || !slices.Equal(cfg.Healthcheck.Test, []string{"NONE"}) {
		t.Errorf("healthcheck %+v, want the image's disabled", cfg.Healthcheck)
	}
	for _, m := range c.Mounts {
		if m.Type != mount.TypeBind || m.RW || !strings.HasPrefix(m.Source, workDir+"/") {
			t.Errorf("mount %+v: want only read-only binds from the invocation's directory", m)
		}
	}
}

// assertLimits checks the container's cgroup limits and the size of its
// writable places.
func assertLimits(t *testing.T, hc *container.HostConfig, memory, nanoCPUs, pids, disk int64) {
	t.Helper()
	r := hc.Resources
	if r.Memory != memory || r.MemorySwap != memory || r.NanoCPUs != nanoCPUs || r.PidsLimit == nil || *r.PidsLimit != pids {
		t.Errorf("memory %d, swap %d, nano CPUs %d, pids %v; want %d, %d, %d, %d", r.Memory, r.MemorySwap, r.NanoCPUs, r.PidsLimit, memory, memory, nanoCPUs, pids)
	}
	want := map[string]string{
		Workspace: "rw,nosuid,nodev,size=" + strconv.FormatInt(disk, 10) + ",uid=65532,gid=65532,mode=0755",
		"/tmp":    "rw,nosuid,nodev,size=67108864,mode=1777",
	}
	if len(hc.Tmpfs) != len(want) || hc.Tmpfs[Workspace] != want[Workspace] || hc.Tmpfs["/tmp"] != want["/tmp"] {
		t.Errorf("tmpfs %v, want %v", hc.Tmpfs, want)
	}
	if hc.ShmSize != shmSize {
		t.Errorf("shm size %d, want %d", hc.ShmSize, shmSize)
	}
}

// assertMounts checks the container has exactly the bind mounts want
// (target -> source below the invocation's directory), each of one file,
// read-only.
func assertMounts(t *testing.T, c *container.InspectResponse, workDir string, want map[string]string) {
	t.Helper()
	if len(c.HostConfig.Mounts) != len(want) {
		t.Errorf("mounts %+v, want %d", c.HostConfig.Mounts, len(want))
	}
	for _, m := range c.HostConfig.Mounts {
		rel, ok := want[m.Target]
		if !ok {
			t.Errorf("unexpected mount at %s", m.Target)
			continue
		}
		if m.Type != mount.TypeBind || !m.ReadOnly || !strings.HasPrefix(m.Source, workDir+"/inv") || !strings.HasSuffix(m.Source, "/"+rel) {
			t.Errorf("mount %+v, want a read-only bind of <invocation dir>/%s", m, rel)
		}
	}
}

// assertInside checks what the probe saw from inside.
func assertInside(t *testing.T, r *report.Report, host map[string]string) {
	t.Helper()
	if r.UID != 65532 || r.EUID != 65532 || r.GID != 65532 || slices.Contains(r.Groups, 0) {
		t.Errorf("uid %d euid %d gid %d groups %v; want 65532 and no root group", r.UID, r.EUID, r.GID, r.Groups)
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if v := r.Status[k]; v != "0000000000000000" {
			t.Errorf("%s = %q, want no capabilities", k, v)
		}
	}
	if r.Status["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs = %q", r.Status["NoNewPrivs"])
	}
	if r.Status["Seccomp"] != "2" {
		t.Errorf("Seccomp = %q, want 2 (a filter)", r.Status["Seccomp"])
	}
	for ns, h := range host {
		if r.Namespaces[ns] == h || r.Namespaces[ns] == "" {
			t.Errorf("namespace %s inside %q, the host's %q", ns, r.Namespaces[ns], h)
		}
	}
	if r.PID != 1 {
		t.Errorf("pid %d, want 1 in a pid namespace of its own", r.PID)
	}
	if !slices.Equal(r.Interfaces, []string{"lo"}) {
		t.Errorf("interfaces %v, want only lo", r.Interfaces)
	}
	for target, e := range r.Dials {
		if e == "" {
			t.Errorf("connected to %s", target)
		}
	}
	for p, e := range r.Writes {
		if p == "/workspace/probe" || p == "/tmp/probe" {
			if e != "" {
				t.Errorf("writing %s: %s", p, e)
			}
			continue
		}
		if e == "" {
			t.Errorf("wrote %s", p)
		}
	}
	for call, e := range r.Syscalls {
		if e == "" {
			t.Errorf("%s succeeded", call)
		}
	}
	standard := []string{"console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}
	for d, mode := range r.Devices {
		if !slices.Contains(standard, d) {
			t.Errorf("device /dev/%s (%s) beyond the standard set", d, mode)
		}
	}
	if r.Sizes["/tmp"] != tmpSize || r.Sizes["/dev/shm"] != shmSize {
		t.Errorf("/tmp of %d bytes, /dev/shm of %d; want %d and %d", r.Sizes["/tmp"], r.Sizes["/dev/shm"], tmpSize, shmSize)
	}
	for _, line := range strings.Split(r.MountInfo, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		point, opts := f[4], f[5]
		if point == "/" || strings.HasPrefix(point, "/run/") || strings.HasPrefix(point, "/etc/") || strings.HasPrefix(point, "/var/") {
			if !slices.Contains(strings.Split(opts, ","), "ro") {
				t.Errorf("mount %s is writable: %s", point, line)
			}
		}
	}
	for _, e := range r.Env {
		if name, _, _ := strings.Cut(e, "="); name != "PATH" && name != "PROBE_READ" && name != "HOSTNAME" && name != "HOME" {
			t.Errorf("environment variable %s inside", name)
		}
	}
	if r.Input == 0 {
		t.Error("the probe got no input")
	}
	// The engine's cgroup limits, seen from inside.
	for file, want := range map[string]string{
		"/sys/fs/cgroup/memory/memory.limit_in_bytes": "268435456",
		"/sys/fs/cgroup/pids/pids.max":                "32",
		"/sys/fs/cgroup/cpu/cpu.cfs_quota_us":         "50000",
	} {
		if got, ok := r.Cgroup[file]; ok && got != want {
			t.Errorf("%s = %s, want %s", file, got, want)
		}
	}
	if len(r.Cgroup) == 0 {
		t.Error("no cgroup limit readable inside")
	}
}

// hasMountPoint reports whether mountinfo has a mount at point.
func hasMountPoint(mountinfo, point string) bool {
	for _, line := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == point {
			return true
		}
	}
	return false
}
