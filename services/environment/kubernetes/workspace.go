package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/workspace"
)

// Labels and annotations of a workspace's PersistentVolumeClaim.
const (
	// WorkspaceOwnerLabel is what owns the workspace: "session",
	// "workflow" or "sandbox". Every workspace claim carries it.
	WorkspaceOwnerLabel = "neuron.dev/workspace-owner"
	// WorkspaceAnnotation is the workspace's name (workspace.Name), e.g.
	// "workflow-demo-1" (too free for a label value).
	WorkspaceAnnotation = "neuron.dev/workspace"
	// CreatedAnnotation and LastUsedAnnotation are when the backend
	// created the claim and when a run last mounted it (RFC 3339, UTC);
	// the retention policy goes by the last.
	CreatedAnnotation  = "neuron.dev/created"
	LastUsedAnnotation = "neuron.dev/last-used"
	// WorkspacePrefix starts the name of every workspace claim.
	WorkspacePrefix = "neuron-ws-"
)

// ClaimName is the PersistentVolumeClaim of workspace n: WorkspacePrefix
// and n when that is a valid object name; for a hashed name ("kind~hex")
// or one that is not (upper case, "_"), WorkspacePrefix, the owner kind,
// "." and a hash. A plain name has "-" after its kind and a hashed one
// ".", so the two never meet.
func ClaimName(n string) string {
	kind, hash, hashed := strings.Cut(n, "~")
	if hashed {
		return WorkspacePrefix + kind + "." + hash
	}
	if c := WorkspacePrefix + n; len(validation.IsDNS1123Subdomain(c)) == 0 {
		return c
	}
	sum := sha256.Sum256([]byte(n))
	return WorkspacePrefix + owner(n) + "." + hex.EncodeToString(sum[:16])
}

// owner is the kind of owner in workspace name n ("session", ...).
func owner(n string) string {
	if i := strings.IndexAny(n, "-~"); i > 0 {
		return n[:i]
	}
	return n
}

var (
	_ environment.Persistent    = (*Backend)(nil)
	_ environment.WorkspaceHost = (*Backend)(nil)
)

// PersistentWorkspaces reports true: a workspace that lasts is a
// PersistentVolumeClaim mounted at the workspace of each run's pod.
func (b *Backend) PersistentWorkspaces() bool { return true }

// claim is the PersistentVolumeClaim of workspace n, of capBytes.
func (b *Backend) claim(n string, capBytes int64, now time.Time) *corev1.PersistentVolumeClaim {
	stamp := now.UTC().Format(time.RFC3339)
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:        ClaimName(n),
			Namespace:   b.cfg.Namespace,
			Labels:      map[string]string{WorkspaceOwnerLabel: owner(n), "app.kubernetes.io/managed-by": managedBy},
			Annotations: map[string]string{WorkspaceAnnotation: n, CreatedAnnotation: stamp, LastUsedAnnotation: stamp},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(capBytes, resource.BinarySI),
			}},
		},
	}
	if b.cfg.WorkspaceStorageClass != "" {
		pvc.Spec.StorageClassName = &b.cfg.WorkspaceStorageClass
	}
	return pvc
}

// ensureClaim creates workspace n's claim when it is missing, else marks
// it used now, and returns its name.
func (b *Backend) ensureClaim(ctx context.Context, n string, capBytes int64) (string, error) {
	pvc := b.claim(n, capBytes, time.Now())
	err := b.cfg.Client.CreatePVC(ctx, b.cfg.Namespace, pvc)
	if apierrors.IsAlreadyExists(err) {
		old, gerr := b.cfg.Client.GetPVC(ctx, b.cfg.Namespace, pvc.Name)
		if gerr == nil && old.DeletionTimestamp != nil {
			// Deleted (retention, DeleteWorkspace) but still mounted by
			// a pod: a new pod would wait for it for ever.
			return "", fmt.Errorf("workspace %s's PersistentVolumeClaim %s is being deleted; retry once it is gone: %w", n, pvc.Name, errs.Unavailable)
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{LastUsedAnnotation: pvc.Annotations[LastUsedAnnotation]}}})
		err = b.cfg.Client.PatchPVC(ctx, b.cfg.Namespace, pvc.Name, patch)
	}
	if err != nil {
		return "", createErr("PersistentVolumeClaim", pvc.Name, err)
	}
	return pvc.Name, nil
}

// HasWorkspace reports whether workspace n's claim exists.
func (b *Backend) HasWorkspace(ctx context.Context, n string) (bool, error) {
	pvc, err := b.cfg.Client.GetPVC(ctx, b.cfg.Namespace, ClaimName(n))
	if apierrors.IsNotFound(err) || err == nil && pvc.DeletionTimestamp != nil {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading PersistentVolumeClaim %s: %v: %w", ClaimName(n), err, errs.Retryable)
	}
	return true, nil
}

// noFiles is the error of the file RPCs on a workspace claim.
func (b *Backend) noFiles(n string) error {
	return fmt.Errorf("workspace %s is PersistentVolumeClaim %s of namespace %s; the kubernetes backend cannot reach its files through this API yet (only a pod mounting the claim can): mount it in a pod of yours, or use the process or docker backend: %w", n, ClaimName(n), b.cfg.Namespace, errs.FailedPrecondition)
}

// ListWorkspace is FAILED_PRECONDITION: no pod of the service mounts the
// claim.
func (b *Backend) ListWorkspace(_ context.Context, n, _ string) ([]*environmentv1.WorkspaceFile, bool, uint64, error) {
	return nil, false, 0, b.noFiles(n)
}

// ReadWorkspace is FAILED_PRECONDITION (see ListWorkspace).
func (b *Backend) ReadWorkspace(_ context.Context, n, _ string, _ io.Writer) error {
	return b.noFiles(n)
}

// WriteWorkspace is FAILED_PRECONDITION (see ListWorkspace).
func (b *Backend) WriteWorkspace(_ context.Context, n, _ string, _ os.FileMode, _ io.Reader, _ int64) (int64, error) {
	return 0, b.noFiles(n)
}

// DeleteWorkspace deletes workspace n's claim (Kubernetes defers it
// while a pod still mounts it).
func (b *Backend) DeleteWorkspace(ctx context.Context, n string) (bool, error) {
	err := b.cfg.Client.DeletePVC(ctx, b.cfg.Namespace, ClaimName(n))
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("deleting PersistentVolumeClaim %s: %v: %w", ClaimName(n), err, errs.Retryable)
	}
	return true, nil
}

// SweepWorkspaces deletes the workspace claims whose last use is older
// than retention (none when it is zero) and says how many.
func (b *Backend) SweepWorkspaces(ctx context.Context, now time.Time, retention time.Duration) int {
	if retention <= 0 {
		return 0
	}
	list, err := b.cfg.Client.ListPVCs(ctx, b.cfg.Namespace, metav1.ListOptions{LabelSelector: WorkspaceOwnerLabel + ",app.kubernetes.io/managed-by=" + managedBy})
	if err != nil {
		b.log.Warn("listing workspace claims for the retention policy", "error", err)
		return 0
	}
	removed := 0
	for _, pvc := range list.Items {
		if !strings.HasPrefix(pvc.Name, WorkspacePrefix) || pvc.DeletionTimestamp != nil {
			continue
		}
		last := pvc.CreationTimestamp.Time
		if t, err := time.Parse(time.RFC3339, pvc.Annotations[LastUsedAnnotation]); err == nil && t.After(last) {
			last = t
		}
		if now.Sub(last) < retention {
			continue
		}
		if err := b.cfg.Client.DeletePVC(ctx, b.cfg.Namespace, pvc.Name); err != nil {
			if !apierrors.IsNotFound(err) {
				b.log.Warn("deleting a workspace claim for the retention policy", "claim", pvc.Name, "error", err)
			}
			continue
		}
		removed++
		b.log.Info("workspace claim deleted by the retention policy", "claim", pvc.Name, "workspace", pvc.Annotations[WorkspaceAnnotation], "unused_since", last.UTC().Format(time.RFC3339), "retention", retention.String())
	}
	return removed
}

// RunRetention sweeps every interval until ctx ends.
func (b *Backend) RunRetention(ctx context.Context, retention, interval time.Duration) {
	workspace.RunRetention(ctx, retention, interval, func(now time.Time) { b.SweepWorkspaces(ctx, now, retention) })
}
