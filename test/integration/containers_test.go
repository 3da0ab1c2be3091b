package integration

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	mobynetwork "github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/environment/docker"
)

// caBundle is the host's CA bundle, which the images carry.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// engineTimeout bounds the engine calls of one step (an image build, a
// container's creation and start, its removal); a build streams a binary
// of tens of megabytes.
const engineTimeout = 3 * time.Minute

// serviceUser is the images' unprivileged user, which the containers are
// also told to run as.
const serviceUser = "65532:65532"

// TestContainers builds the state, operator, orchestrator and environment images from
// their Dockerfiles (FROM scratch, a static binary and the CA bundle) on a
// private Docker engine, then, through testcontainers-go, runs them on a
// private bridge network under their service names, with the
// orchestrator's registry copied into its container, and runs a
// memory-writing workflow through the orchestrator's mapped port. The
// State service's mapped port must then hold the value. The containers
// run as uid 65532 with tmpfs at /tmp for their data, no capabilities
// and no-new-privileges, their ports published on 127.0.0.1 only.
func TestContainers(t *testing.T) {
	eng := testenv.Docker(t) // skips without dockerd or root
	if _, err := os.Stat(caBundle); err != nil {
		t.Skipf("no CA bundle for the images at %s (apt-get install -y ca-certificates): %v", caBundle, err)
	}
	// The images are built, and the containers checked, with a client of
	// the engine itself, not testcontainers-go's.
	cli, err := client.New(client.WithHost(eng.Host))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	root := repoRoot(t)

	bins := binaries(t)
	images := map[string]string{}
	for _, svc := range []string{"state", "operator", "orchestrator", "environment"} {
		tag := "neuron-it/" + svc + ":test"
		ctx, cancel := context.WithTimeout(t.Context(), engineTimeout)
		err := docker.BuildImage(ctx, cli, filepath.Join(root, "services", svc, "Dockerfile"), bins[svc], caBundle, tag)
		cancel()
		if err != nil {
			t.Fatalf("building %s from services/%s/Dockerfile: %v", tag, svc, err)
		}
		images[svc] = tag
	}

	// testcontainers-go reads these once per process (see
	// relayDockerHost): no Ryuk (its image cannot be pulled, and every
	// container and the network are removed by the test's cleanups), and
	// the mapped ports are on the loopback interface, where they are
	// published.
	t.Setenv("DOCKER_HOST", relayDockerHost(t, eng.Host))
	t.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	t.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")

	nw := newNetwork(t)
	state := runService(t, cli, serviceSpec{
		name: "state", image: images["state"], network: nw, port: "7072/tcp",
		args: []string{"--dev", "--addr", "0.0.0.0:7072", "--backend", "bolt", "--data-dir", "/tmp/state"},
	})
	runService(t, cli, serviceSpec{
		name: "operator", image: images["operator"], network: nw, port: "7071/tcp",
		args: []string{"--dev", "--addr", "0.0.0.0:7071", "--tools", "read,write,edit",
			"--workspace", "/tmp/workspace", "--state-addr", "state:7072"},
	})
	orch := runService(t, cli, serviceSpec{
		name: "orchestrator", image: images["orchestrator"], network: nw, port: "7070/tcp",
		args: []string{"--dev", "--addr", "0.0.0.0:7070", "--agents", "/etc/neuron/agents.yaml",
			"--state-addr", "state:7072", "--data-dir", "/tmp/orchestrator"},
		files: map[string][]byte{"/etc/neuron/agents.yaml": registry("operator:7071")},
	})

	// The environment image, with the one backend that works inside a
	// container without privileges: local, forwarding to the operator.
	envc := runService(t, cli, serviceSpec{
		name: "environment", image: images["environment"], network: nw, port: "7073/tcp",
		args: []string{"--dev", "--addr", "0.0.0.0:7073", "--backend", "local", "--operator-addr", "operator:7071"},
	})

	orchConn := dial(t, orch.hostAddr)
	waitHealthy(t, orchConn, "")
	stateConn := dial(t, state.hostAddr)
	waitHealthy(t, stateConn, stateService)

	envConn := dial(t, envc.hostAddr)
	waitHealthy(t, envConn, "")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	run, err := environmentv1.NewEnvironmentServiceClient(envConn).Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{Message: content.Text("hello from the environment container")},
		Spec:  &environmentv1.EnvironmentSpec{}, // no isolation: what the local backend runs
	})
	if err != nil {
		t.Fatalf("Run through the environment container: %v", err)
	}
	if out := run.GetOutput(); out.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_COMPLETE ||
		!strings.Contains(content.TextOf(out.GetMessage()), "hello from the environment container") {
		t.Fatalf("Run through the environment container: %v", out)
	}

	w := newMemoryWorkflow(t, "containers")
	w.run(t, orchestratorv1.NewOrchestratorServiceClient(orchConn), statev1.NewStateServiceClient(stateConn))
	t.Logf("workflow %s ran through the orchestrator container (%s) and wrote %q into the state container (%s)", w.id, orch.hostAddr, w.key, state.hostAddr)
}

// newNetwork creates a bridge network (testcontainers-go names it),
// removed when the test ends, after the containers on it, whose cleanups
// are registered later and so run first.
func newNetwork(t *testing.T) *testcontainers.DockerNetwork {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), engineTimeout)
	defer cancel()
	nw, err := network.New(ctx, network.WithDriver("bridge"))
	testcontainers.CleanupNetwork(t, nw)
	if err != nil {
		t.Fatalf("creating the network: %v", err)
	}
	return nw
}

// serviceSpec is one service container.
type serviceSpec struct {
	name    string // network alias
	image   string
	network *testcontainers.DockerNetwork
	port    string            // the service port, published on 127.0.0.1 at a free port
	args    []string          // after the image's entrypoint
	files   map[string][]byte // copied in before start: absolute path -> content (mode 0644, root's)
}

// serviceContainer is a running service container.
type serviceContainer struct {
	testcontainers.Container
	hostAddr string // 127.0.0.1:PORT, the mapped service port
}

// runService runs spec's container through testcontainers-go: created,
// its files copied in, started, and waited for until it logs SERVING. It
// is removed when the test ends, its logs quoted first if the test
// failed. runService checks, with cli, that the container runs on the
// test's engine as it was asked to, and returns its mapped address.
func runService(t *testing.T, cli *client.Client, spec serviceSpec) *serviceContainer {
	t.Helper()
	port, err := mobynetwork.ParsePort(spec.port)
	if err != nil {
		t.Fatal(err)
	}
	var files []testcontainers.ContainerFile
	for _, p := range slices.Sorted(maps.Keys(spec.files)) {
		files = append(files, testcontainers.ContainerFile{
			Reader: bytes.NewReader(spec.files[p]), ContainerFilePath: p, FileMode: 0o644,
		})
	}
	req := testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        spec.image,
			Cmd:          spec.args,
			ExposedPorts: []string{spec.port},
			Files:        files,
			// The images run as 65532 on a root-owned filesystem: data
			// goes to a world-writable tmpfs.
			Tmpfs: map[string]string{"/tmp": "rw,nosuid,nodev,size=256m,mode=1777"},
			ConfigModifier: func(c *container.Config) {
				c.User = serviceUser
			},
			HostConfigModifier: func(hc *container.HostConfig) {
				hc.PortBindings = mobynetwork.PortMap{port: {{HostIP: netip.MustParseAddr("127.0.0.1")}}}
				hc.CapDrop = []string{"ALL"}
				hc.SecurityOpt = []string{"no-new-privileges"}
			},
			// A JSON log line {"msg":"SERVING",...}; the strategy fails
			// at once if the container exits first.
			WaitingFor: wait.ForLog(`"msg":"SERVING"`).WithStartupTimeout(startTimeout),
		},
		Started: true,
		Logger:  tclog.TestLogger(t),
	}
	if err := network.WithNetwork([]string{spec.name}, spec.network).Customize(&req); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), engineTimeout+startTimeout)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, req)
	testcontainers.CleanupContainer(t, c, testcontainers.StopTimeout(stopTimeout))
	if err != nil {
		t.Fatalf("running the %s container: %v%s", spec.name, err, containerOutput(c))
	}
	// Registered after CleanupContainer, so it runs before the removal.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs of the %s container:%s", spec.name, containerOutput(c))
		}
	})

	checkContainer(t, cli, c.GetContainerID(), spec, port)

	host, err := c.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mapped, err := c.MappedPort(ctx, spec.port)
	if err != nil {
		t.Fatalf("the %s container's port %s: %v", spec.name, spec.port, err)
	}
	return &serviceContainer{Container: c, hostAddr: net.JoinHostPort(host, mapped.Port())}
}

// checkContainer inspects the container id with the test engine's own
// client: it must be there (testcontainers-go talks to this engine), run
// as serviceUser, without capabilities, under its alias on spec's
// network, with its port published on 127.0.0.1 only.
func checkContainer(t *testing.T, cli *client.Client, id string, spec serviceSpec, port mobynetwork.Port) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), engineTimeout)
	defer cancel()
	res, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatalf("the %s container %s is not on the test's engine: %v", spec.name, id, err)
	}
	ctr := res.Container
	if ctr.State == nil || !ctr.State.Running {
		t.Fatalf("the %s container is not running: %+v", spec.name, ctr.State)
	}
	if ctr.Config == nil || ctr.Config.User != serviceUser {
		t.Errorf("the %s container runs as %q, want %q", spec.name, userOf(ctr.Config), serviceUser)
	}
	if hc := ctr.HostConfig; hc == nil || !slices.Equal(hc.CapDrop, []string{"ALL"}) || !slices.Contains(hc.SecurityOpt, "no-new-privileges") {
		t.Errorf("the %s container's host config does not drop all capabilities with no-new-privileges: %+v", spec.name, hc)
	}
	if ctr.NetworkSettings == nil {
		t.Fatalf("the %s container has no network settings", spec.name)
	}
	ep := ctr.NetworkSettings.Networks[spec.network.Name]
	if ep == nil || !slices.Contains(ep.Aliases, spec.name) {
		t.Errorf("the %s container is not on network %s under its alias: %+v", spec.name, spec.network.Name, ep)
	}
	bindings := ctr.NetworkSettings.Ports[port]
	if len(bindings) == 0 {
		t.Fatalf("the %s container's port %s is not published: %v", spec.name, port, ctr.NetworkSettings.Ports)
	}
	for _, b := range bindings {
		if b.HostIP != netip.MustParseAddr("127.0.0.1") {
			t.Errorf("the %s container's port %s is published on %v, want 127.0.0.1 only", spec.name, port, b.HostIP)
		}
	}
}

func userOf(c *container.Config) string {
	if c == nil {
		return "(no config)"
	}
	return c.User
}

// containerOutput returns the end of c's output (a nil c has none), for
// failure messages.
func containerOutput(c testcontainers.Container) string {
	if c == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	rc, err := c.Logs(ctx)
	if err != nil {
		return "\n(no logs: " + err.Error() + ")"
	}
	defer rc.Close()
	out, err := io.ReadAll(rc)
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	s := "\n" + strings.Join(lines, "\n")
	if err != nil {
		s += "\n(reading the logs: " + err.Error() + ")"
	}
	return s
}
