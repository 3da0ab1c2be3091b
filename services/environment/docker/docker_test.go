package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

const (
	operatorPkg = "github.com/secbear/neuron/services/operator/cmd/operator"
	testImage   = "neuron-operator:docker-backend-test"
	caBundle    = "/etc/ssl/certs/ca-certificates.crt"
)

func ptr[T any](v T) *T { return &v }

// wantCode fails t unless err maps to code and its message contains
// every one of says.
func wantCode(t *testing.T, err error, code codes.Code, says ...string) {
	t.Helper()
	if got := errs.Code(err); got != code {
		t.Fatalf("error %v: code %v, want %v", err, got, code)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not mention %q", err, s)
		}
	}
}

func TestCheck(t *testing.T) {
	boundary := func(b *environmentv1.IsolationBoundary) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{b}}
	}
	ctr := &environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{}}}
	gvisor := &environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Gvisor{Gvisor: &environmentv1.GvisorIsolation{}}}
	fileCred := func(path string) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{
			Name:      "key",
			Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_File{File: &environmentv1.FileInjection{Path: path}}},
		}}}
	}
	tests := []struct {
		name string
		cfg  Config
		spec *environmentv1.EnvironmentSpec
		code codes.Code
		says []string
	}{
		{"empty spec", Config{}, &environmentv1.EnvironmentSpec{}, codes.OK, nil},
		{"container and network policy", Config{}, &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{
			ctr,
			{Kind: &environmentv1.IsolationBoundary_NetworkPolicy{NetworkPolicy: &environmentv1.NetworkPolicyIsolation{}}},
		}}, codes.OK, nil},
		{"gvisor with a runtime", Config{Runtime: "runsc"}, &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{ctr, gvisor}}, codes.OK, nil},
		{"gvisor without a runtime", Config{}, boundary(gvisor), codes.FailedPrecondition, []string{"gvisor", "runsc"}},
		{"process", Config{}, boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}), codes.FailedPrecondition, []string{"process"}},
		{"microvm", Config{}, boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Microvm{Microvm: &environmentv1.MicroVmIsolation{}}}), codes.FailedPrecondition, []string{"microvm"}},
		{"custom", Config{}, boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Custom{Custom: &environmentv1.CustomIsolation{BoundaryType: "firecracker"}}}), codes.FailedPrecondition, []string{"custom:firecracker"}},
		{"gpu", Config{}, &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Gpu: ptr("1")}}, codes.FailedPrecondition, []string{"resources.gpu", "no GPUs"}},
		{"disk", Config{}, &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Disk: ptr("1Gi")}}, codes.OK, nil},
		{"memory below the engine's minimum", Config{}, &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Memory: ptr("1Mi")}}, codes.FailedPrecondition, []string{"resources.memory", "minimum"}},
		{"malformed quantity", Config{}, &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Memory: ptr("lots")}}, codes.InvalidArgument, []string{"resources.memory"}},
		{"relative file credential", Config{}, fileCred("etc/key"), codes.FailedPrecondition, []string{"credentials[0]", "not absolute"}},
		{"file credential over the workspace", Config{}, fileCred("/workspace"), codes.FailedPrecondition, []string{"credentials[0]", "/workspace"}},
		{"file credential under the egress dir", Config{}, fileCred("/run/neuron/egress.sock"), codes.FailedPrecondition, []string{"/run/neuron"}},
		{"absolute file credential", Config{}, fileCred("/etc/neuron/key"), codes.OK, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Host = "unix:///nonexistent/docker.sock"
			cfg.WorkDir = t.TempDir()
			if cfg.DefaultImage == "" {
				cfg.DefaultImage = "neuron-operator:latest"
			}
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			err = b.Check(tc.spec)
			if tc.code == codes.OK {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			wantCode(t, err, tc.code, tc.says...)
		})
	}

	t.Run("no image", func(t *testing.T) {
		b, err := New(Config{Host: "unix:///nonexistent/docker.sock", WorkDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		wantCode(t, b.Check(&environmentv1.EnvironmentSpec{}), codes.FailedPrecondition, "no image")
		// The spec's own image is enough.
		spec := &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{Image: "x:1"}}}}}
		if err := b.Check(spec); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNewRefusesLongWorkDir(t *testing.T) {
	_, err := New(Config{Host: "unix:///nonexistent/docker.sock", WorkDir: "/" + strings.Repeat("d", 100)})
	if err == nil || !strings.Contains(err.Error(), "Unix socket") {
		t.Fatalf("New with a 100-byte work dir: %v", err)
	}
}

func TestRunEngineUnreachable(t *testing.T) {
	b, err := New(Config{Host: "unix:///nonexistent/docker.sock", DefaultImage: "x:1", WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	inv := invocation(t, "unreachable", &operatorv1.OperatorInput{Message: content.Text("hi")})
	_, err = b.Run(context.Background(), inv)
	wantCode(t, err, codes.Unavailable, "unreachable")
	if errs.Reason(err) != errs.ReasonRetryable {
		t.Fatalf("reason %q, want %q", errs.Reason(err), errs.ReasonRetryable)
	}
	assertEmptyDir(t, b.workDir)
}

func TestRunRefusesDefaultLimits(t *testing.T) {
	b, err := New(Config{Host: "unix:///nonexistent/docker.sock", DefaultImage: "x:1", WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// A service default the spec does not mention is refused like one
	// the spec sets, before anything is provisioned.
	inv := invocation(t, "gpu", &operatorv1.OperatorInput{Message: content.Text("hi")})
	inv.Limits.GPUs = 1
	_, err = b.Run(context.Background(), inv)
	wantCode(t, err, codes.FailedPrecondition, "resources.gpu")
}

func TestBuildContext(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"Dockerfile": "FROM scratch\nCOPY operator /operator\n",
		"ca.pem":     "-----BEGIN CERTIFICATE-----\n",
		"operator":   strings.Repeat("\x7fELF binary ", 1000) + "end", // not a multiple of 512
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r, err := BuildContext(filepath.Join(dir, "Dockerfile"), filepath.Join(dir, "operator"), filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw)%512 != 0 {
		t.Fatalf("tar stream of %d bytes is not whole blocks", len(raw))
	}
	want := map[string]struct {
		data string
		mode int64
	}{
		"Dockerfile":          {files["Dockerfile"], 0o644},
		"ca-certificates.crt": {files["ca.pem"], 0o644},
		"operator":            {files["operator"], 0o755},
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	seen := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		w, ok := want[h.Name]
		if !ok {
			t.Fatalf("unexpected entry %q", h.Name)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != w.data || h.Mode != w.mode || h.Uid != 0 || h.Typeflag != tar.TypeReg {
			t.Fatalf("entry %q: mode %o uid %d, %d bytes; want mode %o, %d bytes", h.Name, h.Mode, h.Uid, len(data), w.mode, len(w.data))
		}
		seen++
	}
	if seen != len(want) {
		t.Fatalf("%d entries, want %d", seen, len(want))
	}

	if _, err := BuildContext(filepath.Join(dir, "Dockerfile"), filepath.Join(dir, "missing"), filepath.Join(dir, "ca.pem")); err == nil {
		t.Fatal("BuildContext with a missing binary succeeded")
	}
	if _, err := BuildContext(filepath.Join(dir, "Dockerfile"), filepath.Join(dir, "Dockerfile"), filepath.Join(dir, "ca.pem")); err == nil {
		t.Fatal("BuildContext with a binary named Dockerfile succeeded")
	}
}

func TestBuffers(t *testing.T) {
	c := &cappedBuffer{max: 10}
	if _, err := c.Write([]byte("12345")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("678901")); !errors.Is(err, errOutputLimit) {
		t.Fatalf("write past the cap: %v", err)
	}
	if _, err := c.Write([]byte("67890")); err != nil || string(c.Bytes()) != "1234567890" {
		t.Fatalf("write up to the cap: %v, %q", err, c.Bytes())
	}
	if _, err := (&cappedBuffer{}).Write(make([]byte, 1<<20)); err != nil {
		t.Fatalf("no cap: %v", err)
	}

	tb := &tailBuffer{max: 8}
	for _, s := range []string{"abc", "defgh", "ijklmnopq", "rs"} {
		if n, err := tb.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write: %d, %v", n, err)
		}
	}
	if got, want := string(tb.Bytes()), "[11 earlier bytes of stderr dropped]\nlmnopqrs"; got != want {
		t.Fatalf("tail %q, want %q", got, want)
	}
	short := &tailBuffer{max: 8}
	_, _ = short.Write([]byte("abc"))
	if string(short.Bytes()) != "abc" {
		t.Fatalf("short tail %q", short.Bytes())
	}
}

// invocation returns an invocation of input with modest limits and an
// empty spec.
func invocation(t *testing.T, id string, input *operatorv1.OperatorInput) *environment.Invocation {
	t.Helper()
	raw, err := protojson.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	return &environment.Invocation{
		ID:        id,
		Input:     input,
		InputJSON: raw,
		Spec:      &environmentv1.EnvironmentSpec{},
		Limits: environment.Limits{
			MemoryBytes:    512 << 20,
			MaxProcesses:   128,
			MaxOutputBytes: 1 << 20,
		},
		Timeout: 2 * time.Minute,
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// assertEmptyDir fails t unless dir has no entries: every per-invocation
// directory was removed.
func assertEmptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("%s still holds %d entries, e.g. %s", dir, len(entries), entries[0].Name())
	}
}

// buildImage builds tag from dockerfile, the binary and the CA bundle
// through the engine's build API.
func buildImage(t *testing.T, cli *client.Client, dockerfile, binary, tag string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := BuildImage(ctx, cli, dockerfile, binary, caBundle, tag); err != nil {
		t.Fatal(err)
	}
}

// containers returns the containers, running or not, that carry the
// invocation label.
func containers(t *testing.T, cli *client.Client) []container.Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", LabelInvocation)})
	if err != nil {
		t.Fatalf("listing containers: %v", err)
	}
	return res.Items
}

// inspected is what the afterCreate hook saw of the container.
type inspected struct {
	mu sync.Mutex
	c  *container.InspectResponse
}

func (i *inspected) get(t *testing.T) *container.InspectResponse {
	t.Helper()
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.c == nil {
		t.Fatal("the afterCreate hook saw no container")
	}
	return i.c
}

// inspectAfterCreate sets b's hook to record the created container.
func inspectAfterCreate(t *testing.T, b *Backend, cli *client.Client) *inspected {
	t.Helper()
	var got inspected
	b.afterCreate = func(ctx context.Context, id string) {
		res, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil {
			t.Errorf("inspecting the created container: %v", err)
			return
		}
		got.mu.Lock()
		got.c = &res.Container
		got.mu.Unlock()
	}
	t.Cleanup(func() { b.afterCreate = nil })
	return &got
}

// withoutPath drops the PATH the engine adds to every container.
func withoutPath(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(s string) bool { return strings.HasPrefix(s, "PATH=") })
}

// anthropicReply is a Messages API response saying text.
func anthropicReply(text string) string {
	return `{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5",` +
		`"content":[{"type":"text","text":` + strings.TrimSpace(mustJSON(text)) + `}],` +
		`"stop_reason":"end_turn","stop_sequence":null,` +
		`"usage":{"input_tokens":12,"output_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}`
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestBackend runs invocations through a private dockerd and the real
// operator image: every subtest shares the engine and the image.
func TestBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dockerd and builds the operator image")
	}
	if _, err := os.Stat(caBundle); err != nil {
		t.Skipf("no CA bundle at %s for the image: apt-get install ca-certificates", caBundle)
	}
	eng := testenv.Docker(t)
	bin := testenv.BuildStatic(t, operatorPkg)
	cli, err := client.New(client.WithHost(eng.Host))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	buildImage(t, cli, "../../operator/Dockerfile", bin, testImage)

	workDir := t.TempDir()
	b, err := New(Config{
		Host:         eng.Host,
		DefaultImage: testImage,
		// bash is not in a scratch image.
		OperatorArgs: []string{"--tools", "read,write,edit", "--model-retries", "0"},
		WorkDir:      workDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()

	// Every subtest leaves neither a container nor a directory behind.
	clean := func(t *testing.T) {
		t.Helper()
		if left := containers(t, cli); len(left) != 0 {
			t.Fatalf("%d containers left behind, e.g. %s (%s)", len(left), left[0].ID, left[0].State)
		}
		assertEmptyDir(t, workDir)
	}

	t.Run("echo", func(t *testing.T) {
		got := inspectAfterCreate(t, b, cli)
		inv := invocation(t, "echo", &operatorv1.OperatorInput{Message: content.Text("summarise the quarterly report")})
		inv.Limits = environment.Limits{
			CPUMillis:      1500,
			MemoryBytes:    256 << 20,
			MaxProcesses:   64,
			MaxOutputBytes: 1 << 20,
			CPUTime:        90 * time.Second,
		}
		res, err := b.Run(ctx, inv)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if text := content.TextOf(res.Output.GetMessage()); text != "[scripted model] You said: summarise the quarterly report" {
			t.Fatalf("output text %q", text)
		}
		if k := res.Output.GetExitReason().GetKind(); k != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
			t.Fatalf("exit kind %v", k)
		}
		if !bytes.Contains(res.Logs, []byte("SCRIPTED MODEL")) {
			t.Fatalf("logs lack the operator's stderr: %q", res.Logs)
		}
		if len(res.Usage.GetLimitsHit()) != 0 {
			t.Fatalf("limits hit %v", res.Usage.GetLimitsHit())
		}

		c := got.get(t)
		cfg, hc := c.Config, c.HostConfig
		wantArgs := []string{"--tools", "read,write,edit", "--model-retries", "0", "--workspace", "/workspace", "--one-shot", "--log-format", "json"}
		if c.Path != "/operator" || !slices.Equal(c.Args, wantArgs) {
			t.Errorf("command %s %q, want /operator %q", c.Path, c.Args, wantArgs)
		}
		if cfg.User != "65532:65532" || cfg.Labels[LabelInvocation] != "echo" || cfg.Image != testImage {
			t.Errorf("user %q, labels %v, image %q", cfg.User, cfg.Labels, cfg.Image)
		}
		if env := withoutPath(cfg.Env); len(env) != 0 {
			t.Errorf("environment %q, want nothing but PATH", env)
		}
		if string(hc.NetworkMode) != "none" || !hc.ReadonlyRootfs || !slices.Equal(hc.CapDrop, []string{"ALL"}) || !slices.Contains(hc.SecurityOpt, "no-new-privileges") {
			t.Errorf("network %q, read-only root %v, cap drop %v, security opts %v", hc.NetworkMode, hc.ReadonlyRootfs, hc.CapDrop, hc.SecurityOpt)
		}
		if _, ok := hc.Tmpfs["/workspace"]; !ok {
			t.Errorf("no tmpfs at /workspace: %v", hc.Tmpfs)
		}
		if _, ok := hc.Tmpfs["/tmp"]; !ok {
			t.Errorf("no tmpfs at /tmp: %v", hc.Tmpfs)
		}
		r := hc.Resources
		if r.Memory != 256<<20 || r.MemorySwap != 256<<20 || r.NanoCPUs != 1_500_000_000 || r.PidsLimit == nil || *r.PidsLimit != 64 {
			t.Errorf("memory %d, swap %d, nano CPUs %d, pids %v", r.Memory, r.MemorySwap, r.NanoCPUs, r.PidsLimit)
		}
		if len(r.Ulimits) != 1 || r.Ulimits[0].Name != "cpu" || r.Ulimits[0].Hard != 90 || r.Ulimits[0].Soft != 90 {
			t.Errorf("ulimits %v, want cpu=90", r.Ulimits)
		}
		if len(hc.Mounts) != 0 {
			t.Errorf("mounts %v, want none without egress or file credentials", hc.Mounts)
		}
		clean(t)
	})

	t.Run("file credential", func(t *testing.T) {
		got := inspectAfterCreate(t, b, cli)
		inj := &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_File{File: &environmentv1.FileInjection{Path: "/workspace/secret.txt"}}}
		inv := invocation(t, "file-cred", &operatorv1.OperatorInput{Message: content.Text(`/tool read {"path":"secret.txt"}`)})
		inv.Spec.Credentials = []*environmentv1.CredentialRef{{Name: "db-password", Injection: inj}}
		inv.Credentials = []environment.Credential{{Name: "db-password", Value: "correct-horse-battery", Injection: inj}}
		res, err := b.Run(ctx, inv)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		// The operator, as uid 65532, read the 0400 file through its
		// read tool.
		if text := content.TextOf(res.Output.GetMessage()); !strings.Contains(text, "read returned") || !strings.Contains(text, "correct-horse-battery") {
			t.Fatalf("output text %q does not show the credential file's content", text)
		}
		c := got.get(t)
		if len(c.HostConfig.Mounts) != 1 {
			t.Fatalf("mounts %v, want the credential file", c.HostConfig.Mounts)
		}
		m := c.HostConfig.Mounts[0]
		if m.Type != mount.TypeBind || m.Target != "/workspace/secret.txt" || !m.ReadOnly || !strings.HasPrefix(m.Source, workDir+"/") {
			t.Fatalf("credential mount %+v", m)
		}
		if env := withoutPath(c.Config.Env); len(env) != 0 {
			t.Fatalf("a file credential leaked into the environment: %q", env)
		}
		clean(t)
	})

	t.Run("egress and env credentials", func(t *testing.T) {
		got := inspectAfterCreate(t, b, cli)
		type seen struct{ host, path, key string }
		calls := make(chan seen, 10)
		var sockPath string
		stopped := false
		envVar := func(name string) *environmentv1.CredentialInjection {
			return &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: name}}}
		}
		inv := invocation(t, "egress", &operatorv1.OperatorInput{Message: content.Text("hello model")})
		inv.Credentials = []environment.Credential{
			{Name: "anthropic-key", Value: "sk-ant-test-key", Injection: envVar("ANTHROPIC_API_KEY")},
			{Name: "anthropic-url", Value: "http://api.anthropic.com", Injection: envVar("ANTHROPIC_BASE_URL")},
		}
		inv.Egress = func(path string) (func(), error) {
			sockPath = path
			l, err := net.Listen("unix", path)
			if err != nil {
				return nil, err
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls <- seen{r.Host, r.URL.Path, r.Header.Get("X-Api-Key")}
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, anthropicReply("hello through the egress socket"))
			})}
			go func() { _ = srv.Serve(l) }()
			return func() { stopped = true; _ = srv.Close() }, nil
		}
		res, err := b.Run(ctx, inv)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if text := content.TextOf(res.Output.GetMessage()); text != "hello through the egress socket" {
			t.Fatalf("output text %q, want the proxy's reply", text)
		}
		if p := res.Output.GetMetadata().GetProvider(); p != "anthropic" {
			t.Fatalf("provider %q, want anthropic", p)
		}
		select {
		case c := <-calls:
			// The env_var credentials reached the operator: it used the
			// key and the base URL, over the mounted socket.
			if c.host != "api.anthropic.com" || c.path != "/v1/messages" || c.key != "sk-ant-test-key" {
				t.Fatalf("the proxy saw host %q path %q key %q", c.host, c.path, c.key)
			}
		default:
			t.Fatal("the egress proxy saw no request")
		}
		if !stopped {
			t.Fatal("the egress proxy was not stopped")
		}
		if filepath.Base(sockPath) != "egress.sock" || !strings.HasPrefix(sockPath, workDir+"/") {
			t.Fatalf("egress socket at %s", sockPath)
		}

		c := got.get(t)
		if want := environment.CredentialEnv(inv.Credentials); !slices.Equal(withoutPath(c.Config.Env), want) {
			t.Fatalf("environment %q, want exactly %q", withoutPath(c.Config.Env), want)
		}
		if i := slices.Index(c.Args, "--egress-proxy"); i < 0 || i+1 >= len(c.Args) || c.Args[i+1] != "unix:///run/neuron/egress.sock" {
			t.Fatalf("operator args %q lack --egress-proxy unix:///run/neuron/egress.sock", c.Args)
		}
		if string(c.HostConfig.NetworkMode) != "none" {
			t.Fatalf("network mode %q with egress, want none", c.HostConfig.NetworkMode)
		}
		ms := c.HostConfig.Mounts
		if len(ms) != 1 || ms[0].Type != mount.TypeBind || ms[0].Target != EgressSocket || ms[0].Source != sockPath || !ms[0].ReadOnly {
			t.Fatalf("mounts %+v, want the socket %s alone read-only at %s", ms, sockPath, EgressSocket)
		}
		clean(t)
	})

	t.Run("session history through the state socket", func(t *testing.T) {
		got := inspectAfterCreate(t, b, cli)
		var listed atomic.Int32
		inv := invocation(t, "state", &operatorv1.OperatorInput{Message: content.Text("remember me"), SessionId: proto.String("s1")})
		inv.State = func(path string) (func(), error) {
			l, err := net.Listen("unix", path)
			if err != nil {
				return nil, err
			}
			srv := grpc.NewServer()
			statev1.RegisterStateServiceServer(srv, &countingState{lists: &listed})
			go func() { _ = srv.Serve(l) }()
			return srv.Stop, nil
		}
		res, err := b.Run(ctx, inv)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if text := content.TextOf(res.Output.GetMessage()); !strings.Contains(text, "You said: remember me") {
			t.Errorf("output %q", text)
		}
		if listed.Load() == 0 {
			t.Error("the operator never read its session history through the state socket")
		}
		if !slices.Contains(got.get(t).Config.Cmd, "unix://"+StateSocket) {
			t.Errorf("operator args %v lack the state socket", got.get(t).Config.Cmd)
		}
		clean(t)
	})

	t.Run("operator status", func(t *testing.T) {
		// No message: the operator refuses the input itself.
		inv := invocation(t, "bad-input", &operatorv1.OperatorInput{})
		_, err := b.Run(ctx, inv)
		wantCode(t, err, codes.InvalidArgument, "message")
		clean(t)
	})

	t.Run("timeout", func(t *testing.T) {
		// The scripted model's turn waits ten minutes: only the
		// invocation's timeout can end the run.
		md, err := structpb.NewStruct(map[string]any{"scripted": map[string]any{
			"turns": []any{map[string]any{"text": "too late", "delay": "10m"}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		inv := invocation(t, "timeout", &operatorv1.OperatorInput{Message: content.Text("wait"), Metadata: md})
		inv.Timeout = 3 * time.Second
		_, err = b.Run(ctx, inv)
		wantCode(t, err, codes.DeadlineExceeded, "timeout of 3s", "killed")
		clean(t)
	})

	t.Run("cancel", func(t *testing.T) {
		md, err := structpb.NewStruct(map[string]any{"scripted": map[string]any{
			"turns": []any{map[string]any{"text": "too late", "delay": "10m"}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		// Cancel once the container is running: the kill path, not a
		// failed engine call.
		b.afterCreate = func(_ context.Context, id string) {
			go func() {
				defer cancel()
				for runCtx.Err() == nil {
					res, err := cli.ContainerInspect(runCtx, id, client.ContainerInspectOptions{})
					if err == nil && res.Container.State != nil && res.Container.State.Running {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
		t.Cleanup(func() { b.afterCreate = nil })
		inv := invocation(t, "cancel", &operatorv1.OperatorInput{Message: content.Text("wait"), Metadata: md})
		_, err = b.Run(runCtx, inv)
		wantCode(t, err, codes.Canceled, "cancel") // either while starting or once running
		clean(t)
	})

	t.Run("memory limit", func(t *testing.T) {
		// 8 MiB is above the engine's minimum and far below what the
		// operator needs to start.
		inv := invocation(t, "memory", &operatorv1.OperatorInput{Message: content.Text("hi")})
		inv.Limits.MemoryBytes = 8 << 20
		_, err := b.Run(ctx, inv)
		wantCode(t, err, codes.ResourceExhausted, "memory limit", "8388608 bytes")
		clean(t)
	})

	t.Run("output limit", func(t *testing.T) {
		// Any OperatorOutput is longer than 64 bytes.
		inv := invocation(t, "output", &operatorv1.OperatorInput{Message: content.Text("a reply longer than the limit")})
		inv.Limits.MaxOutputBytes = 64
		_, err := b.Run(ctx, inv)
		wantCode(t, err, codes.ResourceExhausted, "max_output_bytes", "64 bytes")
		clean(t)
	})

	t.Run("missing image", func(t *testing.T) {
		inv := invocation(t, "no-image", &operatorv1.OperatorInput{Message: content.Text("hi")})
		inv.Spec.Isolation = []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{Image: "neuron-missing:never-built"}}}}
		_, err := b.Run(ctx, inv)
		wantCode(t, err, codes.FailedPrecondition, "neuron-missing:never-built", "make images")
		clean(t)
	})

	// RunStream through the service: the operator in the container
	// writes its progress to the bind-mounted socket, and the text
	// deltas make up the answer the result carries, which comes last.
	t.Run("stream", func(t *testing.T) {
		srv, err := environment.NewServer(environment.ServerConfig{Backends: []environment.Backend{b}, Default: "docker", Container: "docker"})
		if err != nil {
			t.Fatal(err)
		}
		st := &collectStream{ctx: ctx}
		err = srv.RunStream(&environmentv1.RunStreamRequest{
			Input: &operatorv1.OperatorInput{Message: content.Text("stream\nthis please")},
			Spec:  &environmentv1.EnvironmentSpec{},
		}, st)
		if err != nil {
			t.Fatalf("RunStream: %v", err)
		}
		var text strings.Builder
		model := 0
		for _, m := range st.msgs[:max(len(st.msgs)-1, 0)] {
			text.WriteString(m.GetProgress().GetTextDelta().GetText())
			if m.GetProgress().GetModelCallFinished() != nil {
				model++
			}
		}
		last := st.msgs[len(st.msgs)-1].GetResult()
		if want := "[scripted model] You said: stream\nthis please"; content.TextOf(last.GetOutput().GetMessage()) != want || text.String() != want || model != 1 {
			t.Errorf("streamed %q and %d model calls, result %v", text.String(), model, last)
		}
		clean(t)
	})
}

// collectStream is the server side of a RunStream call that keeps what
// is sent.
type collectStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*environmentv1.RunStreamResponse
}

func (s *collectStream) Context() context.Context { return s.ctx }

func (s *collectStream) Send(m *environmentv1.RunStreamResponse) error {
	s.msgs = append(s.msgs, m)
	return nil
}

// countingState is an empty StateService that counts List calls.
type countingState struct {
	statev1.UnimplementedStateServiceServer
	lists *atomic.Int32
}

func (c *countingState) List(context.Context, *statev1.ListRequest) (*statev1.ListResponse, error) {
	c.lists.Add(1)
	return &statev1.ListResponse{}, nil
}
