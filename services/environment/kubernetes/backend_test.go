package kubernetes

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

const testNamespace = "neuron-test"

// testLogs serves pod logs from a map, as the injected Config.Logs.
type testLogs struct {
	mu   sync.Mutex
	logs map[string]string // pod name -> log
	read []string          // pods whose log was read
}

func (l *testLogs) set(pod, log string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.logs == nil {
		l.logs = map[string]string{}
	}
	l.logs[pod] = log
}

func (l *testLogs) open(_ context.Context, namespace, pod string) (io.ReadCloser, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.read = append(l.read, namespace+"/"+pod)
	log, ok := l.logs[pod]
	if !ok {
		return nil, errors.New("no log for pod " + pod)
	}
	return io.NopCloser(strings.NewReader(log)), nil
}

// newFake returns a backend over a fake clientset whose Jobs get a UID
// on creation, as the API server gives them.
func newFake(t *testing.T, mutate func(*Config)) (*Backend, *fake.Clientset, *testLogs) {
	t.Helper()
	client := fake.NewClientset()
	client.PrependReactor("create", "jobs", func(a k8stesting.Action) (bool, runtime.Object, error) {
		a.(k8stesting.CreateAction).GetObject().(*batchv1.Job).UID = types.UID("uid-" + a.(k8stesting.CreateAction).GetObject().(*batchv1.Job).Name)
		return false, nil, nil
	})
	logs := &testLogs{}
	cfg := Config{
		Client:       clientset{client},
		Namespace:    testNamespace,
		DefaultImage: "registry.example/operator:default",
		OperatorArgs: []string{"--model", "scripted"},
		PollInterval: 10 * time.Millisecond,
		Logs:         logs.open,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	b.grace = 0
	return b, client, logs
}

// representativeSpec exercises every part of the Job the backend builds.
func representativeSpec() *environmentv1.EnvironmentSpec {
	return &environmentv1.EnvironmentSpec{
		Isolation: []*environmentv1.IsolationBoundary{
			{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{Image: "registry.example/operator:1.2"}}},
			{Kind: &environmentv1.IsolationBoundary_NetworkPolicy{NetworkPolicy: &environmentv1.NetworkPolicyIsolation{Rules: []*environmentv1.NetworkRule{
				{Destination: "10.0.0.0/8", Port: ptr.To[uint32](443), Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW},
				{Destination: "2001:db8::/32", Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW},
			}}}},
		},
		Network: &environmentv1.NetworkPolicy{
			DefaultAction: environmentv1.NetworkAction_NETWORK_ACTION_DENY,
			Rules: []*environmentv1.NetworkRule{
				{Destination: "10.1.0.0/16", Action: environmentv1.NetworkAction_NETWORK_ACTION_DENY},
				{Destination: "192.0.2.10", Port: ptr.To[uint32](53), Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW},
			},
		},
		Credentials: []*environmentv1.CredentialRef{
			{Name: "anthropic", Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "ANTHROPIC_API_KEY"}}}},
			{Name: "tls-bundle/ca.pem", Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_File{File: &environmentv1.FileInjection{Path: "/etc/neuron/ca.pem"}}}},
		},
		Resources: &environmentv1.ResourceLimits{Cpu: ptr.To("500m"), Memory: ptr.To("512Mi"), Disk: ptr.To("1Gi"), Gpu: ptr.To("1")},
	}
}

// invocation resolves spec as the server would.
func invocation(t *testing.T, id string, spec *environmentv1.EnvironmentSpec) *environment.Invocation {
	t.Helper()
	input := &operatorv1.OperatorInput{Message: text("hello")}
	inputJSON, err := protojson.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	limits, err := environment.ParseLimits(spec.GetResources(), environment.DefaultDefaults().Limits)
	if err != nil {
		t.Fatalf("ParseLimits: %v", err)
	}
	network, err := environment.ParseNetwork(spec)
	if err != nil {
		t.Fatalf("ParseNetwork: %v", err)
	}
	var creds []environment.Credential
	for _, c := range spec.GetCredentials() {
		creds = append(creds, environment.Credential{Name: c.GetName(), Injection: c.GetInjection()})
	}
	return &environment.Invocation{
		ID: id, Input: input, InputJSON: inputJSON, Spec: spec,
		Limits: limits, Timeout: 90*time.Second + 300*time.Millisecond,
		Network: network, Credentials: creds,
	}
}

func text(s string) *typesv1.Content {
	return &typesv1.Content{Blocks: []*typesv1.ContentBlock{{Block: &typesv1.ContentBlock_Text{Text: &typesv1.TextBlock{Text: s}}}}}
}

// run is one Run in the background.
type run struct {
	done chan struct{}
	res  *environment.Result
	err  error
}

func start(ctx context.Context, b *Backend, inv *environment.Invocation) *run {
	r := &run{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.res, r.err = b.Run(ctx, inv)
	}()
	return r
}

func (r *run) wait(t *testing.T) (*environment.Result, error) {
	t.Helper()
	<-r.done
	return r.res, r.err
}

// waitJob returns the Job of r once it exists, or fails the test if Run
// returns first.
func waitJob(t *testing.T, client kubernetes.Interface, r *run, name string) *batchv1.Job {
	t.Helper()
	for {
		job, err := client.BatchV1().Jobs(testNamespace).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			return job
		}
		select {
		case <-r.done:
			t.Fatalf("Run returned before job %s existed: %v", name, r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitOwned returns the Secret and NetworkPolicy named name once Run has
// made its Job their owner, or fails the test if Run returns first.
func waitOwned(t *testing.T, client kubernetes.Interface, r *run, name string) (*corev1.Secret, *networkingv1.NetworkPolicy) {
	t.Helper()
	ctx := context.Background()
	for {
		secret, err := client.CoreV1().Secrets(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("input secret: %v", err)
		}
		policy, err := client.NetworkingV1().NetworkPolicies(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("network policy: %v", err)
		}
		if len(secret.OwnerReferences) > 0 && len(policy.OwnerReferences) > 0 {
			return secret, policy
		}
		select {
		case <-r.done:
			t.Fatalf("Run returned before it set the owner references: %v", r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// createPod creates the pod the Job controller would, with its operator
// container in state.
func createPod(t *testing.T, client kubernetes.Interface, job *batchv1.Job, state corev1.ContainerState) *corev1.Pod {
	t.Helper()
	labels := map[string]string{"batch.kubernetes.io/job-name": job.Name}
	for k, v := range job.Spec.Template.Labels {
		labels[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-x7k2p", Namespace: job.Namespace, Labels: labels},
		Spec:       *job.Spec.Template.Spec.DeepCopy(),
		Status: corev1.PodStatus{
			Phase:             corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: containerName, Image: job.Spec.Template.Spec.Containers[0].Image, State: state}},
		},
	}
	if state.Terminated != nil {
		pod.Status.Phase = corev1.PodFailed
		if state.Terminated.ExitCode == 0 {
			pod.Status.Phase = corev1.PodSucceeded
		}
	}
	pod, err := client.CoreV1().Pods(job.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	return pod
}

func terminated(exit int32, reason string) corev1.ContainerState {
	now := metav1.Now()
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: reason, StartedAt: now, FinishedAt: now}}
}

// finishJob sets the Job's terminal condition as the Job controller
// would.
func finishJob(t *testing.T, client kubernetes.Interface, job *batchv1.Job, cond batchv1.JobConditionType, reason string) {
	t.Helper()
	job, err := client.BatchV1().Jobs(job.Namespace).Get(context.Background(), job.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get job: %v", err)
	}
	now := metav1.Now()
	job.Status.StartTime = &now
	interim := batchv1.JobSuccessCriteriaMet
	if cond == batchv1.JobFailed {
		interim = batchv1.JobFailureTarget
		job.Status.Failed = 1
	} else {
		job.Status.Succeeded = 1
		job.Status.CompletionTime = &now
	}
	job.Status.Conditions = append(job.Status.Conditions,
		batchv1.JobCondition{Type: interim, Status: corev1.ConditionTrue, Reason: reason, LastProbeTime: now, LastTransitionTime: now},
		batchv1.JobCondition{Type: cond, Status: corev1.ConditionTrue, Reason: reason, Message: "simulated", LastProbeTime: now, LastTransitionTime: now})
	if _, err := client.BatchV1().Jobs(job.Namespace).UpdateStatus(context.Background(), job, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update job status: %v", err)
	}
}

// assertCleanedUp fails unless the invocation's Job, Secret and
// NetworkPolicy are gone.
func assertCleanedUp(t *testing.T, client kubernetes.Interface, namespace string) {
	t.Helper()
	ctx := context.Background()
	jobs, err := client.BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := client.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	policies, err := client.NetworkingV1().NetworkPolicies(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, j := range jobs.Items {
		left = append(left, "Job "+j.Name)
	}
	for _, s := range secrets.Items {
		left = append(left, "Secret "+s.Name)
	}
	for _, p := range policies.Items {
		left = append(left, "NetworkPolicy "+p.Name)
	}
	if len(left) > 0 {
		t.Errorf("left behind after Run: %v", left)
	}
}

func assertCode(t *testing.T, err error, want codes.Code, contains string) {
	t.Helper()
	if got := errs.Code(err); got != want {
		t.Fatalf("error %v: code %v, want %v", err, got, want)
	}
	if contains != "" && !strings.Contains(err.Error(), contains) {
		t.Errorf("error %q does not mention %q", err, contains)
	}
}

const logLine = `{"time":"2026-11-21T10:00:00Z","level":"INFO","msg":"tools","builtin":"read,write"}`

func outputJSON(t *testing.T, out *operatorv1.OperatorOutput) string {
	t.Helper()
	b, err := protojson.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRunCreatesTheObjectsAndDecodesTheOutput(t *testing.T) {
	b, client, logs := newFake(t, nil)
	inv := invocation(t, "inv-1", representativeSpec())
	r := start(context.Background(), b, inv)
	job := waitJob(t, client, r, "neuron-inv-inv-1")

	assertJob(t, job, inv)
	secret, policy := waitOwned(t, client, r, job.Name)
	assertSecret(t, secret, inv)
	assertPolicy(t, policy)
	for _, owned := range []metav1.ObjectMeta{secret.ObjectMeta, policy.ObjectMeta} {
		want := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID}}
		if !reflect.DeepEqual(owned.OwnerReferences, want) {
			t.Errorf("%s owner references = %+v, want %+v", owned.Name, owned.OwnerReferences, want)
		}
	}

	want := &operatorv1.OperatorOutput{Message: text("done")}
	pod := createPod(t, client, job, terminated(0, "Completed"))
	logs.set(pod.Name, logLine+"\n"+outputJSON(t, want)+"\n"+`{"time":"2026-11-21T10:00:01Z","level":"INFO","msg":"bye"}`+"\n")
	finishJob(t, client, job, batchv1.JobComplete, "CompletionsReached")

	res, err := r.wait(t)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !proto.Equal(res.Output, want) {
		t.Errorf("output = %v, want %v", res.Output, want)
	}
	if got := string(res.Logs); !strings.Contains(got, `"msg":"tools"`) || !strings.Contains(got, `"msg":"bye"`) || strings.Contains(got, `"done"`) {
		t.Errorf("logs = %q, want both log lines and not the output line", got)
	}
	if want := []string{testNamespace + "/" + pod.Name}; !reflect.DeepEqual(logs.read, want) {
		t.Errorf("logs read = %v, want %v", logs.read, want)
	}
	assertCleanedUp(t, client, testNamespace)
}

func assertSecret(t *testing.T, s *corev1.Secret, inv *environment.Invocation) {
	t.Helper()
	if got := string(s.Data["input.json"]); got != string(inv.InputJSON) {
		t.Errorf("input.json = %q, want %q", got, inv.InputJSON)
	}
	if len(s.Data) != 1 || !ptr.Deref(s.Immutable, false) {
		t.Errorf("secret data keys %d, immutable %v; want 1 key, immutable", len(s.Data), s.Immutable)
	}
	if s.Labels[InvocationLabel] != inv.ID {
		t.Errorf("secret labels = %v", s.Labels)
	}
}

func assertPolicy(t *testing.T, p *networkingv1.NetworkPolicy) {
	t.Helper()
	if want := map[string]string{InvocationLabel: "inv-1"}; !reflect.DeepEqual(p.Spec.PodSelector.MatchLabels, want) {
		t.Errorf("pod selector = %v, want %v", p.Spec.PodSelector.MatchLabels, want)
	}
	if want := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}; !reflect.DeepEqual(p.Spec.PolicyTypes, want) {
		t.Errorf("policy types = %v, want %v", p.Spec.PolicyTypes, want)
	}
	if len(p.Spec.Ingress) != 0 {
		t.Errorf("ingress rules = %v, want none", p.Spec.Ingress)
	}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(n int32) []networkingv1.NetworkPolicyPort {
		p := intstr.FromInt32(n)
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}, {Protocol: &udp, Port: &p}}
	}
	to := func(cidr string, except ...string) []networkingv1.NetworkPolicyPeer {
		return []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}}
	}
	want := []networkingv1.NetworkPolicyEgressRule{
		{To: to("192.0.2.10/32"), Ports: port(53)},
		{To: to("10.0.0.0/8", "10.1.0.0/16"), Ports: port(443)},
		{To: to("2001:db8::/32")},
	}
	if !reflect.DeepEqual(p.Spec.Egress, want) {
		t.Errorf("egress =\n%+v\nwant\n%+v", p.Spec.Egress, want)
	}
}

func assertJob(t *testing.T, job *batchv1.Job, inv *environment.Invocation) {
	t.Helper()
	if job.Labels[InvocationLabel] != inv.ID || job.Spec.Template.Labels[InvocationLabel] != inv.ID {
		t.Errorf("labels: job %v, template %v; want %s=%s on both", job.Labels, job.Spec.Template.Labels, InvocationLabel, inv.ID)
	}
	if got := ptr.Deref(job.Spec.BackoffLimit, -1); got != 0 {
		t.Errorf("backoffLimit = %d, want 0", got)
	}
	if got := ptr.Deref(job.Spec.ActiveDeadlineSeconds, 0); got != 91 {
		t.Errorf("activeDeadlineSeconds = %d, want 91 (90.3s rounded up)", got)
	}
	if got := ptr.Deref(job.Spec.TTLSecondsAfterFinished, 0); got != 300 {
		t.Errorf("ttlSecondsAfterFinished = %d, want 300", got)
	}
	ps := job.Spec.Template.Spec
	if ps.RestartPolicy != corev1.RestartPolicyNever || ptr.Deref(ps.AutomountServiceAccountToken, true) || ptr.Deref(ps.EnableServiceLinks, true) {
		t.Errorf("restartPolicy %s, automountServiceAccountToken %v, enableServiceLinks %v; want Never, false, false",
			ps.RestartPolicy, ps.AutomountServiceAccountToken, ps.EnableServiceLinks)
	}
	if ps.RuntimeClassName != nil {
		t.Errorf("runtimeClassName = %q, want none", *ps.RuntimeClassName)
	}
	wantPSC := &corev1.PodSecurityContext{
		RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532), FSGroup: ptr.To[int64](65532),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if !reflect.DeepEqual(ps.SecurityContext, wantPSC) {
		t.Errorf("pod securityContext = %+v, want %+v", ps.SecurityContext, wantPSC)
	}
	if len(ps.Containers) != 1 || len(ps.InitContainers) != 0 {
		t.Fatalf("containers %d, init containers %d; want 1, 0", len(ps.Containers), len(ps.InitContainers))
	}
	c := ps.Containers[0]
	if c.Image != "registry.example/operator:1.2" {
		t.Errorf("image = %q", c.Image)
	}
	wantCmd := []string{"/operator", "--model", "scripted", "--workspace", "/workspace", "--one-shot", "--log-format", "json", "--one-shot-input", "/input/input.json"}
	if !reflect.DeepEqual(c.Command, wantCmd) || len(c.Args) != 0 {
		t.Errorf("command = %q args %q, want %q", c.Command, c.Args, wantCmd)
	}
	wantRes := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("500m"),
		corev1.ResourceMemory:           resource.MustParse("512Mi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("1Gi"),
		"nvidia.com/gpu":                resource.MustParse("1"),
	}
	for _, rl := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
		if len(rl) != len(wantRes) {
			t.Errorf("resources %v, want %v", rl, wantRes)
		}
		for k, v := range wantRes {
			if got := rl[k]; got.Cmp(v) != 0 {
				t.Errorf("resource %s = %s, want %s", k, got.String(), v.String())
			}
		}
	}
	wantCSC := &corev1.SecurityContext{
		RunAsNonRoot: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	if !reflect.DeepEqual(c.SecurityContext, wantCSC) {
		t.Errorf("container securityContext = %+v, want %+v", c.SecurityContext, wantCSC)
	}
	wantEnv := []corev1.EnvVar{
		{Name: "HOME", Value: "/tmp"},
		{Name: "TMPDIR", Value: "/tmp"},
		{Name: "ANTHROPIC_API_KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "anthropic"}, Key: "value"}}},
	}
	if !reflect.DeepEqual(c.Env, wantEnv) {
		t.Errorf("env = %+v, want %+v", c.Env, wantEnv)
	}
	wantMounts := []corev1.VolumeMount{
		{Name: "input", MountPath: "/input", ReadOnly: true},
		{Name: "workspace", MountPath: "/workspace"},
		{Name: "tmp", MountPath: "/tmp"},
		{Name: "credential-1", MountPath: "/etc/neuron/ca.pem", SubPath: "credential", ReadOnly: true},
	}
	if !reflect.DeepEqual(c.VolumeMounts, wantMounts) {
		t.Errorf("mounts = %+v, want %+v", c.VolumeMounts, wantMounts)
	}
	wantVolumes := []corev1.Volume{
		{Name: "input", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "neuron-inv-inv-1", DefaultMode: ptr.To[int32](0o400)}}},
		{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("1Gi"))}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "credential-1", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: "tls-bundle", Items: []corev1.KeyToPath{{Key: "ca.pem", Path: "credential"}}, DefaultMode: ptr.To[int32](0o400)}}},
	}
	if len(ps.Volumes) != len(wantVolumes) {
		t.Fatalf("volumes = %+v, want %+v", ps.Volumes, wantVolumes)
	}
	for i, v := range ps.Volumes {
		w := wantVolumes[i]
		if w.EmptyDir != nil && w.EmptyDir.SizeLimit != nil {
			if v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Cmp(*w.EmptyDir.SizeLimit) != 0 {
				t.Errorf("volume %s = %+v, want sizeLimit %s", v.Name, v.VolumeSource, w.EmptyDir.SizeLimit.String())
			}
			continue
		}
		if !reflect.DeepEqual(v, w) {
			t.Errorf("volume %d = %+v, want %+v", i, v, w)
		}
	}
}

func TestRunOutcomes(t *testing.T) {
	statusLine := `{"code":5,"message":"agent not found"}`
	tests := []struct {
		name     string
		cond     batchv1.JobConditionType
		reason   string
		state    corev1.ContainerState // nil: no pod
		log      string
		maxOut   uint64
		code     codes.Code
		contains string
	}{
		{name: "operator status", cond: batchv1.JobFailed, reason: "BackoffLimitExceeded", state: terminated(15, "Error"),
			log: logLine + "\n" + statusLine + "\n", code: codes.NotFound, contains: "agent not found"},
		{name: "out of memory", cond: batchv1.JobFailed, reason: "BackoffLimitExceeded", state: terminated(137, "OOMKilled"),
			code: codes.ResourceExhausted, contains: "memory limit reached"},
		{name: "deadline", cond: batchv1.JobFailed, reason: batchv1.JobReasonDeadlineExceeded,
			code: codes.DeadlineExceeded, contains: "timeout"},
		{name: "output over the limit", cond: batchv1.JobComplete, reason: "CompletionsReached", state: terminated(0, "Completed"),
			log: logLine + "\n" + `{}` + "\n", maxOut: 40, code: codes.ResourceExhausted, contains: "max_output_bytes"},
		{name: "config error exit", cond: batchv1.JobFailed, reason: "BackoffLimitExceeded", state: terminated(2, "Error"),
			log: logLine + "\n", code: codes.Internal},
		{name: "no output line", cond: batchv1.JobComplete, reason: "CompletionsReached", state: terminated(0, "Completed"),
			log: logLine + "\n", code: codes.Internal},
		{name: "no terminated pod", cond: batchv1.JobFailed, reason: "PodFailurePolicy",
			code: codes.Unavailable, contains: "no pod"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, client, logs := newFake(t, nil)
			inv := invocation(t, "inv-2", representativeSpec())
			if tt.maxOut > 0 {
				inv.Limits.MaxOutputBytes = tt.maxOut
			}
			r := start(context.Background(), b, inv)
			job := waitJob(t, client, r, "neuron-inv-inv-2")
			if tt.state.Terminated != nil {
				pod := createPod(t, client, job, tt.state)
				logs.set(pod.Name, tt.log)
			}
			finishJob(t, client, job, tt.cond, tt.reason)
			_, err := r.wait(t)
			assertCode(t, err, tt.code, tt.contains)
			assertCleanedUp(t, client, testNamespace)
		})
	}
}

func TestRunFailsFastOnAContainerConfigError(t *testing.T) {
	b, client, _ := newFake(t, nil)
	r := start(context.Background(), b, invocation(t, "inv-3", representativeSpec()))
	job := waitJob(t, client, r, "neuron-inv-inv-3")
	createPod(t, client, job, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason: "CreateContainerConfigError", Message: `secret "anthropic" not found`}})
	_, err := r.wait(t)
	assertCode(t, err, codes.FailedPrecondition, `secret "anthropic" not found`)
	assertCleanedUp(t, client, testNamespace)
}

func TestRunTimeoutWhenTheJobNeverFinishes(t *testing.T) {
	b, client, _ := newFake(t, nil)
	inv := invocation(t, "inv-4", representativeSpec())
	inv.Timeout = 50 * time.Millisecond
	_, err := b.Run(context.Background(), inv)
	assertCode(t, err, codes.DeadlineExceeded, "timeout")
	assertCleanedUp(t, client, testNamespace)
}

func TestRunCanceled(t *testing.T) {
	b, client, _ := newFake(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := start(ctx, b, invocation(t, "inv-5", representativeSpec()))
	waitJob(t, client, r, "neuron-inv-inv-5")
	cancel()
	_, err := r.wait(t)
	assertCode(t, err, codes.Canceled, "")
	assertCleanedUp(t, client, testNamespace)
}

func TestRunPollsWhenTheWatchFails(t *testing.T) {
	b, client, logs := newFake(t, nil)
	client.PrependWatchReactor("jobs", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, nil, errors.New("watch unavailable")
	})
	r := start(context.Background(), b, invocation(t, "inv-6", representativeSpec()))
	job := waitJob(t, client, r, "neuron-inv-inv-6")
	want := &operatorv1.OperatorOutput{Message: text("polled")}
	pod := createPod(t, client, job, terminated(3, "Error"))
	logs.set(pod.Name, outputJSON(t, want)+"\n"+logLine)
	finishJob(t, client, job, batchv1.JobFailed, "BackoffLimitExceeded")
	res, err := r.wait(t)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !proto.Equal(res.Output, want) {
		t.Errorf("output = %v, want %v", res.Output, want)
	}
	assertCleanedUp(t, client, testNamespace)
}

func TestRunCleansUpWhenTheJobCannotBeCreated(t *testing.T) {
	b, client, _ := newFake(t, nil)
	client.PrependReactor("create", "jobs", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	_, err := b.Run(context.Background(), invocation(t, "inv-7", representativeSpec()))
	assertCode(t, err, codes.Unavailable, "connection refused")
	assertCleanedUp(t, client, testNamespace)
}

func TestRunWithGvisor(t *testing.T) {
	b, client, _ := newFake(t, func(c *Config) { c.RuntimeClassGvisor = "gvisor" })
	spec := representativeSpec()
	spec.Isolation = append(spec.Isolation, &environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Gvisor{Gvisor: &environmentv1.GvisorIsolation{}}})
	if err := b.Check(spec); err != nil {
		t.Fatalf("Check: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := start(ctx, b, invocation(t, "inv-8", spec))
	job := waitJob(t, client, r, "neuron-inv-inv-8")
	cancel()
	r.wait(t)
	if got := ptr.Deref(job.Spec.Template.Spec.RuntimeClassName, ""); got != "gvisor" {
		t.Errorf("runtimeClassName = %q, want gvisor", got)
	}
}

func TestCheck(t *testing.T) {
	allow, deny := environmentv1.NetworkAction_NETWORK_ACTION_ALLOW, environmentv1.NetworkAction_NETWORK_ACTION_DENY
	boundary := func(b *environmentv1.IsolationBoundary) func(*environmentv1.EnvironmentSpec) {
		return func(s *environmentv1.EnvironmentSpec) { s.Isolation = append(s.Isolation, b) }
	}
	credential := func(name string, inj *environmentv1.CredentialInjection) func(*environmentv1.EnvironmentSpec) {
		return func(s *environmentv1.EnvironmentSpec) {
			s.Credentials = append(s.Credentials, &environmentv1.CredentialRef{Name: name, Injection: inj})
		}
	}
	file := func(path string) *environmentv1.CredentialInjection {
		return &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_File{File: &environmentv1.FileInjection{Path: path}}}
	}
	tests := []struct {
		name     string
		noImage  bool
		edit     func(*environmentv1.EnvironmentSpec)
		code     codes.Code
		contains string
	}{
		{name: "representative", edit: func(*environmentv1.EnvironmentSpec) {}, code: codes.OK},
		{name: "empty spec", edit: func(s *environmentv1.EnvironmentSpec) { proto.Reset(s) }, code: codes.OK},
		{name: "domain rule", edit: func(s *environmentv1.EnvironmentSpec) {
			s.Network.Rules = append(s.Network.Rules, &environmentv1.NetworkRule{Destination: "api.anthropic.com", Action: allow})
		}, code: codes.FailedPrecondition, contains: "api.anthropic.com"},
		{name: "port deny inside an all-ports allow", edit: func(s *environmentv1.EnvironmentSpec) {
			s.Network.Rules = append([]*environmentv1.NetworkRule{{Destination: "2001:db8:1::/48", Port: ptr.To[uint32](22), Action: deny}}, s.Network.Rules...)
		}, code: codes.FailedPrecondition, contains: "port 22"},
		{name: "malformed rule", edit: func(s *environmentv1.EnvironmentSpec) {
			s.Network.Rules = append(s.Network.Rules, &environmentv1.NetworkRule{Destination: "10.0.0.0/33", Action: allow})
		}, code: codes.InvalidArgument},
		{name: "sidecar credential", edit: credential("anthropic", &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_Sidecar{
			Sidecar: &environmentv1.SidecarInjection{Host: "api.anthropic.com"}}}), code: codes.FailedPrecondition, contains: "egress proxy"},
		{name: "credential not a secret name", edit: credential("Anthropic_Key", file("/etc/key")), code: codes.FailedPrecondition, contains: "Secret name"},
		{name: "credential file over the input", edit: credential("key", file("/input/input.json")), code: codes.FailedPrecondition, contains: "/input"},
		{name: "credential file twice", edit: credential("key", file("/etc/neuron/ca.pem")), code: codes.FailedPrecondition, contains: "already mounted"},
		{name: "max_processes", edit: func(s *environmentv1.EnvironmentSpec) { s.Resources.MaxProcesses = ptr.To[uint32](64) },
			code: codes.FailedPrecondition, contains: "max_processes"},
		{name: "cpu_time", edit: func(s *environmentv1.EnvironmentSpec) { s.Resources.CpuTime = durationpb.New(time.Minute) },
			code: codes.FailedPrecondition, contains: "cpu_time"},
		{name: "gvisor without a runtime class", edit: boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Gvisor{Gvisor: &environmentv1.GvisorIsolation{}}}),
			code: codes.FailedPrecondition, contains: "gvisor"},
		{name: "microvm", edit: boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Microvm{Microvm: &environmentv1.MicroVmIsolation{}}}),
			code: codes.FailedPrecondition, contains: "microvm"},
		{name: "no image anywhere", noImage: true, edit: func(s *environmentv1.EnvironmentSpec) { s.Isolation = s.Isolation[1:] },
			code: codes.FailedPrecondition, contains: "image"},
		{name: "spec image without a default", noImage: true, edit: func(*environmentv1.EnvironmentSpec) {}, code: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _, _ := newFake(t, func(c *Config) {
				if tt.noImage {
					c.DefaultImage = ""
				}
			})
			spec := representativeSpec()
			tt.edit(spec)
			err := b.Check(spec)
			assertCode(t, err, tt.code, tt.contains)
		})
	}
}

func TestNew(t *testing.T) {
	client := fake.NewClientset()
	for _, cfg := range []Config{
		{Namespace: "ns"},
		{Client: clientset{client}},
		{Client: clientset{client}, Namespace: "Not_A_Namespace"},
		{Client: clientset{client}, Namespace: "ns", SecretKey: "bad key"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", cfg)
		}
	}
	b, err := New(Config{Client: clientset{client}, Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	if b.Name() != "kubernetes" || !b.SecretsByReference() {
		t.Errorf("Name %q, SecretsByReference %v", b.Name(), b.SecretsByReference())
	}
	if b.cfg.OperatorPath != "/operator" || b.cfg.SecretKey != "value" || b.cfg.PollInterval != time.Second || b.cfg.Logs == nil {
		t.Errorf("defaults not applied: %+v", b.cfg)
	}
}

func TestOutputLine(t *testing.T) {
	out := `{"message":{"blocks":[{"text":{"text":"hi"}}]}}`
	tests := []struct {
		name     string
		logs     string
		exit     int
		wantLine string
	}{
		{"last output among logs", logLine + "\n" + out + "\n" + logLine + "\n", 0, out},
		{"log lines never decode", logLine + "\n" + logLine, 0, ""},
		{"status for a failure code", out + "\n" + `{"code":9,"message":"x"}` + "\n" + logLine, 19, `{"code":9,"message":"x"}`},
		{"an output is not a status", out, 19, ""},
		{"plain text is skipped", "panic: boom\n" + out, 3, out},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line, rest := outputLine([]byte(tt.logs), tt.exit)
			if string(line) != tt.wantLine {
				t.Errorf("line = %q, want %q", line, tt.wantLine)
			}
			if tt.wantLine != "" && strings.Contains(string(rest), tt.wantLine) {
				t.Errorf("rest %q still holds the line", rest)
			}
		})
	}
}

// prefix is netip.MustParsePrefix, for tables.
func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
