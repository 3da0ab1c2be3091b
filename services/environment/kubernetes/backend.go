package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path"
	"slices"
	"strings"
	"time"
	"unicode"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// Config configures a Backend.
type Config struct {
	// Client talks to the cluster (NewClient).
	Client Client
	// Namespace holds every object the backend creates and the Secrets
	// credentials name. Required.
	Namespace string
	// DefaultImage is the operator image for specs that name none.
	DefaultImage string
	// OperatorPath is the operator binary inside the image; "" means
	// "/operator".
	OperatorPath string
	// OperatorArgs are passed to the operator before the one-shot ones.
	OperatorArgs []string
	// SecretKey is the key inside a credential's Secret when the
	// credential's name has no "/key" suffix; "" means "value".
	SecretKey string
	// RuntimeClassGvisor is the RuntimeClass whose pods run under gVisor;
	// "" refuses specs that ask for gvisor isolation.
	RuntimeClassGvisor string
	// DefaultLimits fill in each zero CPU, memory, disk and output limit
	// of an invocation (whose limits are the spec's, else the service's
	// defaults), so that no pod runs without resource limits and an
	// ephemeral-storage limit. A zero field here takes the package
	// default: DefaultCPUMillis, DefaultMemoryBytes, DefaultDiskBytes,
	// DefaultMaxOutputBytes. Its other fields are ignored.
	DefaultLimits environment.Limits
	// CredentialSecrets, when not empty, are the only Secrets credentials
	// may name; nil allows any Secret of the namespace except the
	// backend's own (ObjectPrefix...), which hold other invocations'
	// inputs. The namespace may hold Secrets that are not credentials
	// (TLS keys, database passwords): list the credential Secrets here,
	// or run invocations in a namespace of their own.
	CredentialSecrets []string
	// WorkspaceStorageClass is the StorageClass of the workspaces that
	// last (a PersistentVolumeClaim each, of the workspace's size cap);
	// "" is the cluster's default class.
	WorkspaceStorageClass string
	// EgressHost is this service's own address as invocation pods reach
	// it (its pod IP): an invocation with a sidecar credential (a model
	// key) gets its egress proxy there, on a port of EgressPortMin to
	// EgressPortMax, which injects the credential; its operator is
	// pointed at the proxy with a token of the invocation's, and its
	// NetworkPolicy allows that address and port. The credential's value
	// comes from the service's secrets and never enters the pod. ""
	// refuses sidecar credentials.
	EgressHost string
	// EgressPortMin and EgressPortMax bound the proxies' ports; 0 means
	// DefaultEgressPortMin and DefaultEgressPortMax.
	EgressPortMin, EgressPortMax int
	// PollInterval is how often the Job and its pod are read when the
	// watch is quiet or broken; 0 means one second.
	PollInterval time.Duration
	// Logs opens the log of the operator container of a pod; nil reads
	// it through Client (tests inject their own: a fake clientset has no
	// logs).
	Logs func(ctx context.Context, namespace, pod string) (io.ReadCloser, error)
	// Log receives the backend's diagnostics; nil discards them.
	Log *slog.Logger
}

// The limits every pod gets when neither its spec, the service's defaults
// nor Config.DefaultLimits set one; requests equal limits.
const (
	// DefaultCPUMillis is one core.
	DefaultCPUMillis = 1000
	// DefaultMemoryBytes is 2 GiB.
	DefaultMemoryBytes = 2 << 30
	// DefaultDiskBytes is the ephemeral storage (workspace, /tmp, the
	// container's writable layer and logs), 1 GiB.
	DefaultDiskBytes = 1 << 30
	// DefaultMaxOutputBytes bounds the pod log read back, 16 MiB.
	DefaultMaxOutputBytes = 16 << 20
)

// The ports of the egress proxies, when Config sets none: the environment
// service's NetworkPolicy lets invocation pods reach this range.
const (
	DefaultEgressPortMin = 20000
	DefaultEgressPortMax = 20999
)

// maxOutputBytes bounds the pod log held in memory whatever the limits
// say (the process backend's bound too).
const maxOutputBytes = 1 << 30

// Backend runs each invocation as a Kubernetes Job. It implements
// environment.Backend and environment.ByReference.
type Backend struct {
	cfg Config
	log *slog.Logger
	// grace is how long past an invocation's timeout the backend waits
	// for the Job controller to report the deadline before giving up.
	grace time.Duration
	// cleanupTimeout bounds the deletions after a run.
	cleanupTimeout time.Duration
}

var (
	_ environment.Backend     = (*Backend)(nil)
	_ environment.ByReference = (*Backend)(nil)
)

// Names of things inside the pod.
const (
	// InvocationLabel labels the pod (and the backend's objects) with
	// the invocation's id; the NetworkPolicy selects the pod by it.
	InvocationLabel = "neuron.dev/invocation"
	// ObjectPrefix starts the name of every object the backend creates;
	// the invocation's id follows.
	ObjectPrefix = "neuron-inv-"

	containerName = "operator"
	inputDir      = "/input"
	inputFile     = "input.json"
	workspaceDir  = "/workspace"
	tmpDir        = "/tmp"
	// runAsID is the user, group and fsGroup of the pod (the "nonroot"
	// user of distroless images).
	runAsID = 65532
	// gpuResource is the extended resource GPUs are asked for as.
	gpuResource = "nvidia.com/gpu"
)

// New returns a Backend for cfg.
func New(cfg Config) (*Backend, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubernetes backend: Config.Client is required")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("kubernetes backend: Config.Namespace is required")
	}
	if msgs := validation.IsDNS1123Label(cfg.Namespace); len(msgs) > 0 {
		return nil, fmt.Errorf("kubernetes backend: namespace %q: %s", cfg.Namespace, strings.Join(msgs, "; "))
	}
	if cfg.OperatorPath == "" {
		cfg.OperatorPath = "/operator"
	}
	if cfg.SecretKey == "" {
		cfg.SecretKey = "value"
	}
	if msgs := validation.IsConfigMapKey(cfg.SecretKey); len(msgs) > 0 {
		return nil, fmt.Errorf("kubernetes backend: secret key %q: %s", cfg.SecretKey, strings.Join(msgs, "; "))
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.EgressPortMin == 0 && cfg.EgressPortMax == 0 {
		cfg.EgressPortMin, cfg.EgressPortMax = DefaultEgressPortMin, DefaultEgressPortMax
	}
	if cfg.EgressPortMin < 1 || cfg.EgressPortMax > 65535 || cfg.EgressPortMin > cfg.EgressPortMax {
		return nil, fmt.Errorf("kubernetes backend: egress ports %d-%d: want a range within 1-65535", cfg.EgressPortMin, cfg.EgressPortMax)
	}
	if cfg.EgressHost != "" {
		if _, err := netip.ParseAddr(cfg.EgressHost); err != nil {
			return nil, fmt.Errorf("kubernetes backend: egress host %q: want this pod's IP address (status.podIP): %v", cfg.EgressHost, err)
		}
	}
	d := cfg.DefaultLimits
	cfg.DefaultLimits = environment.Limits{CPUMillis: DefaultCPUMillis, MemoryBytes: DefaultMemoryBytes, DiskBytes: DefaultDiskBytes, MaxOutputBytes: DefaultMaxOutputBytes}
	if d.CPUMillis > 0 {
		cfg.DefaultLimits.CPUMillis = d.CPUMillis
	}
	if d.MemoryBytes > 0 {
		cfg.DefaultLimits.MemoryBytes = d.MemoryBytes
	}
	if d.DiskBytes > 0 {
		cfg.DefaultLimits.DiskBytes = d.DiskBytes
	}
	if d.MaxOutputBytes > 0 {
		cfg.DefaultLimits.MaxOutputBytes = d.MaxOutputBytes
	}
	for _, s := range cfg.CredentialSecrets {
		if msgs := validation.IsDNS1123Subdomain(s); len(msgs) > 0 {
			return nil, fmt.Errorf("kubernetes backend: credential Secret %q: %s", s, strings.Join(msgs, "; "))
		}
	}
	cfg.CredentialSecrets = slices.Clone(cfg.CredentialSecrets)
	if cfg.Logs == nil {
		client := cfg.Client
		cfg.Logs = func(ctx context.Context, namespace, pod string) (io.ReadCloser, error) {
			return client.PodLogs(ctx, namespace, pod, containerName)
		}
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Backend{cfg: cfg, log: log, grace: 15 * time.Second, cleanupTimeout: 30 * time.Second}, nil
}

// Name returns "kubernetes".
func (b *Backend) Name() string { return "kubernetes" }

// SecretsByReference returns true: credentials are Secrets in the
// namespace, named by the credential, and their values never pass through
// the environment service.
func (b *Backend) SecretsByReference() bool { return true }

// Check returns nil when a Job can enforce every part of spec, else an
// error wrapping errs.FailedPrecondition (errs.InvalidArgument for a
// malformed network rule) that says what to change.
func (b *Backend) Check(spec *environmentv1.EnvironmentSpec) error {
	supported := []string{environment.KindContainer, environment.KindNetworkPolicy}
	if b.cfg.RuntimeClassGvisor != "" {
		supported = append(supported, environment.KindGvisor)
	}
	if err := environment.Unsupported(b.Name(), spec, supported...); err != nil {
		return err
	}
	if _, err := b.image(spec); err != nil {
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
		if r.MaxProcesses != nil {
			return fmt.Errorf("the kubernetes backend cannot limit processes per pod (the kubelet's pod PID limit applies); remove resources.max_processes: %w", errs.FailedPrecondition)
		}
		if r.CpuTime != nil {
			return fmt.Errorf("the kubernetes backend cannot limit CPU time per process; remove resources.cpu_time and rely on the timeout and resources.cpu: %w", errs.FailedPrecondition)
		}
	}
	p, err := environment.ParseNetwork(spec)
	if err != nil {
		return err
	}
	if _, err := egressRules(p); err != nil {
		return err
	}
	creds := make([]environment.Credential, 0, len(spec.GetCredentials()))
	for _, c := range spec.GetCredentials() {
		creds = append(creds, environment.Credential{Name: c.GetName(), Injection: c.GetInjection()})
	}
	return b.checkCredentials(creds)
}

// image returns the image to run for spec.
func (b *Backend) image(spec *environmentv1.EnvironmentSpec) (string, error) {
	image, _ := environment.ContainerImage(spec)
	if image == "" {
		image = b.cfg.DefaultImage
	}
	if image == "" {
		return "", fmt.Errorf("the kubernetes backend has no default image; name one in isolation.container.image: %w", errs.FailedPrecondition)
	}
	if strings.IndexFunc(image, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 || strings.HasPrefix(image, "-") {
		return "", fmt.Errorf("image %q is not an image reference: %w", image, errs.FailedPrecondition)
	}
	return image, nil
}

// secretRef splits a credential name into the Secret's name and key.
func (b *Backend) secretRef(name string) (secret, key string) {
	secret, key, ok := strings.Cut(name, "/")
	if !ok {
		key = b.cfg.SecretKey
	}
	return secret, key
}

// checkCredentials refuses credentials a pod cannot, or may not, receive
// by reference: a name that is not a Secret (and key) of the namespace,
// the backend's own input Secrets, a Secret outside
// Config.CredentialSecrets (NOT_FOUND), a variable environment.RefusedEnv refuses or
// that another credential sets, a file path checkFilePath refuses or
// that another credential uses.
func (b *Backend) checkCredentials(creds []environment.Credential) error {
	paths, vars := map[string]bool{}, map[string]bool{}
	for _, c := range creds {
		if sc := c.Injection.GetSidecar(); sc != nil {
			// Injected by the service's own egress proxy, from its
			// secrets: no Secret of the namespace is named.
			if b.cfg.EgressHost == "" {
				return fmt.Errorf("credential %q: a sidecar credential for %s needs the service's egress proxy reachable from invocation pods, and this kubernetes backend has no egress host (--kube-egress-host, the pod IP); inject it as env_var or file instead: %w",
					c.Name, sc.GetHost(), errs.FailedPrecondition)
			}
			continue
		}
		secret, key := b.secretRef(c.Name)
		if msgs := validation.IsDNS1123Subdomain(secret); len(msgs) > 0 {
			return fmt.Errorf("credential %q: the kubernetes backend reads credentials from Secrets in namespace %s, named \"secret\" or \"secret/key\", and %q is not a Secret name (%s): %w",
				c.Name, b.cfg.Namespace, secret, strings.Join(msgs, "; "), errs.FailedPrecondition)
		}
		if msgs := validation.IsConfigMapKey(key); len(msgs) > 0 {
			return fmt.Errorf("credential %q: %q is not a Secret key (%s): %w", c.Name, key, strings.Join(msgs, "; "), errs.FailedPrecondition)
		}
		if strings.HasPrefix(secret, ObjectPrefix) {
			return fmt.Errorf("credential %q: Secrets named %s... hold invocations' inputs, not credentials: %w", c.Name, ObjectPrefix, errs.FailedPrecondition)
		}
		if len(b.cfg.CredentialSecrets) > 0 && !slices.Contains(b.cfg.CredentialSecrets, secret) {
			return fmt.Errorf("credential %q: Secret %s is not one this environment service hands to invocations (it hands %s): %w",
				c.Name, secret, strings.Join(b.cfg.CredentialSecrets, ", "), errs.NotFound)
		}
		switch m := c.Injection.GetMethod().(type) {
		case *environmentv1.CredentialInjection_EnvVar:
			v := m.EnvVar.GetVarName()
			if msgs := validation.IsEnvVarName(v); len(msgs) > 0 {
				return fmt.Errorf("credential %q: %q is not an environment variable name: %w", c.Name, v, errs.FailedPrecondition)
			}
			if why := environment.RefusedEnv(v); why != "" {
				return fmt.Errorf("credential %q: environment variable %q %s; the kubernetes backend does not set it from a credential, choose another name: %w", c.Name, v, why, errs.FailedPrecondition)
			}
			if vars[v] {
				return fmt.Errorf("credential %q: another credential already sets %s: %w", c.Name, v, errs.FailedPrecondition)
			}
			vars[v] = true
		case *environmentv1.CredentialInjection_File:
			p := m.File.GetPath()
			if err := b.checkFilePath(p); err != nil {
				return fmt.Errorf("credential %q: %v: %w", c.Name, err, errs.FailedPrecondition)
			}
			if paths[p] {
				return fmt.Errorf("credential %q: another credential is already mounted at %q: %w", c.Name, p, errs.FailedPrecondition)
			}
			paths[p] = true
		default:
			return fmt.Errorf("credential %q has no injection method: %w", c.Name, errs.InvalidArgument)
		}
	}
	return nil
}

// checkFilePath says why a file credential cannot be mounted at p: not
// an absolute clean path; the pod's own volumes or the operator binary;
// a system directory; under /proc, /sys or /dev; a file the kubelet
// manages; or a file that changes how the loader, user lookup or TLS
// trust behave.
func (b *Backend) checkFilePath(p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("file path %q must be an absolute file path", p)
	}
	if path.Clean(p) != p {
		return fmt.Errorf("file path %q is not clean (write it as %q)", p, path.Clean(p))
	}
	for _, reserved := range []string{inputDir, workspaceDir, tmpDir} {
		if p == reserved || (reserved == inputDir && strings.HasPrefix(p, inputDir+"/")) {
			return fmt.Errorf("file path %q collides with the pod's %s volume; choose another path", p, reserved)
		}
	}
	if p == b.cfg.OperatorPath {
		return fmt.Errorf("file path %q would cover the operator binary", p)
	}
	if environment.IsSystemDir(p) || strings.HasPrefix(b.cfg.OperatorPath, p+"/") {
		return fmt.Errorf("file path %q would cover a system directory of the container", p)
	}
	for _, dir := range environment.RuntimeDirs {
		if strings.HasPrefix(p, dir+"/") {
			return fmt.Errorf("file path %q is under %s, which the runtime owns", p, dir)
		}
	}
	if why := environment.RefusedFile(p); why != "" {
		return fmt.Errorf("file path %q %s", p, why)
	}
	return nil
}

// limits returns l with the backend's defaults in each zero (or, from an
// overflowing quantity, negative) CPU, memory, disk and output limit, and
// the output limit at most maxOutputBytes.
func (b *Backend) limits(l environment.Limits) environment.Limits {
	d := b.cfg.DefaultLimits
	if l.CPUMillis <= 0 {
		l.CPUMillis = d.CPUMillis
	}
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.DiskBytes <= 0 {
		l.DiskBytes = d.DiskBytes
	}
	if l.MaxOutputBytes == 0 {
		l.MaxOutputBytes = d.MaxOutputBytes
	}
	l.MaxOutputBytes = min(l.MaxOutputBytes, maxOutputBytes)
	return l
}

// Run runs inv as a Job and returns the operator's output; see the
// package documentation.
func (b *Backend) Run(ctx context.Context, inv *environment.Invocation) (*environment.Result, error) {
	log := inv.Log
	if log == nil {
		log = b.log
	}
	// The server has checked the spec; checking again costs nothing and
	// keeps Run from ever weakening it.
	if err := b.Check(inv.Spec); err != nil {
		return nil, err
	}
	withLimits := *inv
	withLimits.Limits = b.limits(inv.Limits)
	inv = &withLimits
	ep, stopEgress, err := b.startEgress(inv)
	if err != nil {
		return nil, err
	}
	defer stopEgress()
	objs, err := b.objects(inv, ep)
	if err != nil {
		return nil, err
	}
	if inv.Workspace != nil {
		// The claim outlives the run: it is not one of objs, and the
		// retention policy or DeleteWorkspace deletes it.
		if _, err := b.ensureClaim(ctx, inv.Workspace.Name, inv.Workspace.Cap()); err != nil {
			return nil, err
		}
	}
	defer b.cleanup(log, objs.name)

	if err := b.create(ctx, objs); err != nil {
		return nil, err
	}

	waitCtx, cancel := context.WithTimeout(ctx, inv.Timeout+b.grace)
	defer cancel()
	job, err := b.wait(waitCtx, objs.name, inv.ID)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			if errors.Is(ctxErr, context.DeadlineExceeded) {
				return nil, fmt.Errorf("job %s: the request's deadline passed: %w", objs.name, errs.DeadlineExceeded)
			}
			return nil, fmt.Errorf("job %s: %w", objs.name, errs.Canceled)
		}
		if waitCtx.Err() != nil {
			return nil, fmt.Errorf("the invocation's timeout of %v passed before job %s finished: %w", inv.Timeout, objs.name, errs.DeadlineExceeded)
		}
		return nil, err
	}
	return b.result(ctx, inv, job)
}

// create creates the NetworkPolicy, the input Secret and the Job, in that
// order so the pod never exists without its policy, and then makes the
// Job own the other two.
func (b *Backend) create(ctx context.Context, o *objects) error {
	ns := b.cfg.Namespace
	if err := b.cfg.Client.CreateNetworkPolicy(ctx, ns, o.policy); err != nil {
		return createErr("NetworkPolicy", o.name, err)
	}
	if err := b.cfg.Client.CreateSecret(ctx, ns, o.secret); err != nil {
		return createErr("Secret", o.name, err)
	}
	job, err := b.cfg.Client.CreateJob(ctx, ns, o.job)
	if err != nil {
		return createErr("Job", o.name, err)
	}
	b.adopt(ctx, job)
	return nil
}

// createErr classifies an error creating an object: a rejected object is
// a bug here (INTERNAL), anything else may pass (retryable).
func createErr(kind, name string, err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("create %s %s: %w", kind, name, errs.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("create %s %s: %w", kind, name, errs.DeadlineExceeded)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsAlreadyExists(err):
		return fmt.Errorf("create %s %s: %v: %w", kind, name, err, errs.Internal)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("the environment service may not create %s objects (%v); grant its service account the Role in deploy/k8s/base/environment/role.yaml in its namespace: %w", kind, err, errs.Internal)
	default:
		return fmt.Errorf("could not create %s %s (%v): %w", kind, name, err, errs.Retryable)
	}
}

// cleanup deletes the invocation's objects with a fresh bounded context;
// the Job's pods go with it (background propagation).
func (b *Backend) cleanup(log *slog.Logger, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cleanupTimeout)
	defer cancel()
	ns := b.cfg.Namespace
	background := metav1.DeletePropagationBackground
	del := []struct {
		kind string
		fn   func() error
	}{
		{"Job", func() error {
			return b.cfg.Client.DeleteJob(ctx, ns, name, metav1.DeleteOptions{PropagationPolicy: &background})
		}},
		{"Secret", func() error { return b.cfg.Client.DeleteSecret(ctx, ns, name) }},
		{"NetworkPolicy", func() error { return b.cfg.Client.DeleteNetworkPolicy(ctx, ns, name) }},
	}
	for _, d := range del {
		if err := d.fn(); err != nil && !apierrors.IsNotFound(err) {
			log.Error("delete invocation object", "kind", d.kind, "namespace", ns, "name", name, "error", err)
		}
	}
}
