package kubernetes

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/secbear/neuron/services/environment"
)

// The environment service's Run builds this backend for "kubernetes"
// (--container-backend kubernetes, or --backend kubernetes).
func init() { environment.RegisterBackend("kubernetes", fromConfig) }

// fromConfig connects to the API server of cfg.Kubeconfig (else the
// in-cluster service account), with DefaultDiskBytes as the ephemeral
// storage of pods whose spec sets no disk.
func fromConfig(cfg environment.Config) (environment.Backend, func(), error) {
	client, ns, err := kubeClient(cfg.Kubeconfig, cfg.KubeNamespace)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes backend: %w", err)
	}
	var lo, hi int
	if cfg.KubeEgressPorts != "" {
		a, z, ok := strings.Cut(cfg.KubeEgressPorts, "-")
		var err1, err2 error
		lo, err1 = strconv.Atoi(a)
		hi, err2 = strconv.Atoi(z)
		if !ok || err1 != nil || err2 != nil {
			return nil, nil, fmt.Errorf("--kube-egress-ports %q: want MIN-MAX, such as 20000-20999", cfg.KubeEgressPorts)
		}
	}
	b, err := New(Config{
		EgressHost:            cfg.KubeEgressHost,
		EgressPortMin:         lo,
		EgressPortMax:         hi,
		WorkspaceStorageClass: cfg.KubeStorageClass,
		Client:                client,
		Namespace:             ns,
		DefaultImage:          cfg.DefaultImage,
		OperatorArgs:          cfg.OperatorArgs,
		RuntimeClassGvisor:    cfg.GvisorRuntime,
		DefaultLimits:         environment.Limits{DiskBytes: cfg.DefaultDiskBytes},
		CredentialSecrets:     cfg.KubeCredentialSecrets,
		Log:                   cfg.Log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes backend: %w", err)
	}
	// Workspace claims nobody used for the retention period go, like
	// the process backend's workspaces.
	ctx, stop := context.WithCancel(context.Background())
	go b.RunRetention(ctx, cfg.WorkspaceRetention, min(max(cfg.WorkspaceRetention/10, time.Second), time.Hour))
	return b, stop, nil
}

// kubeClient connects to the API server: a kubeconfig file, else the
// in-cluster service account.
func kubeClient(kubeconfig, namespace string) (Client, string, error) {
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
	client, err := NewClient(cfg)
	if err != nil {
		return nil, "", err
	}
	return client, namespace, nil
}
