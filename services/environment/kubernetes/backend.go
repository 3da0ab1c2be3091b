package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// Config configures a Backend.
type Config struct {
	// Client talks to the cluster.
	Client kubernetes.Interface
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
	if cfg.Logs == nil {
		client := cfg.Client
		cfg.Logs = func(ctx context.Context, namespace, pod string) (io.ReadCloser, error) {
			return client.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: containerName}).Stream(ctx)
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

// checkCredentials refuses credentials a pod cannot receive by reference.
func (b *Backend) checkCredentials(creds []environment.Credential) error {
	paths := map[string]bool{}
	for _, c := range creds {
		secret, key := b.secretRef(c.Name)
		if msgs := validation.IsDNS1123Subdomain(secret); len(msgs) > 0 {
			return fmt.Errorf("credential %q: the kubernetes backend reads credentials from Secrets in namespace %s, named \"secret\" or \"secret/key\", and %q is not a Secret name (%s): %w",
				c.Name, b.cfg.Namespace, secret, strings.Join(msgs, "; "), errs.FailedPrecondition)
		}
		if msgs := validation.IsConfigMapKey(key); len(msgs) > 0 {
			return fmt.Errorf("credential %q: %q is not a Secret key (%s): %w", c.Name, key, strings.Join(msgs, "; "), errs.FailedPrecondition)
		}
		switch m := c.Injection.GetMethod().(type) {
		case *environmentv1.CredentialInjection_Sidecar:
			return fmt.Errorf("credential %q: the kubernetes backend has no in-cluster egress proxy to inject it for %s yet; inject it as env_var or file instead: %w",
				c.Name, m.Sidecar.GetHost(), errs.FailedPrecondition)
		case *environmentv1.CredentialInjection_EnvVar:
			if msgs := validation.IsEnvVarName(m.EnvVar.GetVarName()); len(msgs) > 0 {
				return fmt.Errorf("credential %q: %q is not an environment variable name: %w", c.Name, m.EnvVar.GetVarName(), errs.FailedPrecondition)
			}
		case *environmentv1.CredentialInjection_File:
			p := path.Clean(m.File.GetPath())
			if !path.IsAbs(p) || p == "/" {
				return fmt.Errorf("credential %q: file path %q must be an absolute file path: %w", c.Name, m.File.GetPath(), errs.FailedPrecondition)
			}
			for _, reserved := range []string{inputDir, workspaceDir, tmpDir} {
				if p == reserved || (reserved == inputDir && strings.HasPrefix(p, inputDir+"/")) {
					return fmt.Errorf("credential %q: file path %q collides with the pod's %s volume; choose another path: %w", c.Name, p, reserved, errs.FailedPrecondition)
				}
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
	objs, err := b.objects(inv)
	if err != nil {
		return nil, err
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
	if _, err := b.cfg.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, o.policy, metav1.CreateOptions{}); err != nil {
		return createErr("NetworkPolicy", o.name, err)
	}
	if _, err := b.cfg.Client.CoreV1().Secrets(ns).Create(ctx, o.secret, metav1.CreateOptions{}); err != nil {
		return createErr("Secret", o.name, err)
	}
	job, err := b.cfg.Client.BatchV1().Jobs(ns).Create(ctx, o.job, metav1.CreateOptions{})
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
			return b.cfg.Client.BatchV1().Jobs(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &background})
		}},
		{"Secret", func() error { return b.cfg.Client.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{}) }},
		{"NetworkPolicy", func() error {
			return b.cfg.Client.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{})
		}},
	}
	for _, d := range del {
		if err := d.fn(); err != nil && !apierrors.IsNotFound(err) {
			log.Error("delete invocation object", "kind", d.kind, "namespace", ns, "name", name, "error", err)
		}
	}
}
