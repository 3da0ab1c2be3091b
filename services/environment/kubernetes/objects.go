package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"path"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// objects are what the backend creates for one invocation; all three
// share one name.
type objects struct {
	name   string
	policy *networkingv1.NetworkPolicy
	secret *corev1.Secret
	job    *batchv1.Job
}

// managedBy labels every object the backend creates.
const managedBy = "neuron-environment"

// credentialItem is the item path of a file credential inside its Secret
// volume; the file is mounted at the requested path with subPath, so the
// item's name never shows.
const credentialItem = "credential"

// jobTTL is how long a finished Job stays if the backend could not delete
// it (ttlSecondsAfterFinished).
const jobTTL = 300

// podSelector selects the pod of invocation id.
func podSelector(id string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchLabels: map[string]string{InvocationLabel: id}}
}

// objects builds the NetworkPolicy, Secret and Job of inv. It refuses,
// with FAILED_PRECONDITION, what Check would refuse.
//
// ep, when not nil, is the invocation's egress proxy: the operator is
// pointed at it (--egress-proxy with its token, and the sidecar
// credentials' base URLs and placeholder keys), and the NetworkPolicy
// allows it.
func (b *Backend) objects(inv *environment.Invocation, ep *egressEndpoint) (*objects, error) {
	name := ObjectPrefix + inv.ID
	if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
		return nil, fmt.Errorf("invocation id %q does not make an object name: %s: %w", inv.ID, strings.Join(msgs, "; "), errs.Internal)
	}
	image, err := b.image(inv.Spec)
	if err != nil {
		return nil, err
	}
	rules, err := egressRules(inv.Network)
	if err != nil {
		return nil, err
	}
	if err := b.checkCredentials(inv.Credentials); err != nil {
		return nil, err
	}
	if hasSidecar(inv.Credentials) && ep == nil {
		return nil, fmt.Errorf("a sidecar credential without its egress proxy: %w", errs.Internal)
	}
	if ep != nil {
		rules = append(rules, egressRule{prefix: netip.PrefixFrom(ep.addr.Addr(), ep.addr.Addr().BitLen()), port: uint32(ep.addr.Port())})
	}
	var runtimeClass *string
	if slices.Contains(environment.Kinds(inv.Spec), environment.KindGvisor) {
		if b.cfg.RuntimeClassGvisor == "" {
			return nil, environment.Unsupported(b.Name(), inv.Spec, environment.KindContainer, environment.KindNetworkPolicy)
		}
		runtimeClass = ptr.To(b.cfg.RuntimeClassGvisor)
	}

	labels := map[string]string{InvocationLabel: inv.ID, "app.kubernetes.io/managed-by": managedBy}
	meta := func() metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: b.cfg.Namespace, Labels: maps.Clone(labels)}
	}

	o := &objects{name: name}
	o.policy = &networkingv1.NetworkPolicy{ObjectMeta: meta(), Spec: networkPolicySpec(inv.ID, rules)}
	o.secret = &corev1.Secret{
		ObjectMeta: meta(),
		Type:       corev1.SecretTypeOpaque,
		Immutable:  ptr.To(true),
		Data:       map[string][]byte{inputFile: inv.InputJSON},
	}

	command := []string{b.cfg.OperatorPath}
	command = append(command, b.cfg.OperatorArgs...)
	if ep != nil {
		command = append(command, "--egress-proxy", ep.proxyURL())
	}
	command = append(command, "--workspace", workspaceDir)
	command = append(command, environment.OneShotArgs()...)
	command = append(command, "--one-shot-input", path.Join(inputDir, inputFile))

	resources := resourceList(inv.Limits)
	workspace := &corev1.EmptyDirVolumeSource{}
	if inv.Limits.DiskBytes > 0 {
		workspace.SizeLimit = resource.NewQuantity(inv.Limits.DiskBytes, resource.BinarySI)
	}
	workspaceSource := corev1.VolumeSource{EmptyDir: workspace}
	if inv.Workspace != nil {
		// A workspace that lasts: its claim, of the workspace's cap
		// (ensureClaim), writable by the pod's fsGroup.
		workspaceSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ClaimName(inv.Workspace.Name)}}
	}
	volumes := []corev1.Volume{
		{Name: "input", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name, DefaultMode: ptr.To[int32](0o400)}}},
		{Name: "workspace", VolumeSource: workspaceSource},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	mounts := []corev1.VolumeMount{
		{Name: "input", MountPath: inputDir, ReadOnly: true},
		{Name: "workspace", MountPath: workspaceDir},
		{Name: "tmp", MountPath: tmpDir},
	}
	env := []corev1.EnvVar{{Name: "HOME", Value: tmpDir}, {Name: "TMPDIR", Value: tmpDir}}
	// A sidecar credential's provider gets its base URL through the
	// proxy and a placeholder key; the value stays in the proxy.
	for _, kv := range environment.SidecarEnv(inv.Credentials) {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	for i, c := range inv.Credentials {
		secret, key := b.secretRef(c.Name)
		switch m := c.Injection.GetMethod().(type) {
		case *environmentv1.CredentialInjection_EnvVar:
			env = append(env, corev1.EnvVar{Name: m.EnvVar.GetVarName(), ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key},
			}})
		case *environmentv1.CredentialInjection_File:
			vol := fmt.Sprintf("credential-%d", i)
			volumes = append(volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName:  secret,
				Items:       []corev1.KeyToPath{{Key: key, Path: credentialItem}},
				DefaultMode: ptr.To[int32](0o400),
			}}})
			mounts = append(mounts, corev1.VolumeMount{Name: vol, MountPath: path.Clean(m.File.GetPath()), SubPath: credentialItem, ReadOnly: true})
		}
	}

	o.job = &batchv1.Job{
		ObjectMeta: meta(),
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptr.To[int32](0),
			ActiveDeadlineSeconds:   ptr.To(max(1, int64(math.Ceil(inv.Timeout.Seconds())))),
			TTLSecondsAfterFinished: ptr.To[int32](jobTTL),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: maps.Clone(labels)},
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					EnableServiceLinks:           ptr.To(false),
					RuntimeClassName:             runtimeClass,
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To[int64](runAsID),
						RunAsGroup:     ptr.To[int64](runAsID),
						FSGroup:        ptr.To[int64](runAsID),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:                     containerName,
						Image:                    image,
						Command:                  command,
						WorkingDir:               workspaceDir,
						Env:                      env,
						Resources:                corev1.ResourceRequirements{Requests: resources, Limits: resources.DeepCopy()},
						VolumeMounts:             mounts,
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
						SecurityContext: &corev1.SecurityContext{
							RunAsNonRoot:             ptr.To(true),
							ReadOnlyRootFilesystem:   ptr.To(true),
							AllowPrivilegeEscalation: ptr.To(false),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
					Volumes: volumes,
				},
			},
		},
	}
	return o, nil
}

// resourceList is limits as a container's requests (and limits); nil when
// there are none.
func resourceList(l environment.Limits) corev1.ResourceList {
	r := corev1.ResourceList{}
	if l.CPUMillis > 0 {
		r[corev1.ResourceCPU] = *resource.NewMilliQuantity(l.CPUMillis, resource.DecimalSI)
	}
	if l.MemoryBytes > 0 {
		r[corev1.ResourceMemory] = *resource.NewQuantity(l.MemoryBytes, resource.BinarySI)
	}
	if l.DiskBytes > 0 {
		r[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(l.DiskBytes, resource.BinarySI)
	}
	if l.GPUs > 0 {
		r[gpuResource] = *resource.NewQuantity(l.GPUs, resource.DecimalSI)
	}
	if len(r) == 0 {
		return nil
	}
	return r
}

// adopt makes job the owner of the invocation's Secret and NetworkPolicy,
// so the garbage collector removes them with it should the backend never
// delete them. A failure is only logged: Run deletes them anyway.
func (b *Backend) adopt(ctx context.Context, job *batchv1.Job) {
	if job.UID == "" {
		return
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{{
		APIVersion: batchv1.SchemeGroupVersion.String(),
		Kind:       "Job",
		Name:       job.Name,
		UID:        job.UID,
	}}}})
	if err != nil {
		b.log.Warn("owner reference patch", "error", err)
		return
	}
	ns := b.cfg.Namespace
	if err := b.cfg.Client.PatchSecret(ctx, ns, job.Name, patch); err != nil {
		b.log.Warn("set the Secret's owner", "name", job.Name, "error", err)
	}
	if err := b.cfg.Client.PatchNetworkPolicy(ctx, ns, job.Name, patch); err != nil {
		b.log.Warn("set the NetworkPolicy's owner", "name", job.Name, "error", err)
	}
}
