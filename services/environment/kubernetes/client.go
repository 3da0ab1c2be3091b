package kubernetes

import (
	"context"
	"fmt"
	"io"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// Client is the part of the Kubernetes API the backend calls: Jobs, the
// pods they run and their logs, Secrets, NetworkPolicies and
// PersistentVolumeClaims, each in a namespace. NewClient implements it over REST; errors are client-go's
// (*errors.StatusError from the API server).
//
// It is not client-go's clientset (kubernetes.Interface) on purpose: a
// clientset, even one typed group of it, links in and registers at start
// every API group of Kubernetes, tens of megabytes of binary and memory
// for the three groups used here.
type Client interface {
	CreateJob(ctx context.Context, namespace string, job *batchv1.Job) (*batchv1.Job, error)
	GetJob(ctx context.Context, namespace, name string) (*batchv1.Job, error)
	// WatchJobs watches the Jobs opts selects.
	WatchJobs(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
	DeleteJob(ctx context.Context, namespace, name string, opts metav1.DeleteOptions) error
	ListPods(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.PodList, error)
	// PodLogs streams the log of one container of a pod.
	PodLogs(ctx context.Context, namespace, pod, container string) (io.ReadCloser, error)
	CreateSecret(ctx context.Context, namespace string, secret *corev1.Secret) error
	// PatchSecret applies a JSON merge patch.
	PatchSecret(ctx context.Context, namespace, name string, mergePatch []byte) error
	DeleteSecret(ctx context.Context, namespace, name string) error
	CreateNetworkPolicy(ctx context.Context, namespace string, policy *networkingv1.NetworkPolicy) error
	// PatchNetworkPolicy applies a JSON merge patch.
	PatchNetworkPolicy(ctx context.Context, namespace, name string, mergePatch []byte) error
	DeleteNetworkPolicy(ctx context.Context, namespace, name string) error
	// The PersistentVolumeClaims of the workspaces that last.
	CreatePVC(ctx context.Context, namespace string, pvc *corev1.PersistentVolumeClaim) error
	GetPVC(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error)
	ListPVCs(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.PersistentVolumeClaimList, error)
	// PatchPVC applies a JSON merge patch.
	PatchPVC(ctx context.Context, namespace, name string, mergePatch []byte) error
	DeletePVC(ctx context.Context, namespace, name string) error
}

// NewClient returns a Client for the API server cfg describes (a
// kubeconfig's or the in-cluster one), speaking JSON as client-go's
// typed clients do, with a scheme of only the core, batch and networking
// groups.
func NewClient(cfg *rest.Config) (Client, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, batchv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	codecs := serializer.NewCodecFactory(scheme)
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	group := func(gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion = &gv
		c.APIPath = apiPath
		c.NegotiatedSerializer = codecs.WithoutConversion()
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		rc, err := rest.RESTClientForConfigAndClient(c, httpClient)
		if err != nil {
			return nil, fmt.Errorf("%s client: %w", gv, err)
		}
		return rc, nil
	}
	c := &restClient{params: runtime.NewParameterCodec(scheme)}
	if c.core, err = group(corev1.SchemeGroupVersion, "/api"); err != nil {
		return nil, err
	}
	if c.batch, err = group(batchv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if c.networking, err = group(networkingv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	return c, nil
}

// restClient is a Client over one REST client per API group, making the
// requests client-go's typed clients make.
type restClient struct {
	core, batch, networking *rest.RESTClient
	params                  runtime.ParameterCodec
}

func (c *restClient) CreateJob(ctx context.Context, ns string, job *batchv1.Job) (*batchv1.Job, error) {
	out := &batchv1.Job{}
	err := c.batch.Post().Namespace(ns).Resource("jobs").VersionedParams(&metav1.CreateOptions{}, c.params).Body(job).Do(ctx).Into(out)
	return out, err
}

func (c *restClient) GetJob(ctx context.Context, ns, name string) (*batchv1.Job, error) {
	out := &batchv1.Job{}
	err := c.batch.Get().Namespace(ns).Resource("jobs").Name(name).VersionedParams(&metav1.GetOptions{}, c.params).Do(ctx).Into(out)
	return out, err
}

func (c *restClient) WatchJobs(ctx context.Context, ns string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.batch.Get().Namespace(ns).Resource("jobs").VersionedParams(&opts, c.params).Watch(ctx)
}

func (c *restClient) DeleteJob(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error {
	return c.batch.Delete().Namespace(ns).Resource("jobs").Name(name).Body(&opts).Do(ctx).Error()
}

func (c *restClient) ListPods(ctx context.Context, ns string, opts metav1.ListOptions) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	err := c.core.Get().Namespace(ns).Resource("pods").VersionedParams(&opts, c.params).Do(ctx).Into(out)
	return out, err
}

func (c *restClient) PodLogs(ctx context.Context, ns, pod, container string) (io.ReadCloser, error) {
	return c.core.Get().Namespace(ns).Resource("pods").Name(pod).SubResource("log").
		VersionedParams(&corev1.PodLogOptions{Container: container}, c.params).Stream(ctx)
}

func (c *restClient) CreateSecret(ctx context.Context, ns string, secret *corev1.Secret) error {
	return c.core.Post().Namespace(ns).Resource("secrets").VersionedParams(&metav1.CreateOptions{}, c.params).Body(secret).Do(ctx).Error()
}

func (c *restClient) PatchSecret(ctx context.Context, ns, name string, patch []byte) error {
	return c.core.Patch(types.MergePatchType).Namespace(ns).Resource("secrets").Name(name).
		VersionedParams(&metav1.PatchOptions{}, c.params).Body(patch).Do(ctx).Error()
}

func (c *restClient) DeleteSecret(ctx context.Context, ns, name string) error {
	return c.core.Delete().Namespace(ns).Resource("secrets").Name(name).Body(&metav1.DeleteOptions{}).Do(ctx).Error()
}

func (c *restClient) CreateNetworkPolicy(ctx context.Context, ns string, policy *networkingv1.NetworkPolicy) error {
	return c.networking.Post().Namespace(ns).Resource("networkpolicies").VersionedParams(&metav1.CreateOptions{}, c.params).Body(policy).Do(ctx).Error()
}

func (c *restClient) PatchNetworkPolicy(ctx context.Context, ns, name string, patch []byte) error {
	return c.networking.Patch(types.MergePatchType).Namespace(ns).Resource("networkpolicies").Name(name).
		VersionedParams(&metav1.PatchOptions{}, c.params).Body(patch).Do(ctx).Error()
}

func (c *restClient) DeleteNetworkPolicy(ctx context.Context, ns, name string) error {
	return c.networking.Delete().Namespace(ns).Resource("networkpolicies").Name(name).Body(&metav1.DeleteOptions{}).Do(ctx).Error()
}

func (c *restClient) CreatePVC(ctx context.Context, ns string, pvc *corev1.PersistentVolumeClaim) error {
	return c.core.Post().Namespace(ns).Resource("persistentvolumeclaims").VersionedParams(&metav1.CreateOptions{}, c.params).Body(pvc).Do(ctx).Error()
}

func (c *restClient) GetPVC(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
	out := &corev1.PersistentVolumeClaim{}
	err := c.core.Get().Namespace(ns).Resource("persistentvolumeclaims").Name(name).VersionedParams(&metav1.GetOptions{}, c.params).Do(ctx).Into(out)
	return out, err
}

func (c *restClient) ListPVCs(ctx context.Context, ns string, opts metav1.ListOptions) (*corev1.PersistentVolumeClaimList, error) {
	out := &corev1.PersistentVolumeClaimList{}
	err := c.core.Get().Namespace(ns).Resource("persistentvolumeclaims").VersionedParams(&opts, c.params).Do(ctx).Into(out)
	return out, err
}

func (c *restClient) PatchPVC(ctx context.Context, ns, name string, patch []byte) error {
	return c.core.Patch(types.MergePatchType).Namespace(ns).Resource("persistentvolumeclaims").Name(name).
		VersionedParams(&metav1.PatchOptions{}, c.params).Body(patch).Do(ctx).Error()
}

func (c *restClient) DeletePVC(ctx context.Context, ns, name string) error {
	return c.core.Delete().Namespace(ns).Resource("persistentvolumeclaims").Name(name).Body(&metav1.DeleteOptions{}).Do(ctx).Error()
}
