package kubernetes

import (
	"context"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/testenv"
)

// TestRealAPIServer runs invocations against a real kube-apiserver: the
// backend's objects must pass the API's validation (which the fake
// clientset skips), and the test plays the Job controller and kubelet,
// which do not exist there.
func TestRealAPIServer(t *testing.T) {
	kube := testenv.KubeAPIServer(t)
	client, err := kubernetes.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	// Pods naming a RuntimeClass are admitted only when it exists.
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}
	if _, err := client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create runtime class: %v", err)
	}
	api, err := NewClient(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testLogs{}
	b, err := New(Config{
		Client:             api,
		Namespace:          testNamespace,
		DefaultImage:       "registry.example/operator:default",
		RuntimeClassGvisor: "gvisor",
		// Never poll after the first read: only the watch can report
		// that the Job finished (the fake tests cover polling).
		PollInterval: time.Hour,
		Logs:         logs.open,
	})
	if err != nil {
		t.Fatal(err)
	}
	b.grace = 0
	spec := representativeSpec()
	spec.Isolation = append(spec.Isolation, &environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Gvisor{Gvisor: &environmentv1.GvisorIsolation{}}})
	if err := b.Check(spec); err != nil {
		t.Fatalf("Check: %v", err)
	}

	t.Run("complete", func(t *testing.T) {
		inv := invocation(t, "real-1", spec)
		r := start(ctx, b, inv)
		job := waitJob(t, client, r, "neuron-inv-real-1")
		if job.UID == "" || job.Spec.Selector == nil {
			t.Errorf("the API server did not default the Job: uid %q selector %v", job.UID, job.Spec.Selector)
		}
		if got := ptr.Deref(job.Spec.Template.Spec.RuntimeClassName, ""); got != "gvisor" {
			t.Errorf("runtimeClassName = %q, want gvisor", got)
		}
		secret, policy := waitOwned(t, client, r, job.Name)
		want := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID}}
		if !reflect.DeepEqual(secret.OwnerReferences, want) || !reflect.DeepEqual(policy.OwnerReferences, want) {
			t.Errorf("owner references: secret %+v, policy %+v; want %+v", secret.OwnerReferences, policy.OwnerReferences, want)
		}
		if len(policy.Spec.Egress) != 3 || len(policy.Spec.Egress[1].To[0].IPBlock.Except) != 1 {
			t.Errorf("stored egress = %+v", policy.Spec.Egress)
		}

		pod := realPod(t, client, job, terminated(0, "Completed"))
		out := &operatorv1.OperatorOutput{Message: text("from a real API")}
		logs.set(pod.Name, logLine+"\n"+outputJSON(t, out)+"\n")
		finishJob(t, client, job, batchv1.JobComplete, "CompletionsReached")

		res, err := r.wait(t)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if !proto.Equal(res.Output, out) {
			t.Errorf("output = %v, want %v", res.Output, out)
		}
		assertGone(t, client, job.Name)
	})

	t.Run("attack", func(t *testing.T) { attackRealAPIServer(t, kube.Config) })

	t.Run("deadline", func(t *testing.T) {
		inv := invocation(t, "real-2", spec)
		r := start(ctx, b, inv)
		job := waitJob(t, client, r, "neuron-inv-real-2")
		finishJob(t, client, job, batchv1.JobFailed, batchv1.JobReasonDeadlineExceeded)
		_, err := r.wait(t)
		assertCode(t, err, codes.DeadlineExceeded, "timeout")
		assertGone(t, client, job.Name)
	})
}

// realPod creates the Job's pod from its template, as the Job controller
// would, and then sets its status through the status subresource, as the
// kubelet would.
func realPod(t *testing.T, client kubernetes.Interface, job *batchv1.Job, state corev1.ContainerState) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{}
	for k, v := range job.Spec.Template.Labels {
		labels[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      job.Name + "-x7k2p",
			Namespace: job.Namespace,
			Labels:    labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: *job.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = "node-1"
	pod, err := client.CoreV1().Pods(job.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the job's pod: %v", err)
	}
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodSucceeded,
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: containerName, Image: pod.Spec.Containers[0].Image, ImageID: "sha256:0123", State: state,
		}},
	}
	if state.Terminated != nil && state.Terminated.ExitCode != 0 {
		pod.Status.Phase = corev1.PodFailed
	}
	pod, err = client.CoreV1().Pods(job.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update the pod's status: %v", err)
	}
	return pod
}

// assertGone fails unless the invocation's Job, Secret and NetworkPolicy
// are deleted.
func assertGone(t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	check := func(kind string, err error) {
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s %s still there after Run (err %v)", kind, name, err)
		}
	}
	_, err := client.BatchV1().Jobs(testNamespace).Get(ctx, name, metav1.GetOptions{})
	check("Job", err)
	_, err = client.CoreV1().Secrets(testNamespace).Get(ctx, name, metav1.GetOptions{})
	check("Secret", err)
	_, err = client.NetworkingV1().NetworkPolicies(testNamespace).Get(ctx, name, metav1.GetOptions{})
	check("NetworkPolicy", err)
}
