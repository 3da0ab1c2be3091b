package integration

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/testenv"
	"github.com/secbear/neuron/services/environment/docker"
)

// caBundle is the host's CA bundle, which the images carry.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// engineTimeout bounds the engine calls of one step (an image build, a
// container's creation and start); a build streams a binary of tens of
// megabytes.
const engineTimeout = 3 * time.Minute

// TestContainers builds the state, operator and orchestrator images from
// their Dockerfiles (FROM scratch, a static binary and the CA bundle) on a
// private Docker engine, runs them on a private bridge network under
// their service names, with the orchestrator's registry copied into its
// container, and runs a memory-writing workflow through the
// orchestrator's published port. The State service's published port
// must then hold the value. The containers run as the images' uid 65532
// with tmpfs at /tmp for their data, no capabilities and
// no-new-privileges.
func TestContainers(t *testing.T) {
	eng := testenv.Docker(t) // skips without dockerd or root
	if _, err := os.Stat(caBundle); err != nil {
		t.Skipf("no CA bundle for the images at %s (apt-get install -y ca-certificates): %v", caBundle, err)
	}
	cli, err := client.New(client.WithHost(eng.Host))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	root := repoRoot(t)

	bins := binaries(t)
	images := map[string]string{}
	for _, svc := range []string{"state", "operator", "orchestrator"} {
		tag := "neuron-it/" + svc + ":test"
		ctx, cancel := context.WithTimeout(t.Context(), engineTimeout)
		err := docker.BuildImage(ctx, cli, filepath.Join(root, "services", svc, "Dockerfile"), bins[svc], caBundle, tag)
		cancel()
		if err != nil {
			t.Fatalf("building %s from services/%s/Dockerfile: %v", tag, svc, err)
		}
		images[svc] = tag
	}

	netName := createNetwork(t, cli, "neuron-it-"+randomHex(t, 4))
	state := runContainer(t, cli, containerSpec{
		name: "state", image: images["state"], network: netName, port: "7072/tcp",
		args: []string{"--dev", "--addr", "0.0.0.0:7072", "--backend", "bolt", "--data-dir", "/tmp/state"},
	})
	runContainer(t, cli, containerSpec{
		name: "operator", image: images["operator"], network: netName, port: "7071/tcp",
		args: []string{"--dev", "--addr", "0.0.0.0:7071", "--tools", "read,write,edit",
			"--workspace", "/tmp/workspace", "--state-addr", "state:7072"},
	})
	orch := runContainer(t, cli, containerSpec{
		name: "orchestrator", image: images["orchestrator"], network: netName, port: "7070/tcp",
		args: []string{"--dev", "--addr", "0.0.0.0:7070", "--agents", "/etc/neuron/agents.yaml",
			"--state-addr", "state:7072", "--data-dir", "/tmp/orchestrator"},
		files: map[string][]byte{"etc/neuron/agents.yaml": registry("operator:7071")},
	})

	orchConn := dial(t, orch.hostAddr)
	waitHealthy(t, orchConn, "")
	stateConn := dial(t, state.hostAddr)
	waitHealthy(t, stateConn, stateService)

	w := newMemoryWorkflow(t, "containers")
	w.run(t, orchestratorv1.NewOrchestratorServiceClient(orchConn), statev1.NewStateServiceClient(stateConn))
	t.Logf("workflow %s ran through the orchestrator container (%s) and wrote %q into the state container (%s)", w.id, orch.hostAddr, w.key, state.hostAddr)
}

// createNetwork creates a bridge network, removed when the test ends
// (after the containers on it, whose cleanups run first).
func createNetwork(t *testing.T, cli *client.Client, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), engineTimeout)
	defer cancel()
	res, err := cli.NetworkCreate(ctx, name, client.NetworkCreateOptions{Driver: "bridge"})
	if err != nil {
		t.Fatalf("creating network %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), engineTimeout)
		defer cancel()
		if _, err := cli.NetworkRemove(ctx, res.ID, client.NetworkRemoveOptions{}); err != nil {
			t.Errorf("removing network %s: %v", name, err)
		}
	})
	return name
}

// containerSpec is one service container.
type containerSpec struct {
	name    string // container name and network alias
	image   string
	network string
	port    string            // the service port, published on 127.0.0.1 at a free port
	args    []string          // after the image's entrypoint
	files   map[string][]byte // copied in before start: path under / -> content (mode 0644)
}

// serviceContainer is a running container.
type serviceContainer struct {
	id       string
	hostAddr string // 127.0.0.1:PORT, the published service port
}

// runContainer creates spec's container (removed, with its logs quoted on
// failure, when the test ends), copies its files in, starts it, waits for
// its SERVING log line and returns the published address.
func runContainer(t *testing.T, cli *client.Client, spec containerSpec) *serviceContainer {
	t.Helper()
	port, err := network.ParsePort(spec.port)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), engineTimeout)
	defer cancel()
	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: spec.name + "-" + randomHex(t, 3),
		Config: &container.Config{
			Image:        spec.image,
			Cmd:          spec.args,
			ExposedPorts: network.PortSet{port: {}},
		},
		HostConfig: &container.HostConfig{
			PortBindings: network.PortMap{port: {{HostIP: netip.MustParseAddr("127.0.0.1")}}},
			// The images run as 65532 on a root-owned filesystem: data
			// goes to a world-writable tmpfs.
			Tmpfs:       map[string]string{"/tmp": "rw,nosuid,nodev,size=256m,mode=1777"},
			CapDrop:     []string{"ALL"},
			SecurityOpt: []string{"no-new-privileges"},
		},
		NetworkingConfig: &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
			spec.network: {Aliases: []string{spec.name}},
		}},
	})
	if err != nil {
		t.Fatalf("creating the %s container: %v", spec.name, err)
	}
	c := &serviceContainer{id: created.ID}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), engineTimeout)
		defer cancel()
		if t.Failed() {
			t.Logf("logs of the %s container:\n%s", spec.name, containerLogs(ctx, cli, c.id))
		}
		if _, err := cli.ContainerRemove(ctx, c.id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			t.Errorf("removing the %s container: %v", spec.name, err)
		}
	})
	if len(spec.files) > 0 {
		archive, err := tarOf(spec.files)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.CopyToContainer(ctx, c.id, client.CopyToContainerOptions{DestinationPath: "/", Content: archive}); err != nil {
			t.Fatalf("copying files into the %s container: %v", spec.name, err)
		}
	}
	if _, err := cli.ContainerStart(ctx, c.id, client.ContainerStartOptions{}); err != nil {
		t.Fatalf("starting the %s container: %v", spec.name, err)
	}
	if err := waitServing(t.Context(), cli, c.id); err != nil {
		t.Fatalf("the %s container: %v\n%s", spec.name, err, containerLogs(ctx, cli, c.id))
	}
	res, err := cli.ContainerInspect(ctx, c.id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var bindings []network.PortBinding
	if ns := res.Container.NetworkSettings; ns != nil {
		bindings = ns.Ports[port]
	}
	if len(bindings) == 0 || bindings[0].HostPort == "" {
		t.Fatalf("the %s container's port %s is not published: %v", spec.name, spec.port, bindings)
	}
	c.hostAddr = net.JoinHostPort("127.0.0.1", bindings[0].HostPort)
	return c
}

// waitServing follows the container's logs until its SERVING line,
// startTimeout, or the end of the logs (the container exited).
func waitServing(ctx context.Context, cli *client.Client, id string) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	logs, err := cli.ContainerLogs(ctx, id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Follow: true})
	if err != nil {
		return fmt.Errorf("following its logs: %w", err)
	}
	defer logs.Close()
	pr, pw := io.Pipe()
	defer pr.Close() // ends the copy below once we stop reading
	go func() {
		_, err := stdcopy.StdCopy(pw, pw, logs)
		pw.CloseWithError(err)
	}()
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if _, ok := servingAddr(sc.Bytes()); ok {
			return nil
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("no SERVING log line within %v", startTimeout)
	}
	return fmt.Errorf("its logs ended before a SERVING line (exited?): %v", sc.Err())
}

// containerLogs returns the container's output so far, for failure
// messages.
func containerLogs(ctx context.Context, cli *client.Client, id string) string {
	logs, err := cli.ContainerLogs(ctx, id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: "60"})
	if err != nil {
		return fmt.Sprintf("(no logs: %v)", err)
	}
	defer logs.Close()
	var b bytes.Buffer
	if _, err := stdcopy.StdCopy(&b, &b, logs); err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(&b, "\n(reading the logs: %v)", err)
	}
	return strings.TrimRight(b.String(), "\n")
}

// tarOf returns a tar archive of files (path -> content), each mode 0644
// and owned by root, with the directories they need (mode 0755).
func tarOf(files map[string][]byte) (io.Reader, error) {
	names := slices.Sorted(maps.Keys(files))
	var dirs []string
	for _, name := range names {
		for d := path.Dir(name); d != "." && d != "/"; d = path.Dir(d) {
			dirs = append(dirs, d)
		}
	}
	slices.Sort(dirs) // a parent sorts before its children
	dirs = slices.Compact(dirs)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
	}
	for _, name := range names {
		data := files[name]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return &buf, nil
}
