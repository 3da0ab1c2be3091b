// Command environment serves layer0.environment.v1.EnvironmentService:
// it runs one operator invocation inside the isolation its spec asks for
// (a confined process by default; a container through the Docker engine;
// a Kubernetes Job) and refuses a spec it cannot enforce. Every flag has
// an env fallback: --backend is NEURON_ENVIRONMENT_BACKEND, and so on.
// Run with --help for the list.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/docker"
	"github.com/secbear/neuron/services/environment/kubernetes"
	"github.com/secbear/neuron/services/environment/local"
	"github.com/secbear/neuron/services/environment/process"
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

	// defaults and ceilings
	defaultTimeout time.Duration
	maxTimeout     time.Duration
	defaultMemory  string
	defaultProcs   uint
	defaultOutput  uint64
	defaultDisk    string
	maxConcurrent  int

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
	d := environment.DefaultDefaults()
	fs.StringVar(&f.dataDir, "data-dir", ".data/environment", "directory for per-invocation work directories (removed after each run)")
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
	fs.StringVar(&f.kubeSecrets, "kube-credential-secrets", "", "comma-separated Secrets of the namespace that specs may name as credentials (kubernetes backend); empty allows any Secret but the backend's own, including ones that are not credentials (TLS keys, database passwords)")
	fs.DurationVar(&f.defaultTimeout, "default-timeout", d.Timeout, "wall-clock limit of a run whose spec sets none")
	fs.DurationVar(&f.maxTimeout, "max-timeout", d.MaxTimeout, "longest timeout a spec may ask for")
	fs.StringVar(&f.defaultMemory, "default-memory", "2Gi", "memory limit of a run whose spec sets none (quantity, e.g. 512Mi)")
	fs.UintVar(&f.defaultProcs, "default-max-processes", uint(d.Limits.MaxProcesses), "process limit of a run whose spec sets none")
	fs.Uint64Var(&f.defaultOutput, "default-max-output-bytes", d.Limits.MaxOutputBytes, "output read back from a run whose spec sets none")
	fs.StringVar(&f.defaultDisk, "default-disk", "1Gi", "disk cap of a run whose spec sets no resources.disk (process and docker: the workspace tmpfs's size; kubernetes: ephemeral storage and the workspace's sizeLimit)")
	fs.IntVar(&f.maxConcurrent, "max-concurrent", environment.DefaultMaxConcurrent, "most invocations run at once; a Run past it is RESOURCE_EXHAUSTED at once, never queued")
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
	if f.maxConcurrent <= 0 {
		return nil, fmt.Errorf("--max-concurrent %d: want a positive number of invocations", f.maxConcurrent)
	}
	f.operator.Dev, f.operator.Plaintext = f.srv.Dev, f.srv.Plaintext
	f.state.Dev, f.state.Plaintext = f.srv.Dev, f.srv.Plaintext
	if f.container == "" && (f.backend == "docker" || f.backend == "kubernetes") {
		f.container = f.backend
	}
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
	srv, err := grpcserver.New(f.srv, log)
	if err != nil {
		return err
	}
	defaults, err := f.defaults()
	if err != nil {
		return err
	}
	egress, err := f.egress()
	if err != nil {
		return err
	}
	backends, closeAll, err := f.backends(log)
	if err != nil {
		return err
	}
	defer closeAll()
	cfg := environment.Config{
		Backends:  backends,
		Default:   f.backend,
		Container: f.container,
		Secrets:   environment.DirSecrets{Dir: f.secretsDir},
		Defaults:  defaults,
		Egress:    egress,
		Log:       log,
	}
	cfg.MaxConcurrent = f.maxConcurrent
	if f.state.Target != "" {
		conn, err := grpcclient.Dial(f.state)
		if err != nil {
			return fmt.Errorf("--state-addr: %w", err)
		}
		defer conn.Close()
		cfg.State = statev1.NewStateServiceClient(conn)
		log.Info("invocations read session history through a read-only state bridge", "state", f.state.Target)
	} else {
		log.Warn("no --state-addr: invocations that name a session will be refused by the operator")
	}
	for _, b := range backends {
		if b.Name() == "process" {
			cfg.Process = "process"
		}
	}
	es, err := environment.NewServer(cfg)
	if err != nil {
		return err
	}
	environmentv1.RegisterEnvironmentServiceServer(srv, es)
	lis, err := srv.Listen()
	if err != nil {
		return err
	}
	return srv.Serve(ctx, lis)
}

// defaults reads the default limits.
func (f *flags) defaults() (environment.Defaults, error) {
	d := environment.DefaultDefaults()
	d.Timeout, d.MaxTimeout = f.defaultTimeout, f.maxTimeout
	if d.Timeout <= 0 || d.MaxTimeout < d.Timeout {
		return d, fmt.Errorf("--default-timeout %v must be positive and at most --max-timeout %v", d.Timeout, d.MaxTimeout)
	}
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

// egress builds the egress proxy factory from the administrator's flags.
func (f *flags) egress() (environment.EgressFactory, error) {
	opts := environment.EgressOptions{StaticHosts: map[string]string{}}
	for _, kv := range splitList(f.staticHosts) {
		host, addr, ok := strings.Cut(kv, "=")
		if !ok || host == "" || addr == "" {
			return nil, fmt.Errorf("--egress-static-hosts: %q is not host=ip:port", kv)
		}
		opts.StaticHosts[strings.ToLower(host)] = addr
	}
	for _, c := range splitList(f.allowPrivate) {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("--egress-allow-private: %q is not a CIDR", c)
		}
		opts.AllowPrivate = append(opts.AllowPrivate, p)
	}
	if f.egressCA != "" {
		pem, err := os.ReadFile(f.egressCA)
		if err != nil {
			return nil, fmt.Errorf("--egress-ca-file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--egress-ca-file %s: no PEM certificate in it", f.egressCA)
		}
		opts.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return environment.NewEgressFactory(opts), nil
}

// backends constructs the configured backends by hand.
func (f *flags) backends(log *slog.Logger) ([]environment.Backend, func(), error) {
	var (
		out     []environment.Backend
		closers []func()
	)
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(err error) ([]environment.Backend, func(), error) {
		closeAll()
		return nil, func() {}, err
	}
	want := map[string]bool{f.backend: true}
	if f.container != "" {
		want[f.container] = true
	}
	for name := range want {
		switch name {
		case "process", "local", "docker", "kubernetes":
		default:
			return fail(fmt.Errorf("unknown backend %q: want process, local, docker or kubernetes", name))
		}
	}
	if f.container == "process" || f.container == "local" {
		return fail(fmt.Errorf("--container-backend %q: want docker or kubernetes", f.container))
	}
	opArgs := strings.Fields(f.operatorArgs)
	disk, err := resource.ParseQuantity(f.defaultDisk)
	if err != nil || disk.Sign() <= 0 || disk.Value() <= 0 {
		return fail(fmt.Errorf("--default-disk %q: want a quantity such as 1Gi", f.defaultDisk))
	}
	if want["process"] {
		bin, err := operatorBinary(f.operatorBinary)
		if err != nil {
			return fail(err)
		}
		b, err := process.New(process.Config{
			OperatorBinary: bin,
			OperatorArgs:   opArgs,
			WorkDir:        filepath.Join(f.dataDir, "work"),
			ReadOnly:       splitList(f.readOnly),
			DiskBytes:      disk.Value(),
			Log:            log,
		})
		if err != nil {
			return fail(err)
		}
		if err := sandbox.Supported(); err != nil {
			log.Warn("the process backend will refuse every spec: this kernel cannot confine it", "reason", err.Error())
		} else if err := sandbox.CgroupSupported(); err != nil {
			log.Warn("the process backend will refuse every spec: no usable cgroup", "reason", err.Error())
		}
		log.Info("backend", "name", "process", "operator", bin, "work_dir", filepath.Join(f.dataDir, "work"))
		out = append(out, b)
	}
	if want["local"] {
		if f.operator.Target == "" {
			return fail(errors.New("--backend local needs --operator-addr, the operator service to forward to"))
		}
		conn, err := grpcclient.Dial(f.operator)
		if err != nil {
			return fail(fmt.Errorf("--operator-addr: %w", err))
		}
		closers = append(closers, func() { conn.Close() })
		log.Warn("LOCAL BACKEND: invocations run in the operator service without isolation; specs asking for any are refused", "operator", f.operator.Target)
		out = append(out, local.New(operatorv1.NewOperatorServiceClient(conn)))
	}
	// The container backends' own defaults, for what neither a spec nor
	// the service's defaults bound.
	containerLimits := environment.Limits{DiskBytes: disk.Value()}
	if want["docker"] {
		b, err := docker.New(docker.Config{
			Host:          f.dockerHost,
			DefaultImage:  f.defaultImage,
			OperatorArgs:  opArgs,
			WorkDir:       filepath.Join(f.dataDir, "docker"),
			Runtime:       f.gvisorRuntime,
			DefaultLimits: containerLimits,
			Log:           log,
		})
		if err != nil {
			return fail(fmt.Errorf("docker backend: %w", err))
		}
		closers = append(closers, func() { _ = b.Close() })
		out = append(out, b)
	}
	if want["kubernetes"] {
		client, ns, err := kubeClient(f.kubeconfig, f.kubeNamespace)
		if err != nil {
			return fail(fmt.Errorf("kubernetes backend: %w", err))
		}
		b, err := kubernetes.New(kubernetes.Config{
			Client:             client,
			Namespace:          ns,
			DefaultImage:       f.defaultImage,
			OperatorArgs:       opArgs,
			RuntimeClassGvisor: f.gvisorRuntime,
			DefaultLimits:      containerLimits,
			CredentialSecrets:  splitList(f.kubeSecrets),
			Log:                log,
		})
		if err != nil {
			return fail(fmt.Errorf("kubernetes backend: %w", err))
		}
		out = append(out, b)
	}
	return out, closeAll, nil
}

// operatorBinary finds the operator binary: the flag, else ./operator
// beside this executable, else operator on $PATH.
func operatorBinary(flagValue string) (string, error) {
	if flagValue != "" {
		return filepath.Abs(flagValue)
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "operator")
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath("operator")
	if err != nil {
		return "", errors.New("no operator binary: pass --operator-binary, or put operator beside this binary or on $PATH (make build puts both in bin/)")
	}
	return filepath.Abs(p)
}

// kubeClient connects to the API server: a kubeconfig file, else the
// in-cluster service account.
func kubeClient(kubeconfig, namespace string) (k8s.Interface, string, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
		if cfg, err = loader.ClientConfig(); err != nil {
			return nil, "", fmt.Errorf("--kubeconfig: %w", err)
		}
		if namespace == "" {
			if namespace, _, err = loader.Namespace(); err != nil {
				return nil, "", err
			}
		}
	} else {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, "", fmt.Errorf("not in a cluster and no --kubeconfig: %w", err)
		}
		if namespace == "" {
			b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
			if err != nil {
				return nil, "", fmt.Errorf("--kube-namespace not set and the pod's namespace is unreadable: %w", err)
			}
			namespace = strings.TrimSpace(string(b))
		}
	}
	client, err := k8s.NewForConfig(cfg)
	if err != nil {
		return nil, "", err
	}
	return client, namespace, nil
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
