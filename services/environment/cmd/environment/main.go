// Command environment serves layer0.environment.v1.EnvironmentService:
// it runs one operator invocation inside the isolation its spec asks for
// (a confined process by default; a container through the Docker engine;
// a Kubernetes Job) and refuses a spec it cannot enforce. Every flag has
// an env fallback: --backend is NEURON_ENVIRONMENT_BACKEND, and so on.
// Run with --help for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/environment"
	// The backends register themselves with environment.Run.
	_ "github.com/secbear/neuron/services/environment/docker"
	_ "github.com/secbear/neuron/services/environment/kubernetes"
	_ "github.com/secbear/neuron/services/environment/local"
	_ "github.com/secbear/neuron/services/environment/process"
)

const envPrefix = "NEURON_ENVIRONMENT"

func main() {
	sandbox.Main() // the process backend re-executes this binary as its trampoline
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "environment: %v\n", err)
		os.Exit(1)
	}
}

// flags is the parsed command line.
type flags struct {
	srv       grpcserver.Config
	operator  grpcclient.Config
	state     grpcclient.Config
	mw        remote.Flags
	dataDir   string
	backend   string
	container string
	logLevel  string
	logFormat string

	// process backend
	operatorBinary string
	operatorArgs   string
	readOnly       string
	secretsDir     string

	// container backends
	defaultImage  string
	dockerHost    string
	gvisorRuntime string
	kubeNamespace string
	kubeconfig    string
	kubeSecrets   string
	kubeEgress    string
	kubePorts     string
	kubeStorage   string

	// defaults and ceilings
	defaultTimeout time.Duration
	maxTimeout     time.Duration
	defaultMemory  string
	defaultProcs   uint
	defaultOutput  uint64
	defaultDisk    string
	maxConcurrent  int
	wsMaxSize      string
	wsRetention    time.Duration

	// egress
	staticHosts  string
	allowPrivate string
	egressCA     string
}

func parse(args []string, stderr io.Writer) (*flags, error) {
	f := &flags{srv: grpcserver.Config{Name: "environment", Addr: "127.0.0.1:7073"}}
	fs := flag.NewFlagSet("environment", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.srv.BindFlags(fs)
	f.operator.BindFlags(fs, "operator")
	f.state.BindFlags(fs, "state")
	f.mw.Bind(fs)
	d := environment.DefaultDefaults()
	fs.StringVar(&f.dataDir, "data-dir", environment.DefaultDataDir, "directory for per-invocation work directories (removed after each run)")
	fs.StringVar(&f.backend, "backend", "process", "backend for specs that ask for no particular boundary: process, local (forwards to --operator-addr, no isolation), docker or kubernetes")
	fs.StringVar(&f.container, "container-backend", "", "backend for specs with a container (or gvisor) boundary: docker or kubernetes (default: --backend when it is one of them; else container specs are refused)")
	fs.StringVar(&f.operatorBinary, "operator-binary", "", "operator binary the process backend runs (default: ./operator beside this binary, else operator on $PATH)")
	fs.StringVar(&f.operatorArgs, "operator-args", "", `extra operator flags, space-separated, e.g. "--tools read,write,edit,bash --script /etc/neuron/script.json"`)
	fs.StringVar(&f.readOnly, "read-only", "", "comma-separated extra paths the process backend's sandbox may read (files named in --operator-args)")
	fs.StringVar(&f.secretsDir, "secrets-dir", "", "directory of credential files, one per name (a mounted Kubernetes Secret); specs name them in credentials[].name")
	fs.StringVar(&f.defaultImage, "default-image", "", "operator image for container specs that name none")
	fs.StringVar(&f.dockerHost, "docker-host", "", "Docker engine endpoint, e.g. unix:///var/run/docker.sock (default: $DOCKER_HOST)")
	fs.StringVar(&f.gvisorRuntime, "gvisor-runtime", "", "enforce the gvisor boundary with this OCI runtime (docker, e.g. runsc) or RuntimeClass (kubernetes, e.g. gvisor); empty: gvisor specs are refused")
	fs.StringVar(&f.kubeNamespace, "kube-namespace", "", "namespace of the invocation Jobs (default: the pod's own namespace)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the in-cluster service account)")
	fs.StringVar(&f.kubeEgress, "kube-egress-host", "", "this pod's IP (the downward API's status.podIP): invocation pods with a sidecar credential (a model key) reach their egress proxy there, which injects it from --secrets-dir; empty refuses sidecar credentials (kubernetes backend)")
	fs.StringVar(&f.kubePorts, "kube-egress-ports", "20000-20999", "port range of those egress proxies, one port per running invocation; the environment's NetworkPolicy must let invocation pods reach it (kubernetes backend)")
	fs.StringVar(&f.kubeStorage, "kube-storage-class", "", "StorageClass of the workspaces that last, a PersistentVolumeClaim each (kubernetes backend); empty: the cluster's default class")
	fs.StringVar(&f.kubeSecrets, "kube-credential-secrets", "", "comma-separated Secrets of the namespace that specs may name as credentials (kubernetes backend); empty allows any Secret but the backend's own, including ones that are not credentials (TLS keys, database passwords)")
	fs.DurationVar(&f.defaultTimeout, "default-timeout", d.Timeout, "wall-clock limit of a run whose spec sets none")
	fs.DurationVar(&f.maxTimeout, "max-timeout", d.MaxTimeout, "longest timeout a spec may ask for")
	fs.StringVar(&f.defaultMemory, "default-memory", "2Gi", "memory limit of a run whose spec sets none (quantity, e.g. 512Mi)")
	fs.UintVar(&f.defaultProcs, "default-max-processes", uint(d.Limits.MaxProcesses), "process limit of a run whose spec sets none")
	fs.Uint64Var(&f.defaultOutput, "default-max-output-bytes", d.Limits.MaxOutputBytes, "output read back from a run whose spec sets none")
	fs.StringVar(&f.defaultDisk, "default-disk", "1Gi", "disk cap of a run whose spec sets no resources.disk (process and docker: the workspace tmpfs's size; kubernetes: ephemeral storage and the workspace's sizeLimit)")
	fs.IntVar(&f.maxConcurrent, "max-concurrent", environment.DefaultMaxConcurrent, "most invocations run at once; a Run past it is RESOURCE_EXHAUSTED at once, never queued")
	fs.StringVar(&f.wsMaxSize, "workspace-max-size", "1Gi", "size cap of each workspace that lasts (a session's or a workflow's, spec.workspace): a run leaving more is not stored, an upload past it is refused")
	fs.DurationVar(&f.wsRetention, "workspace-retention", environment.DefaultWorkspaceRetention, "remove a workspace that lasts once unused for this long; negative: keep until deleted")
	fs.StringVar(&f.staticHosts, "egress-static-hosts", "", "comma-separated host=ip:port pins for the egress proxy, trusted as given (e.g. an internal model gateway)")
	fs.StringVar(&f.allowPrivate, "egress-allow-private", "", "comma-separated CIDRs the egress proxy may reach although they are private or loopback; the host's own addresses stay refused unless listed exactly (/32, /128)")
	fs.StringVar(&f.egressCA, "egress-ca-file", "", "extra CA bundle the egress proxy trusts for credentialed hosts")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "json", "json or text")
	fs.Usage = flagenv.Usage(fs, envPrefix, "environment: the layer0 EnvironmentService (one operator invocation inside isolation)")
	if err := flagenv.Parse(fs, envPrefix, args, nil); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	// Zero is Run's default for embedders; on the command line it is a
	// mistake.
	if f.maxConcurrent <= 0 {
		return nil, fmt.Errorf("--max-concurrent %d: want a positive number of invocations", f.maxConcurrent)
	}
	// The service's clients follow --dev and --plaintext.
	f.operator.Dev, f.operator.Plaintext = f.srv.Dev, f.srv.Plaintext
	f.state.Dev, f.state.Plaintext = f.srv.Dev, f.srv.Plaintext
	f.mw.Client.Dev, f.mw.Client.Plaintext = f.srv.Dev, f.srv.Plaintext
	// --otel, --otel-endpoint: spans of the calls it makes too.
	otel := f.srv.Telemetry || f.srv.OTel.Enabled()
	f.operator.Telemetry, f.state.Telemetry, f.mw.Client.Telemetry = otel, otel, otel
	return f, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	f, err := parse(args, stderr)
	if err != nil {
		return err
	}
	log, err := logging.New(stderr, logging.Options{Level: f.logLevel, Format: f.logFormat, Service: "environment"})
	if err != nil {
		return err
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	cfg.Log = log
	return environment.Run(ctx, cfg)
}

// config turns the flags into the service's Config; it checks their
// syntax (quantities, lists), and Run their values.
func (f *flags) config() (environment.Config, error) {
	cfg := environment.Config{
		Server:                f.srv,
		Backend:               f.backend,
		ContainerBackend:      f.container,
		DataDir:               f.dataDir,
		OperatorBinary:        f.operatorBinary,
		OperatorArgs:          strings.Fields(f.operatorArgs),
		ReadOnly:              flagenv.SplitList(f.readOnly),
		SecretsDir:            f.secretsDir,
		Operator:              f.operator,
		State:                 f.state,
		Middleware:            f.mw,
		DefaultImage:          f.defaultImage,
		DockerHost:            f.dockerHost,
		GvisorRuntime:         f.gvisorRuntime,
		Kubeconfig:            f.kubeconfig,
		KubeNamespace:         f.kubeNamespace,
		KubeCredentialSecrets: flagenv.SplitList(f.kubeSecrets),
		KubeEgressHost:        f.kubeEgress,
		KubeEgressPorts:       f.kubePorts,
		KubeStorageClass:      f.kubeStorage,
		MaxConcurrent:         f.maxConcurrent,
		EgressCAFile:          f.egressCA,
	}
	var err error
	if cfg.Defaults, err = f.defaults(); err != nil {
		return cfg, err
	}
	disk, err := resource.ParseQuantity(f.defaultDisk)
	if err != nil || disk.Sign() <= 0 || disk.Value() <= 0 {
		return cfg, fmt.Errorf("--default-disk %q: want a quantity such as 1Gi", f.defaultDisk)
	}
	cfg.DefaultDiskBytes = disk.Value()
	wsMax, err := resource.ParseQuantity(f.wsMaxSize)
	if err != nil || wsMax.Sign() <= 0 || wsMax.Value() <= 0 {
		return cfg, fmt.Errorf("--workspace-max-size %q: want a quantity such as 1Gi", f.wsMaxSize)
	}
	cfg.WorkspaceMaxBytes = wsMax.Value()
	cfg.WorkspaceRetention = f.wsRetention
	if f.wsRetention == 0 {
		return cfg, fmt.Errorf("--workspace-retention 0: want a duration such as 168h, or a negative one to keep workspaces until deleted")
	}
	for _, kv := range flagenv.SplitList(f.staticHosts) {
		host, addr, ok := strings.Cut(kv, "=")
		if !ok || host == "" || addr == "" {
			return cfg, fmt.Errorf("--egress-static-hosts: %q is not host=ip:port", kv)
		}
		if cfg.EgressStaticHosts == nil {
			cfg.EgressStaticHosts = map[string]string{}
		}
		cfg.EgressStaticHosts[host] = addr
	}
	for _, c := range flagenv.SplitList(f.allowPrivate) {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return cfg, fmt.Errorf("--egress-allow-private: %q is not a CIDR", c)
		}
		cfg.EgressAllowPrivate = append(cfg.EgressAllowPrivate, p)
	}
	return cfg, nil
}

// defaults reads the default limits; Run checks the timeouts.
func (f *flags) defaults() (environment.Defaults, error) {
	d := environment.DefaultDefaults()
	d.Timeout, d.MaxTimeout = f.defaultTimeout, f.maxTimeout
	if f.defaultMemory != "" {
		q, err := resource.ParseQuantity(f.defaultMemory)
		if err != nil || q.Sign() <= 0 {
			return d, fmt.Errorf("--default-memory %q: want a quantity such as 512Mi", f.defaultMemory)
		}
		d.Limits.MemoryBytes = q.Value()
	} else {
		d.Limits.MemoryBytes = 0
	}
	d.Limits.MaxProcesses = uint32(min(f.defaultProcs, 1<<31))
	d.Limits.MaxOutputBytes = f.defaultOutput
	return d, nil
}
