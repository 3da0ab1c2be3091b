package kubernetes

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/workspace"
)

func TestClaimName(t *testing.T) {
	for _, tc := range []struct{ n, want string }{
		{workspace.SessionName("s1"), "neuron-ws-session-s1"},
		{workspace.WorkflowName("wf.2"), "neuron-ws-workflow-wf.2"},
	} {
		if got := ClaimName(tc.n); got != tc.want {
			t.Errorf("ClaimName(%q) = %q, want %q", tc.n, got, tc.want)
		}
	}
	// Ids an object name cannot hold are hashed, each to its own name.
	seen := map[string]string{}
	for _, id := range []string{"Upper", "under_score", "a/b", strings.Repeat("x", 300), "upper"} {
		for _, n := range []string{workspace.SessionName(id), workspace.WorkflowName(id)} {
			c := ClaimName(n)
			if msgs := validation.IsDNS1123Subdomain(c); len(msgs) > 0 {
				t.Errorf("ClaimName(%q) = %q: %v", n, c, msgs)
			}
			if other, dup := seen[c]; dup {
				t.Errorf("ClaimName(%q) = ClaimName(%q) = %q", n, other, c)
			}
			seen[c] = n
		}
	}
}

// TestWorkspaceClaims runs invocations with workspaces that last against
// a real kube-apiserver (the test plays the Job controller and kubelet):
// each session's runs mount one PersistentVolumeClaim of the configured
// class and the workspace's cap, which outlives the run; another session
// gets another; the retention sweep deletes claims nobody used; the
// file RPCs answer FAILED_PRECONDITION.
func TestWorkspaceClaims(t *testing.T) {
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
	api, err := NewClient(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testLogs{}
	b, err := New(Config{
		Client: api, Namespace: testNamespace, DefaultImage: "registry.example/operator:default",
		WorkspaceStorageClass: "fast-ssd", PollInterval: time.Hour, Logs: logs.open,
	})
	if err != nil {
		t.Fatal(err)
	}
	b.grace = 0
	store, err := workspace.Open(t.TempDir(), 3<<30, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}

	// runIn runs invocation id in workspace n to completion and returns
	// its Job as the API server stored it.
	runIn := func(t *testing.T, id, n string) *batchv1.Job {
		t.Helper()
		inv := invocation(t, id, &environmentv1.EnvironmentSpec{})
		inv.Workspace = environment.NewWorkspace(n, store)
		r := start(ctx, b, inv)
		job := waitJob(t, client, r, ObjectPrefix+id)
		pod := realPod(t, client, job, terminated(0, "Completed"))
		logs.set(pod.Name, outputJSON(t, &operatorv1.OperatorOutput{Message: text("ok")})+"\n")
		finishJob(t, client, job, batchv1.JobComplete, "CompletionsReached")
		if _, err := r.wait(t); err != nil {
			t.Fatalf("Run: %v", err)
		}
		assertGone(t, client, job.Name)
		return job
	}
	claimOf := func(t *testing.T, job *batchv1.Job) string {
		t.Helper()
		for _, v := range job.Spec.Template.Spec.Volumes {
			if v.Name == "workspace" {
				if v.PersistentVolumeClaim == nil {
					t.Fatalf("the workspace volume is %+v, not a claim", v.VolumeSource)
				}
				return v.PersistentVolumeClaim.ClaimName
			}
		}
		t.Fatal("the Job has no workspace volume")
		return ""
	}
	s1, s2 := workspace.SessionName("s1"), workspace.SessionName("s2")

	job := runIn(t, "ws-1", s1)
	name := claimOf(t, job)
	if name != "neuron-ws-session-s1" {
		t.Fatalf("claim %q", name)
	}
	pvc, err := client.CoreV1().PersistentVolumeClaims(testNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the claim did not outlive the run: %v", err)
	}
	if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(*resource.NewQuantity(3<<30, resource.BinarySI)) != 0 {
		t.Errorf("storage request %v, want the workspace cap 3Gi", got.String())
	}
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != "fast-ssd" || len(pvc.Spec.AccessModes) != 1 || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce {
		t.Errorf("storage class %v, access modes %v", pvc.Spec.StorageClassName, pvc.Spec.AccessModes)
	}
	if pvc.Labels[WorkspaceOwnerLabel] != "session" || pvc.Labels["app.kubernetes.io/managed-by"] != managedBy ||
		pvc.Annotations[WorkspaceAnnotation] != s1 || pvc.Annotations[CreatedAnnotation] == "" || pvc.Annotations[LastUsedAnnotation] == "" {
		t.Errorf("labels %v, annotations %v", pvc.Labels, pvc.Annotations)
	}

	// The next run of the session mounts the same claim and marks it used.
	old := `{"metadata":{"annotations":{"` + LastUsedAnnotation + `":"2020-01-01T00:00:00Z"}}}`
	if _, err := client.CoreV1().PersistentVolumeClaims(testNamespace).Patch(ctx, name, types.MergePatchType, []byte(old), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := claimOf(t, runIn(t, "ws-2", s1)); got != name {
		t.Fatalf("the second run of the session mounts %q, want %q", got, name)
	}
	pvc, err = client.CoreV1().PersistentVolumeClaims(testNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil || pvc.Annotations[LastUsedAnnotation] == "2020-01-01T00:00:00Z" {
		t.Fatalf("the second run did not mark the claim used: %v, %v", pvc.Annotations, err)
	}
	if got := claimOf(t, runIn(t, "ws-3", s2)); got == name {
		t.Fatalf("another session mounts the same claim %q", got)
	}

	// The file RPCs cannot reach a claim's files.
	assertCode(t, b.ReadWorkspace(ctx, s1, "notes.md", &bytes.Buffer{}), codes.FailedPrecondition, name)
	if ok, err := b.HasWorkspace(ctx, s1); err != nil || !ok {
		t.Errorf("HasWorkspace: %v, %v", ok, err)
	}

	// Retention: nothing used within the hour goes; two hours on, both.
	if n := b.SweepWorkspaces(ctx, time.Now(), time.Hour); n != 0 {
		t.Fatalf("the sweep deleted %d claims used just now", n)
	}
	if n := b.SweepWorkspaces(ctx, time.Now().Add(2*time.Hour), time.Hour); n != 2 {
		t.Fatalf("the sweep two hours on deleted %d claims, want 2", n)
	}
	for _, c := range []string{name, ClaimName(s2)} {
		// No controller manager runs to drop the pvc-protection
		// finalizer: the claim is gone, or marked deleted.
		pvc, err := client.CoreV1().PersistentVolumeClaims(testNamespace).Get(ctx, c, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) && (err != nil || pvc.DeletionTimestamp == nil) {
			t.Errorf("claim %s after the sweep: %v, deletion %v", c, err, pvc.DeletionTimestamp)
		}
	}
	if ok, err := b.HasWorkspace(ctx, s1); err != nil || ok {
		t.Errorf("HasWorkspace after the sweep: %v, %v", ok, err)
	}
	if existed, err := b.DeleteWorkspace(ctx, workspace.SessionName("never")); err != nil || existed {
		t.Errorf("DeleteWorkspace of a workspace never used: %v, %v", existed, err)
	}
}
