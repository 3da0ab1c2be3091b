package kubernetes

import (
	"context"
	"io"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// clientset is a Client over a client-go clientset: the fake one of the
// tests, which records and answers what the backend asks. The binary
// uses NewClient, which TestRealAPIServer and TestAttackRealAPIServer run
// against a real API server.
type clientset struct{ c kubernetes.Interface }

var _ Client = clientset{}

func (s clientset) CreateJob(ctx context.Context, ns string, job *batchv1.Job) (*batchv1.Job, error) {
	return s.c.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
}

func (s clientset) GetJob(ctx context.Context, ns, name string) (*batchv1.Job, error) {
	return s.c.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
}

func (s clientset) WatchJobs(ctx context.Context, ns string, opts metav1.ListOptions) (watch.Interface, error) {
	return s.c.BatchV1().Jobs(ns).Watch(ctx, opts)
}

func (s clientset) DeleteJob(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error {
	return s.c.BatchV1().Jobs(ns).Delete(ctx, name, opts)
}

func (s clientset) ListPods(ctx context.Context, ns string, opts metav1.ListOptions) (*corev1.PodList, error) {
	return s.c.CoreV1().Pods(ns).List(ctx, opts)
}

func (s clientset) PodLogs(ctx context.Context, ns, pod, container string) (io.ReadCloser, error) {
	return s.c.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).Stream(ctx)
}

func (s clientset) CreateSecret(ctx context.Context, ns string, secret *corev1.Secret) error {
	_, err := s.c.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{})
	return err
}

func (s clientset) PatchSecret(ctx context.Context, ns, name string, patch []byte) error {
	_, err := s.c.CoreV1().Secrets(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func (s clientset) DeleteSecret(ctx context.Context, ns, name string) error {
	return s.c.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{})
}

func (s clientset) CreateNetworkPolicy(ctx context.Context, ns string, policy *networkingv1.NetworkPolicy) error {
	_, err := s.c.NetworkingV1().NetworkPolicies(ns).Create(ctx, policy, metav1.CreateOptions{})
	return err
}

func (s clientset) PatchNetworkPolicy(ctx context.Context, ns, name string, patch []byte) error {
	_, err := s.c.NetworkingV1().NetworkPolicies(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func (s clientset) DeleteNetworkPolicy(ctx context.Context, ns, name string) error {
	return s.c.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{})
}

func (s clientset) CreatePVC(ctx context.Context, ns string, pvc *corev1.PersistentVolumeClaim) error {
	_, err := s.c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	return err
}

func (s clientset) GetPVC(ctx context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
	return s.c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
}

func (s clientset) ListPVCs(ctx context.Context, ns string, opts metav1.ListOptions) (*corev1.PersistentVolumeClaimList, error) {
	return s.c.CoreV1().PersistentVolumeClaims(ns).List(ctx, opts)
}

func (s clientset) PatchPVC(ctx context.Context, ns, name string, patch []byte) error {
	_, err := s.c.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func (s clientset) DeletePVC(ctx context.Context, ns, name string) error {
	return s.c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{})
}
