package docker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/moby/moby/client"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// backendName is the backend's name in responses, logs and errors.
const backendName = "docker"

// LabelInvocation is the label every container of an invocation carries;
// its value is the invocation id.
const LabelInvocation = "neuron.dev/invocation"

// Paths inside the container.
const (
	// DefaultOperatorPath is the operator binary in the services' images.
	DefaultOperatorPath = "/operator"
	// Workspace is the operator's workspace, a tmpfs.
	Workspace = "/workspace"
	// EgressDir is where the egress proxy's socket directory is mounted.
	EgressDir = "/run/neuron"
	// EgressSocket is the egress proxy's socket in the container.
	EgressSocket = EgressDir + "/egress.sock"
	// StateSocket is the read-only state bridge's socket in the
	// container, in a directory of its own.
	StateSocket = "/run/neuron-state/state.sock"
	// ProgressSocket is the socket the operator writes its progress
	// events to (RunStream only), in a directory of its own.
	ProgressSocket = "/run/neuron-progress/progress.sock"
)

// ContainerUser is the uid:gid the operator runs as: the services'
// images' USER ("nonroot" in distroless images).
const ContainerUser = "65532:65532"

// The numeric ids of ContainerUser, for file ownership on the host.
const (
	containerUID = 65532
	containerGID = 65532
)

// minMemoryBytes is the smallest memory limit the engine accepts (6 MiB).
const minMemoryBytes = 6 << 20

// maxSocketPath is the longest path a Unix socket can be bound at
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

// invDirPattern names per-invocation directories (os.MkdirTemp appends
// digits); short, so the egress socket path stays under maxSocketPath.
const (
	invDirPattern   = "inv"
	invDirMaxSuffix = len("/inv") + 20 + len("/egress/egress.sock")
)

// Config configures the backend.
type Config struct {
	// Host is the engine endpoint, e.g. unix:///var/run/docker.sock; ""
	// is the client's default ($DOCKER_HOST, else the local socket).
	Host string
	// DefaultImage is the image when the spec's container boundary names
	// none.
	DefaultImage string
	// OperatorPath is the operator binary in the image; "" is "/operator".
	OperatorPath string
	// OperatorArgs are the configured operator arguments, placed before
	// the backend's own (--egress-proxy, --workspace and
	// environment.OneShotArgs()).
	OperatorArgs []string
	// WorkDir is the host directory holding per-invocation directories
	// (the egress socket, credential files); "" is os.TempDir(). It must
	// be on the engine's host, since those directories are bind-mounted,
	// and short enough for a Unix socket path below it.
	WorkDir string
	// Runtime is the OCI runtime enforcing the gvisor boundary (e.g.
	// "runsc"); "" refuses gvisor specs.
	Runtime string
	// DefaultLimits fill in each zero CPU, memory, process, disk and
	// output limit of an invocation (whose limits are the spec's, else
	// the service's defaults), so that no container runs unbounded. A
	// zero field here takes the package default: DefaultCPUMillis,
	// DefaultMemoryBytes, DefaultMaxProcesses, DefaultDiskBytes,
	// DefaultMaxOutputBytes. Its other fields are ignored.
	DefaultLimits environment.Limits
	// Log receives the backend's own diagnostics; nil discards them.
	Log *slog.Logger
}

// The limits every container gets when neither its spec, the service's
// defaults nor Config.DefaultLimits set one.
const (
	// DefaultCPUMillis is one core.
	DefaultCPUMillis = 1000
	// DefaultMemoryBytes is 2 GiB.
	DefaultMemoryBytes = 2 << 30
	// DefaultMaxProcesses bounds the container's tasks.
	DefaultMaxProcesses = 256
	// DefaultDiskBytes is the size of the workspace, 1 GiB.
	DefaultDiskBytes = 1 << 30
	// DefaultMaxOutputBytes bounds the operator's stdout, 16 MiB.
	DefaultMaxOutputBytes = 16 << 20
)

// Backend runs invocations in containers through the Docker engine API.
// It implements environment.Backend; it is safe for concurrent use.
type Backend struct {
	cli          *client.Client
	host         string
	defaultImage string
	operatorPath string
	operatorArgs []string
	workDir      string
	runtime      string
	defaults     environment.Limits
	log          *slog.Logger

	// afterCreate, when set (by tests), is called with each container's
	// id right after it is created and before it starts.
	afterCreate func(ctx context.Context, id string)

	// boxes are the sandbox sessions' containers, by workspace name.
	boxMu sync.Mutex
	boxes map[string]*box
}

var _ environment.Backend = (*Backend)(nil)

// New returns a backend using the engine at cfg.Host, with API version
// negotiation. It does not contact the engine: an engine that is down
// fails each Run with UNAVAILABLE instead.
func New(cfg Config) (*Backend, error) {
	opts := []client.Opt{client.FromEnv}
	if cfg.Host != "" {
		opts = append(opts, client.WithHost(cfg.Host))
	}
	cli, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker client for %q: %w", cfg.Host, err)
	}
	workDir := cfg.WorkDir
	if workDir == "" {
		workDir = os.TempDir()
	}
	if workDir, err = filepath.Abs(workDir); err != nil {
		cli.Close()
		return nil, fmt.Errorf("docker work dir: %w", err)
	}
	if len(workDir)+invDirMaxSuffix > maxSocketPath {
		cli.Close()
		return nil, fmt.Errorf("docker work dir %s is too long: the egress socket below it would exceed the %d bytes of a Unix socket path", workDir, maxSocketPath)
	}
	if err := os.MkdirAll(workDir, 0o700); err != nil {
		cli.Close()
		return nil, fmt.Errorf("docker work dir: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opPath := cfg.OperatorPath
	if opPath == "" {
		opPath = DefaultOperatorPath
	}
	d := cfg.DefaultLimits
	for _, f := range []struct {
		v   *int64
		def int64
	}{{&d.CPUMillis, DefaultCPUMillis}, {&d.MemoryBytes, DefaultMemoryBytes}, {&d.DiskBytes, DefaultDiskBytes}} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	if d.MaxProcesses == 0 {
		d.MaxProcesses = DefaultMaxProcesses
	}
	if d.MaxOutputBytes == 0 {
		d.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if err := checkLimits(d); err != nil {
		cli.Close()
		return nil, fmt.Errorf("docker default limits: %w", err)
	}
	return &Backend{
		cli:          cli,
		host:         cli.DaemonHost(),
		defaultImage: cfg.DefaultImage,
		operatorPath: opPath,
		operatorArgs: slices.Clone(cfg.OperatorArgs),
		workDir:      workDir,
		runtime:      cfg.Runtime,
		defaults:     environment.Limits{CPUMillis: d.CPUMillis, MemoryBytes: d.MemoryBytes, DiskBytes: d.DiskBytes, MaxProcesses: d.MaxProcesses, MaxOutputBytes: d.MaxOutputBytes},
		log:          log.With("backend", backendName),
	}, nil
}

// Name returns "docker".
func (b *Backend) Name() string { return backendName }

// Close releases the engine client's connections.
func (b *Backend) Close() error { return b.cli.Close() }

// Check returns nil when the backend can enforce spec, else an error
// naming what it cannot: FAILED_PRECONDITION for an isolation kind other
// than container, network_policy and (with Config.Runtime) gvisor,
// resources.gpu, a memory limit below the engine's minimum, no image to
// run, a file credential path the backend will not mount over (see
// checkFilePath), and an env_var credential named like a variable that
// changes how the loader, a shell or a client behaves (see
// environment-variable guards in guard.go); INVALID_ARGUMENT for a
// quantity outside what the kernel and the engine accept.
func (b *Backend) Check(spec *environmentv1.EnvironmentSpec) error {
	supported := []string{environment.KindContainer, environment.KindNetworkPolicy}
	if b.runtime != "" {
		supported = append(supported, environment.KindGvisor)
	}
	if err := environment.Unsupported(backendName, spec, supported...); err != nil {
		if b.runtime == "" && slices.Contains(environment.Kinds(spec), environment.KindGvisor) {
			msg := strings.TrimSuffix(err.Error(), ": "+errs.FailedPrecondition.Error())
			return fmt.Errorf("%s; gvisor needs the service configured with an OCI runtime such as runsc (--gvisor-runtime): %w", msg, errs.FailedPrecondition)
		}
		return err
	}
	if r := spec.GetResources(); r != nil {
		l, err := environment.ParseLimits(r, environment.Limits{})
		if err != nil {
			return err
		}
		if err := environment.CheckQuantities(r, l); err != nil {
			return err
		}
		if err := checkLimits(l); err != nil {
			return err
		}
	}
	if img, _ := environment.ContainerImage(spec); img == "" && b.defaultImage == "" {
		return fmt.Errorf("the spec's container boundary names no image and the docker backend has no default image (--default-image): %w", errs.FailedPrecondition)
	}
	creds := make([]environment.Credential, 0, len(spec.GetCredentials()))
	for _, c := range spec.GetCredentials() {
		creds = append(creds, environment.Credential{Name: c.GetName(), Injection: c.GetInjection()})
	}
	return b.checkCredentials(creds)
}

// checkCredentials refuses, with FAILED_PRECONDITION, credentials the
// backend will not place: a file at a path checkFilePath refuses or that
// another file credential uses, an environment variable environment.RefusedEnv
// refuses or that another credential sets.
func (b *Backend) checkCredentials(creds []environment.Credential) error {
	paths, vars := map[string]bool{}, map[string]bool{}
	for i, c := range creds {
		switch m := c.Injection.GetMethod().(type) {
		case *environmentv1.CredentialInjection_File:
			p := m.File.GetPath()
			if err := b.checkFilePath(p); err != nil {
				return fmt.Errorf("credentials[%d] (%s): %v: %w", i, c.Name, err, errs.FailedPrecondition)
			}
			if paths[p] {
				return fmt.Errorf("credentials[%d] (%s): another file credential already uses path %q: %w", i, c.Name, p, errs.FailedPrecondition)
			}
			paths[p] = true
		case *environmentv1.CredentialInjection_EnvVar:
			v := m.EnvVar.GetVarName()
			if why := environment.RefusedEnv(v); why != "" {
				return fmt.Errorf("credentials[%d] (%s): environment variable %q %s; the docker backend does not set it from a credential, choose another name: %w", i, c.Name, v, why, errs.FailedPrecondition)
			}
			if vars[v] {
				return fmt.Errorf("credentials[%d] (%s): another credential already sets %s: %w", i, c.Name, v, errs.FailedPrecondition)
			}
			vars[v] = true
		}
	}
	return nil
}

// checkFilePath says why a file credential cannot be mounted at p: not
// an absolute clean path; a path the backend mounts itself, or the
// operator binary; a directory of the image's system (a file cannot
// cover it, and it would hide what the operator needs); under /proc,
// /sys or /dev, which the runtime owns; a file the engine manages
// (/etc/hosts, /etc/hostname, /etc/resolv.conf); or a file that changes
// how the dynamic loader behaves (/etc/ld.so.*).
func (b *Backend) checkFilePath(p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("file path %q is not absolute; the docker backend mounts the file at that path in the container", p)
	}
	if path.Clean(p) != p {
		return fmt.Errorf("file path %q is not clean (write it as %q)", p, path.Clean(p))
	}
	for _, reserved := range []string{Workspace, "/tmp", b.operatorPath} {
		if p == reserved {
			return fmt.Errorf("file path %q would cover a path the docker backend needs", p)
		}
	}
	if environment.IsSystemDir(p) || strings.HasPrefix(b.operatorPath, p+"/") {
		return fmt.Errorf("file path %q would cover a system directory of the container", p)
	}
	for _, dir := range append([]string{EgressDir, path.Dir(StateSocket), path.Dir(ProgressSocket)}, environment.RuntimeDirs...) {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			return fmt.Errorf("file path %q is under %s, which the docker backend or the runtime owns", p, dir)
		}
	}
	if why := environment.RefusedFile(p); why != "" {
		return fmt.Errorf("file path %q %s", p, why)
	}
	return nil
}

// checkLimits refuses limits the backend cannot enforce as asked.
func checkLimits(l environment.Limits) error {
	if l.GPUs > 0 {
		return fmt.Errorf("resources.gpu: the docker backend gives containers no GPUs (it configures no device requests); run GPU work on a backend that schedules GPUs: %w", errs.FailedPrecondition)
	}
	if l.MemoryBytes > 0 && l.MemoryBytes < minMemoryBytes {
		return fmt.Errorf("resources.memory: %d bytes is below the docker engine's minimum of %d bytes (6Mi): %w", l.MemoryBytes, minMemoryBytes, errs.FailedPrecondition)
	}
	if l.CPUMillis > maxCPUMillis {
		return fmt.Errorf("resources.cpu: %dm is more CPU than the docker engine can express: %w", l.CPUMillis, errs.InvalidArgument)
	}
	if l.MaxProcesses > maxPIDs {
		return fmt.Errorf("resources.max_processes: %d is above the kernel's limit of %d tasks: %w", l.MaxProcesses, maxPIDs, errs.InvalidArgument)
	}
	return nil
}

// image returns the image to run for spec.
func (b *Backend) image(spec *environmentv1.EnvironmentSpec) string {
	if img, _ := environment.ContainerImage(spec); img != "" {
		return img
	}
	return b.defaultImage
}

// runtimeFor returns the OCI runtime for spec: Config.Runtime when it
// has a gvisor boundary, else the engine's default.
func (b *Backend) runtimeFor(spec *environmentv1.EnvironmentSpec) string {
	if slices.Contains(environment.Kinds(spec), environment.KindGvisor) {
		return b.runtime
	}
	return ""
}
