package environment

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/services/environment/egress"
	"github.com/secbear/neuron/services/environment/workspace"
)

// Config is everything Run needs to serve the environment: what its
// binary's flags set. Zero values take the defaults noted on each field.
type Config struct {
	// Server is the listen address, TLS, auth, limits and shutdown
	// (pkg/grpcserver).
	Server grpcserver.Config
	// Log receives the service's logs; nil discards them.
	Log *slog.Logger
	// Listener, when set, is served instead of listening on Server.Addr
	// (tests, embedding). Run closes it when it returns.
	Listener net.Listener

	// Backend is the backend for specs that ask for no particular
	// boundary (--backend): "process" (the default), "local", "docker",
	// "kubernetes", or the name of one of ExtraBackends.
	Backend string
	// ContainerBackend is the backend for specs with a container or
	// gvisor boundary (--container-backend): "docker" or "kubernetes".
	// Empty: Backend when it is one of them, else container specs are
	// refused.
	ContainerBackend string
	// ExtraBackends are backends the embedder built itself (another kind
	// of isolation), selected by their names in Backend or
	// ContainerBackend like the built-in ones; no flag sets them. Their
	// names must differ from the built-in backends'. Run does not close
	// them.
	ExtraBackends []Backend

	// DataDir holds the backends' per-invocation directories
	// (--data-dir; the process backend's work directory is DataDir/work,
	// the docker backend's DataDir/docker). Default ".data/environment".
	DataDir string
	// OperatorBinary is the operator binary the process backend runs
	// (--operator-binary). Empty: ./operator beside this executable,
	// else operator on $PATH.
	OperatorBinary string
	// OperatorArgs are extra operator flags every backend that starts
	// the operator passes (--operator-args), e.g. "--tools",
	// "read,write,edit,bash".
	OperatorArgs []string
	// ReadOnly are extra paths the process backend's sandbox may read
	// (--read-only): files named in OperatorArgs.
	ReadOnly []string
	// SecretsDir is the directory of credential files, one per name (a
	// mounted Kubernetes Secret), that specs name in credentials[].name
	// (--secrets-dir). Empty: no secret store; every credential is
	// NOT_FOUND.
	SecretsDir string
	// Operator is the operator service the local backend forwards to
	// (--operator-addr and the other --operator-* flags); it is dialled
	// as given. Required by the local backend, unused otherwise.
	Operator grpcclient.Config
	// State is the state service invocations read their session history
	// from, through a read-only bridge serving only each invocation's
	// own scopes (--state-addr and the other --state-* flags); it is
	// dialled as given. No Target: no bridge, and the operator refuses
	// inputs that name a session.
	State grpcclient.Config

	// DefaultImage is the operator image of container specs that name
	// none (--default-image; docker and kubernetes).
	DefaultImage string
	// DockerHost is the Docker engine endpoint (--docker-host). Empty:
	// $DOCKER_HOST, else the local socket.
	DockerHost string
	// GvisorRuntime enforces the gvisor boundary with this OCI runtime
	// (docker, e.g. runsc) or RuntimeClass (kubernetes, e.g. gvisor)
	// (--gvisor-runtime). Empty: gvisor specs are refused.
	GvisorRuntime string
	// Kubeconfig is the kubeconfig file of the kubernetes backend
	// (--kubeconfig). Empty: the in-cluster service account.
	Kubeconfig string
	// KubeNamespace holds the invocation Jobs (--kube-namespace). Empty:
	// the kubeconfig's namespace, or the pod's own.
	KubeNamespace string
	// KubeCredentialSecrets are the Secrets of the namespace specs may
	// name as credentials (--kube-credential-secrets). Empty: any Secret
	// but the backend's own, including ones that are not credentials.
	KubeCredentialSecrets []string
	// KubeEgressHost is this service's pod IP, where invocation pods
	// with a sidecar credential reach their egress proxy
	// (--kube-egress-host). Empty: sidecar credentials are refused.
	KubeEgressHost string
	// KubeEgressPorts is the port range of those proxies, "MIN-MAX"
	// (--kube-egress-ports). Empty: 20000-20999.
	KubeEgressPorts string
	// KubeStorageClass is the StorageClass of the workspaces' claims
	// (--kube-storage-class). Empty: the cluster's default.
	KubeStorageClass string

	// Defaults are the limits of a run whose spec sets none and the
	// ceilings a spec may ask for (--default-timeout, --max-timeout,
	// --default-memory, --default-max-processes,
	// --default-max-output-bytes). The zero value is DefaultDefaults();
	// any other value is used as given, and its Timeout must be positive
	// and at most its MaxTimeout.
	Defaults Defaults
	// DefaultDiskBytes caps the workspace of a run whose spec sets no
	// resources.disk (--default-disk): the process and docker backends'
	// tmpfs size, the kubernetes backend's ephemeral storage and
	// sizeLimit. Zero: 1 GiB; negative is an error.
	DefaultDiskBytes int64
	// MaxConcurrent is the most invocations run at once; one more is
	// RESOURCE_EXHAUSTED at once, never queued (--max-concurrent). Zero:
	// DefaultMaxConcurrent; negative is an error.
	MaxConcurrent int

	// Progress bounds the progress events of each RunStream invocation;
	// no flag sets it. Zero fields: DefaultProgressLimits.
	Progress ProgressLimits

	// Middleware, when Middleware.Client.Target is set, is the remote
	// policy middleware (layer0.middleware.v1) consulted at the exec
	// boundary before and after each Run and RunStream
	// (--middleware-addr and the other --middleware-* flags, dialled as
	// given). It is dialled at start-up and, unless FailOpen, start-up
	// fails when it cannot be reached; a call it cannot answer is then
	// UNAVAILABLE (FailOpen: the call proceeds, logged).
	Middleware remote.Flags

	// WorkspaceMaxBytes caps each workspace that lasts, a session's or a
	// workflow's (--workspace-max-size): a run leaving more is not
	// stored, an upload past it is refused, both RESOURCE_EXHAUSTED.
	// Zero: DefaultDiskBytes; negative is an error.
	WorkspaceMaxBytes int64
	// WorkspaceRetention removes a workspace that lasts once nobody has
	// run in it or written to it for this long (--workspace-retention).
	// Zero: DefaultWorkspaceRetention; negative: kept until deleted.
	WorkspaceRetention time.Duration

	// EgressStaticHosts pins host names to ip:port addresses for the
	// egress proxies, trusted as given (--egress-static-hosts), e.g. an
	// internal model gateway. Names are matched case-insensitively.
	EgressStaticHosts map[string]string
	// EgressAllowPrivate are private or loopback ranges the egress
	// proxies may reach despite the address checks
	// (--egress-allow-private); the host's own addresses stay refused
	// unless listed exactly (/32, /128).
	EgressAllowPrivate []netip.Prefix
	// EgressCAFile is an extra PEM CA bundle the egress proxies trust for
	// credentialed hosts, on top of the system roots (--egress-ca-file).
	EgressCAFile string
	// EgressResolver resolves the names the egress proxies look up; no
	// flag sets it. Nil: the system resolver (a *net.Resolver with its
	// own Dial reaches a chosen DNS server).
	EgressResolver egress.Resolver
}

// DefaultWorkspaceRetention is Config.WorkspaceRetention when unset: a
// week.
const DefaultWorkspaceRetention = 7 * 24 * time.Hour

// DefaultDataDir is Config.DataDir when unset.
const DefaultDataDir = ".data/environment"

// DefaultDiskBytes is Config.DefaultDiskBytes when unset: 1 GiB.
const DefaultDiskBytes = 1 << 30

// builtinBackends are the backends Run can build, in the order it builds
// them.
var builtinBackends = []string{"process", "local", "docker", "kubernetes"}

// BackendFactory builds one of the built-in backends from the service's
// Config, its defaults filled in (Log, DataDir and DefaultDiskBytes are
// set). release frees what the backend holds once the service has
// stopped (nil: nothing). An error names the setting to fix.
type BackendFactory func(cfg Config) (b Backend, release func(), err error)

var (
	factoriesMu sync.Mutex
	factories   = map[string]BackendFactory{}
)

// RegisterBackend makes a built-in backend ("process", "local", "docker"
// or "kubernetes") available to Run. The backend packages under
// services/environment call it from their init; a binary links a backend
// in by importing its package (the environment binary imports all four).
// It panics on another name or a second registration.
func RegisterBackend(name string, f BackendFactory) {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	if !slices.Contains(builtinBackends, name) {
		panic(fmt.Sprintf("environment: RegisterBackend(%q): not a built-in backend", name))
	}
	if _, dup := factories[name]; dup {
		panic(fmt.Sprintf("environment: RegisterBackend(%q) called twice", name))
	}
	factories[name] = f
}

func factory(name string) BackendFactory {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	return factories[name]
}

// Run serves the environment until ctx ends, then stops gracefully
// (health turns NOT_SERVING, in-flight calls get Server.ShutdownTimeout)
// and returns nil. A bad Config or a failed start-up is an error naming
// the setting (and its flag, e.g. "--default-timeout ...") before
// anything is served.
func Run(ctx context.Context, cfg Config) (err error) {
	if cfg.Listener != nil {
		defer func() {
			if err != nil {
				cfg.Listener.Close()
			}
		}()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Backend == "" {
		cfg.Backend = "process"
	}
	if cfg.ContainerBackend == "" && (cfg.Backend == "docker" || cfg.Backend == "kubernetes") {
		cfg.ContainerBackend = cfg.Backend
	}
	if cfg.DataDir == "" {
		cfg.DataDir = DefaultDataDir
	}
	if cfg.Defaults == (Defaults{}) {
		cfg.Defaults = DefaultDefaults()
	}
	if cfg.DefaultDiskBytes == 0 {
		cfg.DefaultDiskBytes = DefaultDiskBytes
	}
	if cfg.MaxConcurrent < 0 {
		return fmt.Errorf("--max-concurrent %d: want a positive number of invocations", cfg.MaxConcurrent)
	}
	if cfg.WorkspaceMaxBytes < 0 {
		return fmt.Errorf("--workspace-max-size %d bytes: want a positive size such as 1Gi", cfg.WorkspaceMaxBytes)
	}
	if cfg.WorkspaceMaxBytes == 0 {
		cfg.WorkspaceMaxBytes = DefaultDiskBytes
	}
	switch {
	case cfg.WorkspaceRetention == 0:
		cfg.WorkspaceRetention = DefaultWorkspaceRetention
	case cfg.WorkspaceRetention < 0:
		cfg.WorkspaceRetention = 0 // kept until deleted
	}
	log := cfg.Log

	srv, err := grpcserver.New(cfg.Server, log)
	if err != nil {
		return err
	}
	if d := cfg.Defaults; d.Timeout <= 0 || d.MaxTimeout < d.Timeout {
		return fmt.Errorf("--default-timeout %v must be positive and at most --max-timeout %v", d.Timeout, d.MaxTimeout)
	}
	proxies, listenProxies, err := egressFactory(cfg)
	if err != nil {
		return err
	}
	// The policy middleware before the backends: a fail-closed
	// middleware that cannot be reached fails the start.
	mw, closeMW, err := remote.Dial(ctx, cfg.Middleware, log)
	if err != nil {
		return err
	}
	defer closeMW()
	backends, release, err := buildBackends(cfg)
	if err != nil {
		return err
	}
	defer release()
	sc := ServerConfig{
		Backends:      backends,
		Default:       cfg.Backend,
		Container:     cfg.ContainerBackend,
		Secrets:       DirSecrets{Dir: cfg.SecretsDir},
		Defaults:      cfg.Defaults,
		Egress:        proxies,
		EgressListen:  listenProxies,
		MaxConcurrent: cfg.MaxConcurrent,
		Progress:      cfg.Progress,
		Log:           log,
	}
	// Only a backend that keeps workspaces needs the store (the local
	// backend, in a read-only container, has no directory to make it in).
	keeps := false
	for _, b := range backends {
		if p, ok := b.(Persistent); ok && p.PersistentWorkspaces() {
			keeps = true
		}
	}
	if keeps {
		ws, err := workspace.Open(filepath.Join(cfg.DataDir, "workspaces"), cfg.WorkspaceMaxBytes, cfg.WorkspaceRetention, log)
		if err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		sc.Workspaces = ws
		retCtx, stopRetention := context.WithCancel(ctx)
		defer stopRetention()
		go ws.RunRetention(retCtx, min(max(cfg.WorkspaceRetention/10, time.Second), time.Hour))
	}
	if mw != nil {
		sc.Exec, _ = mw.ExecServerInterceptors()
		log.Info("each run is consulted with the exec-boundary middleware", "middleware", cfg.Middleware.Client.Target, "fail_open", cfg.Middleware.FailOpen)
	}
	if cfg.State.Target != "" {
		conn, err := grpcclient.Dial(cfg.State)
		if err != nil {
			return fmt.Errorf("--state-addr: %w", err)
		}
		defer conn.Close()
		sc.State = statev1.NewStateServiceClient(conn)
		log.Info("invocations read session history through a read-only state bridge", "state", cfg.State.Target)
	} else {
		log.Warn("no --state-addr: invocations that name a session will be refused by the operator")
	}
	for _, b := range backends {
		if b.Name() == "process" {
			sc.Process = "process"
		}
	}
	es, err := NewServer(sc)
	if err != nil {
		return err
	}
	// Sandboxes a backend keeps (containers) do not outlive the service.
	defer es.closeSandboxes()
	environmentv1.RegisterEnvironmentServiceServer(srv, es)
	lis := cfg.Listener
	if lis == nil {
		if lis, err = srv.Listen(); err != nil {
			return err
		}
	}
	return srv.Serve(ctx, lis)
}

// egressFactory builds the egress proxy factories (on a Unix socket, on a
// backend's TCP listener) from the administrator's
// settings.
func egressFactory(cfg Config) (EgressFactory, EgressListenFactory, error) {
	opts := EgressOptions{
		StaticHosts:  map[string]string{},
		AllowPrivate: cfg.EgressAllowPrivate,
		Resolver:     cfg.EgressResolver,
	}
	for host, addr := range cfg.EgressStaticHosts {
		if host == "" || addr == "" {
			return nil, nil, fmt.Errorf("--egress-static-hosts: %q is not host=ip:port", host+"="+addr)
		}
		opts.StaticHosts[strings.ToLower(host)] = addr
	}
	for _, p := range cfg.EgressAllowPrivate {
		if !p.IsValid() {
			return nil, nil, fmt.Errorf("--egress-allow-private: %q is not a CIDR", p)
		}
	}
	if cfg.EgressCAFile != "" {
		pem, err := os.ReadFile(cfg.EgressCAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--egress-ca-file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("--egress-ca-file %s: no PEM certificate in it", cfg.EgressCAFile)
		}
		opts.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return NewEgressFactory(opts), NewEgressListenFactory(opts), nil
}

// buildBackends builds the backends cfg names: the built-in ones through
// their registered factories, in a fixed order, then the embedder's own.
// release frees what they hold, last built first.
func buildBackends(cfg Config) ([]Backend, func(), error) {
	var (
		out      []Backend
		releases []func()
	)
	release := func() {
		for i := len(releases) - 1; i >= 0; i-- {
			releases[i]()
		}
	}
	fail := func(err error) ([]Backend, func(), error) {
		release()
		return nil, func() {}, err
	}
	var extra []string
	for _, b := range cfg.ExtraBackends {
		if slices.Contains(builtinBackends, b.Name()) {
			return fail(fmt.Errorf("extra backend %q: the name of a built-in backend", b.Name()))
		}
		extra = append(extra, b.Name())
	}
	want := []string{cfg.Backend}
	if cfg.ContainerBackend != "" && cfg.ContainerBackend != cfg.Backend {
		want = append(want, cfg.ContainerBackend)
	}
	for _, name := range want {
		if !slices.Contains(extra, name) && !slices.Contains(builtinBackends, name) {
			known := append(slices.Clone(builtinBackends), extra...)
			return fail(fmt.Errorf("unknown backend %q: want %s or %s", name, strings.Join(known[:len(known)-1], ", "), known[len(known)-1]))
		}
	}
	if cfg.ContainerBackend == "process" || cfg.ContainerBackend == "local" {
		return fail(fmt.Errorf("--container-backend %q: want docker or kubernetes", cfg.ContainerBackend))
	}
	if cfg.DefaultDiskBytes < 0 {
		return fail(fmt.Errorf("--default-disk %d bytes: want a positive size such as 1Gi", cfg.DefaultDiskBytes))
	}
	for _, name := range builtinBackends {
		if !slices.Contains(want, name) {
			continue
		}
		f := factory(name)
		if f == nil {
			return fail(fmt.Errorf("backend %q is not linked into this program: import github.com/secbear/neuron/services/environment/%s", name, name))
		}
		b, rel, err := f(cfg)
		if err != nil {
			return fail(err)
		}
		if rel != nil {
			releases = append(releases, rel)
		}
		out = append(out, b)
	}
	for _, b := range cfg.ExtraBackends {
		out = append(out, b)
	}
	return out, release, nil
}
