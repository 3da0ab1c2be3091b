package kubernetes

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/services/environment"
)

// The attack tests: specs asking for more than the backend grants are
// refused before any object exists (TestAttackSpecsRefused), and what it
// does create, for the most hostile spec it accepts, is checked field by
// field (TestAttackJobHardened on the fake clientset, and
// attackRealAPIServer, a subtest of TestRealAPIServer, where the API
// server's validation and its restricted Pod Security admission judge
// the pod).

func fileInj(p string) *environmentv1.CredentialInjection {
	return &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_File{File: &environmentv1.FileInjection{Path: p}}}
}

func envInj(name string) *environmentv1.CredentialInjection {
	return &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: name}}}
}

// attackSpec is one hostile spec and the exact code and words of its
// refusal.
type attackSpec struct {
	name string
	spec *environmentv1.EnvironmentSpec
	code codes.Code
	says string
}

func hostileSpecs() []attackSpec {
	allow := environmentv1.NetworkAction_NETWORK_ACTION_ALLOW
	creds := func(name string, inj *environmentv1.CredentialInjection) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{Name: name, Injection: inj}}}
	}
	res := func(r *environmentv1.ResourceLimits) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Resources: r}
	}
	boundary := func(b *environmentv1.IsolationBoundary) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{b}}
	}
	image := func(img string) *environmentv1.EnvironmentSpec {
		return boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{Image: img}}})
	}
	rules := func(r ...*environmentv1.NetworkRule) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Network: &environmentv1.NetworkPolicy{Rules: r}}
	}
	fp := codes.FailedPrecondition
	out := []attackSpec{
		// Secrets that are not the spec's to name.
		{"another invocation's input", creds("neuron-inv-inv-0123456789abcdef/input.json", envInj("STOLEN")), fp, "hold invocations' inputs"},
		{"a secret name with a path", creds("../kube-system/token", envInj("STOLEN")), fp, "not a Secret name"},
		{"a key with a path", creds("keys/../../token", envInj("STOLEN")), fp, "not a Secret key"},
		// File credentials over the kubelet's and kernel's files, the
		// root, system directories, the pod's volumes, ".." segments.
		{"file over the root", creds("key", fileInj("/")), fp, "system directory"},
		{"file over /etc", creds("key", fileInj("/etc")), fp, "system directory"},
		{"file over /usr/local/bin", creds("key", fileInj("/usr/local/bin")), fp, "system directory"},
		{"file in /proc", creds("key", fileInj("/proc/self/attr/current")), fp, "/proc"},
		{"file in /sys", creds("key", fileInj("/sys/kernel/uevent_helper")), fp, "/sys"},
		{"file at the termination log", creds("key", fileInj("/dev/termination-log")), fp, "/dev"},
		{"file with .. segments", creds("key", fileInj("/etc/neuron/../../var/run/secrets/kubernetes.io/serviceaccount/token")), fp, "not clean"},
		{"relative file", creds("key", fileInj("etc/key")), fp, "absolute"},
		{"file at /etc/shadow", creds("key", fileInj("/etc/shadow")), fp, "users"},
		{"file at /etc/ld.so.preload", creds("key", fileInj("/etc/ld.so.preload")), fp, "dynamic loader"},
		{"file over the CA bundle", creds("key", fileInj("/etc/ssl/certs/ca-certificates.crt")), fp, "certificates"},
		{"file at /etc/resolv.conf", creds("key", fileInj("/etc/resolv.conf")), fp, "container runtime"},
		{"file over the input", creds("key", fileInj("/input/input.json")), fp, "/input"},
		{"file over the workspace", creds("key", fileInj("/workspace")), fp, "/workspace"},
		{"file over the operator", creds("key", fileInj("/operator")), fp, "operator binary"},
		// Isolation, network and resources the backend does not give.
		{"process boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}), fp, "process"},
		{"custom privileged boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Custom{Custom: &environmentv1.CustomIsolation{BoundaryType: "privileged"}}}), fp, "custom:privileged"},
		{"gvisor without a runtime class", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Gvisor{Gvisor: &environmentv1.GvisorIsolation{}}}), fp, "gvisor"},
		{"image with a space", image("registry.example/op:1 --privileged"), fp, "image reference"},
		{"image with a newline", image("registry.example/op:1\nhostNetwork: true"), fp, "image reference"},
		{"the metadata service", rules(&environmentv1.NetworkRule{Destination: "169.254.169.254", Port: ptr.To[uint32](80), Action: allow}), fp, "metadata"},
		{"a domain", rules(&environmentv1.NetworkRule{Destination: "metadata.google.internal", Action: allow}), fp, "metadata.google.internal"},
		{"sidecar credential", creds("key", &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_Sidecar{Sidecar: &environmentv1.SidecarInjection{Host: "api.anthropic.com"}}}), fp, "egress proxy"},
		{"max_processes", res(&environmentv1.ResourceLimits{MaxProcesses: ptr.To[uint32](64)}), fp, "max_processes"},
		{"cpu_time", res(&environmentv1.ResourceLimits{CpuTime: durationpb.New(time.Hour)}), fp, "cpu_time"},
		{"memory that reads as zero", res(&environmentv1.ResourceLimits{Memory: ptr.To("1e30")}), codes.InvalidArgument, "resources.memory"},
		{"memory that saturates", res(&environmentv1.ResourceLimits{Memory: ptr.To("9Ei")}), codes.InvalidArgument, "resources.memory"},
		{"cpu that wraps negative", res(&environmentv1.ResourceLimits{Cpu: ptr.To("9Ei")}), codes.InvalidArgument, "resources.cpu"},
		{"disk that reads as zero", res(&environmentv1.ResourceLimits{Disk: ptr.To("1e30")}), codes.InvalidArgument, "resources.disk"},
	}
	for _, v := range []string{"LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "BASH_ENV", "ENV", "IFS", "HOME", "TMPDIR", "GCONV_PATH",
		"DOCKER_HOST", "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "HTTPS_PROXY", "no_proxy", "SSL_CERT_FILE",
		"GODEBUG", "NEURON_OPERATOR_TOOLS"} {
		out = append(out, attackSpec{"env " + v, creds("key", envInj(v)), fp, v})
	}
	return out
}

// TestAttackSpecsRefused: each hostile spec is refused by Check, and by
// Run before any object is created.
func TestAttackSpecsRefused(t *testing.T) {
	for _, tc := range hostileSpecs() {
		t.Run(tc.name, func(t *testing.T) {
			b, client, _ := newFake(t, nil)
			assertCode(t, b.Check(tc.spec), tc.code, tc.says)
			_, err := b.Run(context.Background(), attackInvocation(t, "attack", tc.spec))
			assertCode(t, err, tc.code, tc.says)
			if n := len(client.Actions()); n != 0 {
				t.Errorf("%d API calls for a refused spec, e.g. %v", n, client.Actions()[0])
			}
		})
	}

	t.Run("secrets outside CredentialSecrets", func(t *testing.T) {
		b, client, _ := newFake(t, func(c *Config) { c.CredentialSecrets = []string{"neuron-provider-keys"} })
		spec := &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{Name: "neuron-postgres/password", Injection: envInj("PGPASSWORD")}}}
		assertCode(t, b.Check(spec), codes.NotFound, "neuron-postgres")
		_, err := b.Run(context.Background(), invocation(t, "attack", spec))
		assertCode(t, err, codes.NotFound, "neuron-provider-keys")
		if n := len(client.Actions()); n != 0 {
			t.Errorf("%d API calls for a refused spec", n)
		}
		spec.Credentials[0].Name = "neuron-provider-keys/ANTHROPIC_API_KEY"
		spec.Credentials[0].Injection = envInj("ANTHROPIC_API_KEY")
		if err := b.Check(spec); err != nil {
			t.Errorf("Check of an allowed Secret: %v", err)
		}
	})

	t.Run("resolved credentials", func(t *testing.T) {
		// Run checks the credentials it places, not only the spec's.
		b, client, _ := newFake(t, nil)
		inv := invocation(t, "attack", &environmentv1.EnvironmentSpec{})
		inv.Credentials = []environment.Credential{{Name: "key", Injection: envInj("LD_PRELOAD")}}
		_, err := b.Run(context.Background(), inv)
		assertCode(t, err, codes.FailedPrecondition, "LD_PRELOAD")
		if n := len(client.Actions()); n != 0 {
			t.Errorf("%d API calls for a refused credential", n)
		}
	})
}

// attackInvocation is invocation of spec with limits parsed without its
// resources (ParseLimits may refuse what the backend is being shown to
// refuse); Run still sees the whole spec.
func attackInvocation(t *testing.T, id string, spec *environmentv1.EnvironmentSpec) *environment.Invocation {
	t.Helper()
	r := spec.Resources
	spec.Resources = nil
	inv := invocation(t, id, spec)
	spec.Resources = r
	return inv
}

// TestAttackSafeCredentialsAllowed: the guards refuse only what they
// must.
func TestAttackSafeCredentialsAllowed(t *testing.T) {
	b, _, _ := newFake(t, nil)
	spec := &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{
		{Name: "neuron-provider-keys/ANTHROPIC_API_KEY", Injection: envInj("ANTHROPIC_API_KEY")},
		{Name: "gh", Injection: envInj("GITHUB_TOKEN")},
		{Name: "a", Injection: envInj("PATHNAME")},
		{Name: "b", Injection: fileInj("/etc/neuron/key")},
		{Name: "c", Injection: fileInj("/var/run/docker.sock")},
		{Name: "d", Injection: fileInj("/home/nonroot/.netrc")},
	}, Resources: &environmentv1.ResourceLimits{Cpu: ptr.To("64"), Memory: ptr.To("7Ei"), Disk: ptr.To("1Ti")}}
	if err := b.Check(spec); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

// hardenedSpec is the most hostile spec the backend accepts: an image
// that would want privileges (docker-in-docker), a credential file at the
// engine socket's path, and every network the backend will open.
func hardenedSpec() *environmentv1.EnvironmentSpec {
	allow := environmentv1.NetworkAction_NETWORK_ACTION_ALLOW
	return &environmentv1.EnvironmentSpec{
		Isolation: []*environmentv1.IsolationBoundary{
			{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{Image: "docker.io/library/docker:dind"}}},
		},
		Network: &environmentv1.NetworkPolicy{DefaultAction: allow},
		Credentials: []*environmentv1.CredentialRef{
			{Name: "engine", Injection: fileInj("/var/run/docker.sock")},
			{Name: "gh", Injection: envInj("GITHUB_TOKEN")},
		},
	}
}

// TestAttackJobHardened: the Job, pod template and NetworkPolicy of the
// hostile spec, exactly.
func TestAttackJobHardened(t *testing.T) {
	b, client, _ := newFake(t, func(c *Config) { c.DefaultLimits = environment.Limits{DiskBytes: 512 << 20} })
	inv := invocation(t, "hostile", hardenedSpec())
	job, policy := runAndCapture(t, b, client, inv)
	assertHardened(t, job, policy, inv.ID)
	assertResources(t, job, "1", "2Gi", "512Mi")
	// Every allow excepts the cloud's metadata service.
	if len(policy.Spec.Egress) != 2 {
		t.Fatalf("egress %+v, want 0.0.0.0/0 and ::/0", policy.Spec.Egress)
	}
	for _, e := range policy.Spec.Egress {
		if len(e.To) != 1 || e.To[0].IPBlock == nil || len(e.To[0].IPBlock.Except) == 0 {
			t.Errorf("egress rule %+v has no except", e)
			continue
		}
		except := strings.Join(e.To[0].IPBlock.Except, ",")
		if e.To[0].IPBlock.CIDR == "0.0.0.0/0" && except != "169.254.169.254/32,100.100.100.200/32" ||
			e.To[0].IPBlock.CIDR == "::/0" && except != "fd00:ec2::254/128" {
			t.Errorf("egress to %s excepts %s", e.To[0].IPBlock.CIDR, except)
		}
	}

	t.Run("no network is default deny", func(t *testing.T) {
		b, client, _ := newFake(t, nil)
		spec := hardenedSpec()
		spec.Network = nil
		_, policy := runAndCapture(t, b, client, invocation(t, "deny", spec))
		if len(policy.Spec.Egress) != 0 || len(policy.Spec.Ingress) != 0 {
			t.Errorf("egress %+v, ingress %+v; want neither", policy.Spec.Egress, policy.Spec.Ingress)
		}
	})
}

// TestAttackDiskCap: the disk limit is the pod's ephemeral-storage
// request and limit and the workspace's sizeLimit: the spec's, else the
// service's default, else Config.DefaultLimits, else 1 GiB.
func TestAttackDiskCap(t *testing.T) {
	tests := []struct {
		name     string
		cfg      environment.Limits
		spec     *string
		service  int64
		want     string
		wantCPU  string
		wantMem  string
		specCPU  *string
		specMemo *string
	}{
		{name: "spec", cfg: environment.Limits{DiskBytes: 512 << 20}, spec: ptr.To("3Gi"), want: "3Gi", wantCPU: "1", wantMem: "2Gi"},
		{name: "service default", cfg: environment.Limits{DiskBytes: 512 << 20}, service: 2 << 30, want: "2Gi", wantCPU: "1", wantMem: "2Gi"},
		{name: "config default", cfg: environment.Limits{DiskBytes: 512 << 20, CPUMillis: 250}, want: "512Mi", wantCPU: "250m", wantMem: "2Gi"},
		{name: "package default", want: "1Gi", wantCPU: "1", wantMem: "2Gi"},
		{name: "spec cpu and memory", specCPU: ptr.To("2"), specMemo: ptr.To("64Mi"), want: "1Gi", wantCPU: "2", wantMem: "64Mi"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, client, _ := newFake(t, func(c *Config) { c.DefaultLimits = tt.cfg })
			spec := &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Disk: tt.spec, Cpu: tt.specCPU, Memory: tt.specMemo}}
			inv := invocation(t, "disk", spec)
			if tt.service > 0 && tt.spec == nil {
				inv.Limits.DiskBytes = tt.service
			}
			job, _ := runAndCapture(t, b, client, inv)
			assertResources(t, job, tt.wantCPU, tt.wantMem, tt.want)
		})
	}
}

// runAndCapture runs inv until its Job exists, captures the Job and the
// NetworkPolicy, and cancels the run.
func runAndCapture(t *testing.T, b *Backend, client kubernetes.Interface, inv *environment.Invocation) (*batchv1.Job, *networkingv1.NetworkPolicy) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := start(ctx, b, inv)
	job := waitJob(t, client, r, ObjectPrefix+inv.ID)
	policy, err := client.NetworkingV1().NetworkPolicies(job.Namespace).Get(context.Background(), job.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("network policy: %v", err)
	}
	cancel()
	_, err = r.wait(t)
	assertCode(t, err, codes.Canceled, "")
	return job, policy
}

// assertResources checks the container's requests and limits (equal),
// with an ephemeral-storage limit, and the workspace's sizeLimit.
func assertResources(t *testing.T, job *batchv1.Job, cpu, memory, disk string) {
	t.Helper()
	c := job.Spec.Template.Spec.Containers[0]
	want := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse(cpu),
		corev1.ResourceMemory:           resource.MustParse(memory),
		corev1.ResourceEphemeralStorage: resource.MustParse(disk),
	}
	for name, rl := range map[string]corev1.ResourceList{"requests": c.Resources.Requests, "limits": c.Resources.Limits} {
		if len(rl) != len(want) {
			t.Errorf("%s %v, want %v", name, rl, want)
		}
		for k, v := range want {
			if got, ok := rl[k]; !ok || got.Cmp(v) != 0 {
				t.Errorf("%s %s = %s, want %s", name, k, got.String(), v.String())
			}
		}
	}
	for _, v := range job.Spec.Template.Spec.Volumes {
		if v.Name != "workspace" {
			continue
		}
		if v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Cmp(resource.MustParse(disk)) != 0 {
			t.Errorf("workspace volume %+v, want an emptyDir of at most %s", v.VolumeSource, disk)
		}
	}
}

// assertHardened checks every field of the Job and its NetworkPolicy
// through which a pod could get more than the backend grants.
func assertHardened(t *testing.T, job *batchv1.Job, policy *networkingv1.NetworkPolicy, id string) {
	t.Helper()
	ps := job.Spec.Template.Spec
	if ps.HostNetwork || ps.HostPID || ps.HostIPC || ptr.Deref(ps.ShareProcessNamespace, false) {
		t.Errorf("hostNetwork %v, hostPID %v, hostIPC %v, shareProcessNamespace %v", ps.HostNetwork, ps.HostPID, ps.HostIPC, ps.ShareProcessNamespace)
	}
	if ps.HostUsers != nil && *ps.HostUsers {
		t.Error("hostUsers true")
	}
	if ptr.Deref(ps.AutomountServiceAccountToken, true) || ptr.Deref(ps.EnableServiceLinks, true) || ps.ServiceAccountName != "" {
		t.Errorf("automountServiceAccountToken %v, enableServiceLinks %v, serviceAccountName %q", ps.AutomountServiceAccountToken, ps.EnableServiceLinks, ps.ServiceAccountName)
	}
	if ps.NodeName != "" || ps.NodeSelector != nil || ps.Affinity != nil || len(ps.Tolerations) != 0 || ps.PriorityClassName != "" {
		t.Errorf("placement: node %q, selector %v, affinity %v, tolerations %v, priority %q", ps.NodeName, ps.NodeSelector, ps.Affinity, ps.Tolerations, ps.PriorityClassName)
	}
	if len(ps.InitContainers) != 0 || len(ps.EphemeralContainers) != 0 || len(ps.Containers) != 1 {
		t.Fatalf("containers %d, init %d, ephemeral %d", len(ps.Containers), len(ps.InitContainers), len(ps.EphemeralContainers))
	}
	psc := ps.SecurityContext
	if psc == nil || !ptr.Deref(psc.RunAsNonRoot, false) || ptr.Deref(psc.RunAsUser, 0) == 0 || ptr.Deref(psc.RunAsGroup, 0) == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || len(psc.Sysctls) != 0 ||
		psc.SupplementalGroups != nil {
		t.Errorf("pod securityContext %+v", psc)
	}
	for _, v := range ps.Volumes {
		switch {
		case v.HostPath != nil:
			t.Errorf("hostPath volume %s: %s", v.Name, v.HostPath.Path)
		case v.Secret != nil:
			if ptr.Deref(v.Secret.DefaultMode, 0o644) != 0o400 {
				t.Errorf("secret volume %s mode %o", v.Name, ptr.Deref(v.Secret.DefaultMode, 0o644))
			}
		case v.EmptyDir != nil:
			if v.EmptyDir.Medium != corev1.StorageMediumDefault {
				t.Errorf("emptyDir %s on %q, want disk (counted as ephemeral storage)", v.Name, v.EmptyDir.Medium)
			}
		default:
			t.Errorf("volume %s of an unexpected kind: %+v", v.Name, v.VolumeSource)
		}
	}
	c := ps.Containers[0]
	sc := c.SecurityContext
	if sc == nil || ptr.Deref(sc.Privileged, false) || ptr.Deref(sc.AllowPrivilegeEscalation, true) || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) ||
		!ptr.Deref(sc.RunAsNonRoot, false) || sc.Capabilities == nil || len(sc.Capabilities.Add) != 0 ||
		len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" ||
		sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount || sc.SeccompProfile != nil && sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container securityContext %+v", sc)
	}
	if len(c.Ports) != 0 {
		t.Errorf("ports %v", c.Ports)
	}
	for _, m := range c.VolumeMounts {
		if m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone {
			t.Errorf("mount %s propagation %s", m.MountPath, *m.MountPropagation)
		}
		if m.Name != "workspace" && m.Name != "tmp" && !m.ReadOnly {
			t.Errorf("mount %s of %s is writable", m.MountPath, m.Name)
		}
	}
	for _, e := range c.Env {
		if e.Name != "HOME" && e.Name != "TMPDIR" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "") {
			t.Errorf("env %s is not a Secret reference: %+v", e.Name, e)
		}
	}
	if c.Resources.Limits == nil {
		t.Fatal("no resource limits")
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
		if q, ok := c.Resources.Limits[r]; !ok || q.Sign() <= 0 {
			t.Errorf("no %s limit: %v", r, c.Resources.Limits)
		}
	}
	if ptr.Deref(job.Spec.BackoffLimit, 1) != 0 || job.Spec.ActiveDeadlineSeconds == nil {
		t.Errorf("backoffLimit %v, activeDeadlineSeconds %v", job.Spec.BackoffLimit, job.Spec.ActiveDeadlineSeconds)
	}

	// The NetworkPolicy selects this pod, refuses all ingress, and
	// governs egress.
	sel := policy.Spec.PodSelector.MatchLabels
	if len(sel) != 1 || sel[InvocationLabel] != id || job.Spec.Template.Labels[InvocationLabel] != id {
		t.Errorf("policy selects %v, pod labelled %v", sel, job.Spec.Template.Labels)
	}
	types := map[networkingv1.PolicyType]bool{}
	for _, pt := range policy.Spec.PolicyTypes {
		types[pt] = true
	}
	if !types[networkingv1.PolicyTypeIngress] || !types[networkingv1.PolicyTypeEgress] || len(policy.Spec.Ingress) != 0 {
		t.Errorf("policy types %v, ingress %v; want both types and no ingress", policy.Spec.PolicyTypes, policy.Spec.Ingress)
	}
}

// attackRealAPIServer runs the hostile spec against a real API server
// in a namespace that enforces the restricted Pod Security Standard: the
// API server stores the Job (its validation passes), its pod is
// admitted (the restricted profile: no host namespaces, no hostPath, no
// privilege escalation, capabilities dropped, non-root, RuntimeDefault
// seccomp), and a pod with any one of those weakened is refused, so the
// admission is really on.
func attackRealAPIServer(t *testing.T, cfg *rest.Config) {
	ctx := context.Background()
	var mu sync.Mutex
	var warnings []string
	wcfg := rest.CopyConfig(cfg)
	wcfg.WarningHandler = warningFunc(func(code int, agent, text string) {
		mu.Lock()
		defer mu.Unlock()
		warnings = append(warnings, text)
	})
	client, err := kubernetes.NewForConfig(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "neuron-attack"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns,
		Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted",
			"pod-security.kubernetes.io/warn":    "restricted",
		},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	api, err := NewClient(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testLogs{}
	b, err := New(Config{Client: api, Namespace: ns, DefaultImage: "registry.example/operator:default", PollInterval: time.Hour, Logs: logs.open,
		DefaultLimits: environment.Limits{DiskBytes: 768 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	b.grace = 0

	inv := invocation(t, "attack-1", hardenedSpec())
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := start(runCtx, b, inv)
	var job *batchv1.Job
	for job == nil {
		j, err := client.BatchV1().Jobs(ns).Get(ctx, ObjectPrefix+inv.ID, metav1.GetOptions{})
		if err == nil {
			job = j
			break
		}
		select {
		case <-r.done:
			t.Fatalf("Run returned before its Job existed: %v", r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	policy, err := client.NetworkingV1().NetworkPolicies(ns).Get(ctx, job.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	assertHardened(t, job, policy, inv.ID)
	assertResources(t, job, "1", "2Gi", "768Mi")
	mu.Lock()
	for _, w := range warnings {
		if strings.Contains(w, "PodSecurity") {
			t.Errorf("the API server warned about the Job: %s", w)
		}
	}
	mu.Unlock()

	// The pod the Job controller would create is admitted.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-x7k2p", Namespace: ns, Labels: job.Spec.Template.Labels}, Spec: *job.Spec.Template.Spec.DeepCopy()}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the restricted namespace refused the invocation's pod: %v", err)
	}
	// Each weakening of it is refused.
	weaken := map[string]func(*corev1.PodSpec){
		"hostNetwork": func(s *corev1.PodSpec) { s.HostNetwork = true },
		"hostPID":     func(s *corev1.PodSpec) { s.HostPID = true },
		"hostPath": func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "sock", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/docker.sock"}}})
		},
		"privileged": func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Privileged = ptr.To(true) },
		"privilege escalation": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		},
		"capability": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		},
		"root": func(s *corev1.PodSpec) { s.SecurityContext.RunAsUser = ptr.To[int64](0) },
		"seccomp unconfined": func(s *corev1.PodSpec) {
			s.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		},
	}
	for name, w := range weaken {
		p := pod.DeepCopy()
		p.Name = strings.ToLower(pod.Name + "-" + strings.ReplaceAll(name, " ", "-"))
		p.ResourceVersion = ""
		w(&p.Spec)
		_, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		switch {
		case name == "privileged" && apierrors.IsInvalid(err):
			// The API server's own --allow-privileged=false refuses it
			// before admission.
		case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity"):
			t.Errorf("a pod with %s: %v, want Forbidden by Pod Security admission", name, err)
		}
	}

	cancel()
	_, err = r.wait(t)
	assertCode(t, err, codes.Canceled, "")
	for kind, get := range map[string]func() error{
		"Job": func() error { _, err := client.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{}); return err },
		"Secret": func() error {
			_, err := client.CoreV1().Secrets(ns).Get(ctx, job.Name, metav1.GetOptions{})
			return err
		},
		"NetworkPolicy": func() error {
			_, err := client.NetworkingV1().NetworkPolicies(ns).Get(ctx, job.Name, metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); !apierrors.IsNotFound(err) {
			t.Errorf("%s %s still there after Run (err %v)", kind, job.Name, err)
		}
	}
}

// warningFunc adapts a function to rest.WarningHandler.
type warningFunc func(code int, agent, text string)

func (f warningFunc) HandleWarningHeader(code int, agent, text string) { f(code, agent, text) }

// TestAttackOutputBounded: with no output limit from the spec or the
// service, the log read back is still bounded (Config.DefaultLimits'
// 16 MiB), so a pod cannot fill the service's memory.
func TestAttackOutputBounded(t *testing.T) {
	b, client, logs := newFake(t, nil)
	inv := invocation(t, "flood", &environmentv1.EnvironmentSpec{})
	inv.Limits.MaxOutputBytes = 0
	r := start(context.Background(), b, inv)
	job := waitJob(t, client, r, ObjectPrefix+inv.ID)
	pod := createPod(t, client, job, terminated(0, "Completed"))
	logs.set(pod.Name, strings.Repeat("x", DefaultMaxOutputBytes+1))
	finishJob(t, client, job, batchv1.JobComplete, "CompletionsReached")
	_, err := r.wait(t)
	assertCode(t, err, codes.ResourceExhausted, "16777216 bytes")
}
