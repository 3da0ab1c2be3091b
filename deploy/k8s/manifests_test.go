// Tests of the kustomize base and overlays: each is rendered with kubectl
// kustomize, every object decoded strictly into its k8s.io/api type, and
// the result checked for what the deployment promises (README.md). The
// NetworkPolicies are checked by evaluating them (networkpolicy_test.go).
package k8s_test

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/services/operator/provider/providers"
	"github.com/secbear/neuron/services/orchestrator"
)

const nonRootID = 65532

// The checker itself: a typo in a field, or a kind nobody expects, must
// fail the decode, or every other test here proves less than it claims.
func TestDecodeIsStrict(t *testing.T) {
	tests := []struct {
		name, doc string
		ok        bool
	}{
		{"known kind", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\n", true},
		{"unknown field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\nspec: {replica: 3}\n", false},
		{"unknown nested field", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 1, appProtocl: grpc}]}\n", false},
		{"duplicate field", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\ndata: {k: w}\n", false},
		{"unexpected kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n", false},
		{"wrong version", "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\nmetadata: {name: a}\n", false},
		{"wrong type", "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: a}\nspec: {replicas: one}\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeStrict([]byte(tc.doc))
			if (err == nil) != tc.ok {
				t.Fatalf("decodeStrict: err = %v, want ok = %v", err, tc.ok)
			}
		})
	}
}

func TestSplitYAML(t *testing.T) {
	docs := splitYAML([]byte("a: 1\n---\nb: 2\n---\n\n---\nc: 3\n"))
	if len(docs) != 3 {
		t.Fatalf("got %d documents, want 3: %q", len(docs), docs)
	}
}

// Every object is in the overlay's namespace and labelled part of neuron.
func TestObjectsLabelledAndNamespaced(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name(), func(t *testing.T) {
			r := render(t, tg)
			for _, o := range r.metas {
				if o.meta.Namespace != tg.namespace {
					t.Errorf("%s %s: namespace %q, want %q", o.kind, o.meta.Name, o.meta.Namespace, tg.namespace)
				}
				if got := o.meta.Labels["app.kubernetes.io/part-of"]; got != "neuron" {
					t.Errorf("%s %s: label app.kubernetes.io/part-of = %q, want neuron", o.kind, o.meta.Name, got)
				}
			}
			for _, s := range services {
				w := r.workload(t, s)
				for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/part-of"} {
					if w.pod.Labels[k] == "" {
						t.Errorf("%s: pod template lacks label %s", s.object(), k)
					}
				}
				if w.pod.Labels["app.kubernetes.io/name"] != s.name {
					t.Errorf("%s: pod label app.kubernetes.io/name = %q, want %q", s.object(), w.pod.Labels["app.kubernetes.io/name"], s.name)
				}
			}
		})
	}
}

// Workloads: kind and replicas, security context, probes, resources,
// images, volumes.
func TestWorkloads(t *testing.T) {
	for _, tg := range targets {
		r := render(t, tg)
		for _, s := range services {
			t.Run(tg.name()+"/"+s.name, func(t *testing.T) {
				w := r.workload(t, s)
				if w.kind != tg.kind(s) {
					t.Errorf("kind %s, want %s", w.kind, tg.kind(s))
				}
				if wantReplicas := tg.replicas(s); w.replicas != wantReplicas {
					t.Errorf("replicas %d, want %d", w.replicas, wantReplicas)
				}
				sel, err := metav1.LabelSelectorAsSelector(w.selector)
				if err != nil || sel.Empty() || !sel.Matches(labels.Set(w.pod.Labels)) {
					t.Errorf("selector %v does not select its own pod template (labels %v): %v", w.selector, w.pod.Labels, err)
				}
				checkPodSecurity(t, s, w.pod.Spec)
				c := w.container(t, s)
				checkContainerSecurity(t, c)
				checkImage(t, s, c)
				checkListen(t, s, c)
				checkProbes(t, tg, s, c)
				checkResources(t, c)
				checkVolumes(t, r, w, c)
				checkServiceAccount(t, r, s, w.pod.Spec)
				if w.kind == "StatefulSet" {
					checkClaim(t, w, c)
				}
			})
		}
	}
}

func checkPodSecurity(t *testing.T, s svc, pod corev1.PodSpec) {
	t.Helper()
	sc := pod.SecurityContext
	if sc == nil {
		t.Errorf("%s: no pod securityContext", s.object())
		return
	}
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pod runAsNonRoot is not true")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != nonRootID || sc.RunAsGroup == nil || *sc.RunAsGroup != nonRootID {
		t.Errorf("pod runAsUser/runAsGroup = %v/%v, want %d", sc.RunAsUser, sc.RunAsGroup, nonRootID)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile = %+v, want RuntimeDefault", sc.SeccompProfile)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Errorf("pod shares a host namespace")
	}
	if len(pod.InitContainers) > 0 || len(pod.EphemeralContainers) > 0 {
		t.Errorf("unexpected init or ephemeral containers")
	}
}

func checkContainerSecurity(t *testing.T, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("container %s: no securityContext", c.Name)
		return
	}
	isTrue := func(b *bool) bool { return b != nil && *b }
	if !isTrue(sc.RunAsNonRoot) {
		t.Errorf("container runAsNonRoot is not true")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != nonRootID || sc.RunAsGroup == nil || *sc.RunAsGroup != nonRootID {
		t.Errorf("container runAsUser/runAsGroup = %v/%v, want %d", sc.RunAsUser, sc.RunAsGroup, nonRootID)
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		t.Errorf("container readOnlyRootFilesystem is not true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container allowPrivilegeEscalation is not false")
	}
	if isTrue(sc.Privileged) {
		t.Errorf("container is privileged")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("container capabilities = %+v, want drop [ALL] and no add", sc.Capabilities)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container seccompProfile = %+v, want RuntimeDefault", sc.SeccompProfile)
	}
}

// imageRef splits an image reference into repository and tag.
var imageRef = regexp.MustCompile(`^([a-z0-9./-]+?)(?::([A-Za-z0-9_.-]+))?(?:@sha256:[a-f0-9]{64})?$`)

func checkImage(t *testing.T, s svc, c corev1.Container) {
	t.Helper()
	m := imageRef.FindStringSubmatch(c.Image)
	if m == nil {
		t.Errorf("image %q does not parse", c.Image)
		return
	}
	if m[1] != "neuron/"+s.name {
		t.Errorf("image %q: repository %q, want neuron/%s", c.Image, m[1], s.name)
	}
	if m[2] == "" && !strings.Contains(c.Image, "@") {
		t.Errorf("image %q has neither tag nor digest", c.Image)
	}
	if c.ImagePullPolicy == corev1.PullAlways {
		t.Errorf("imagePullPolicy Always: a pinned tag needs no pull per start")
	}
	if len(c.Command) > 0 {
		t.Errorf("command %q overrides the image's entrypoint", c.Command)
	}
}

// checkListen: the binaries bind 127.0.0.1 by default; the pod must bind
// all interfaces on the service's port, named grpc.
func checkListen(t *testing.T, s svc, c corev1.Container) {
	t.Helper()
	want := "0.0.0.0:" + strconv.Itoa(int(s.port))
	if addr := argValue(c.Args, "--addr"); addr != want {
		t.Errorf("args %q: --addr %q, want %q", c.Args, addr, want)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "grpc" || c.Ports[0].ContainerPort != s.port {
		t.Errorf("ports %+v, want one named grpc on %d", c.Ports, s.port)
	}
}

// checkProbes: native gRPC probes on the service's port, except in prod,
// where the port speaks only mTLS, which the kubelet's gRPC probe cannot:
// there they are TCP probes on the same port.
func checkProbes(t *testing.T, tg target, s svc, c corev1.Container) {
	t.Helper()
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil {
			t.Errorf("no %s probe", name)
			continue
		}
		h := p.ProbeHandler
		handlers := 0
		for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.GRPC != nil} {
			if set {
				handlers++
			}
		}
		if handlers != 1 {
			t.Errorf("%s probe has %d handlers, want 1", name, handlers)
			continue
		}
		if tg.mode == modeProd {
			if h.TCPSocket == nil || h.TCPSocket.Port != intstr.FromInt32(s.port) {
				t.Errorf("%s probe %+v, want tcpSocket on %d (the kubelet's gRPC probe cannot speak mTLS)", name, h, s.port)
			}
			continue
		}
		if h.GRPC == nil || h.GRPC.Port != s.port {
			t.Errorf("%s probe %+v, want grpc on port %d", name, h, s.port)
		}
		if h.GRPC != nil && h.GRPC.Service != nil && *h.GRPC.Service != "" {
			t.Errorf("%s probe asks for service %q; the servers report the overall status under \"\"", name, *h.GRPC.Service)
		}
	}
}

func checkResources(t *testing.T, c corev1.Container) {
	t.Helper()
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okReq := c.Resources.Requests[res]
		lim, okLim := c.Resources.Limits[res]
		if !okReq || !okLim {
			t.Errorf("%s: request %v (%v), limit %v (%v): both must be set", res, req.String(), okReq, lim.String(), okLim)
			continue
		}
		if req.Sign() <= 0 || req.Cmp(lim) > 0 {
			t.Errorf("%s: request %s, limit %s: want 0 < request <= limit", res, req.String(), lim.String())
		}
	}
}

// checkVolumes: /tmp is a bounded emptyDir, every mount names a volume,
// ConfigMap and Secret volumes are mounted read-only and exist (ConfigMaps
// in the rendering; Secrets are named as README.md lists them).
func checkVolumes(t *testing.T, r *rendering, w workload, c corev1.Container) {
	t.Helper()
	m, v, err := w.mountFor(c, "/tmp")
	if err != nil || m.MountPath != "/tmp" || v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil {
		t.Errorf("/tmp: mount %+v, volume %+v (%v): want a size-limited emptyDir at /tmp", m, v, err)
	}
	for _, m := range c.VolumeMounts {
		_, v, err := w.mountFor(c, m.MountPath)
		if err != nil {
			t.Errorf("mount %s: %v", m.Name, err)
			continue
		}
		switch {
		case v.ConfigMap != nil:
			if _, ok := r.configMaps[v.ConfigMap.Name]; !ok {
				t.Errorf("volume %s: ConfigMap %q is not in the rendering", v.Name, v.ConfigMap.Name)
			}
			if !m.ReadOnly {
				t.Errorf("ConfigMap volume %s is mounted writable", v.Name)
			}
		case v.Secret != nil:
			if !m.ReadOnly {
				t.Errorf("Secret volume %s is mounted writable", v.Name)
			}
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
				t.Errorf("Secret volume %s: defaultMode %v is readable by others", v.Name, v.Secret.DefaultMode)
			}
		}
	}
	for _, v := range w.pod.Spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s is a hostPath", v.Name)
		}
	}
}

// checkServiceAccount: every pod has its own ServiceAccount, and only the
// environment service gets a token.
func checkServiceAccount(t *testing.T, r *rendering, s svc, pod corev1.PodSpec) {
	t.Helper()
	if pod.ServiceAccountName != s.object() {
		t.Errorf("serviceAccountName %q, want %q", pod.ServiceAccountName, s.object())
	}
	sa, ok := r.serviceAccounts[pod.ServiceAccountName]
	if !ok {
		t.Errorf("ServiceAccount %q is not in the rendering", pod.ServiceAccountName)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken != s.kubeAPI {
		t.Errorf("pod automountServiceAccountToken = %v, want %v", pod.AutomountServiceAccountToken, s.kubeAPI)
	}
	if ok && (sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken != s.kubeAPI) {
		t.Errorf("ServiceAccount automountServiceAccountToken = %v, want %v", sa.AutomountServiceAccountToken, s.kubeAPI)
	}
}

// checkClaim: a StatefulSet keeps its bbolt file on its own
// ReadWriteOnce volume, mounted where --data-dir points.
func checkClaim(t *testing.T, w workload, c corev1.Container) {
	t.Helper()
	if len(w.claims) != 1 || w.claims[0].Name != "data" {
		t.Fatalf("volumeClaimTemplates %+v, want one named data", w.claims)
	}
	pvc := w.claims[0]
	if !slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) {
		t.Errorf("claim access modes %v, want [ReadWriteOnce]", pvc.Spec.AccessModes)
	}
	if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; !ok || q.Sign() <= 0 {
		t.Errorf("claim requests no storage")
	}
	if w.replicas != 1 {
		t.Errorf("a single-writer StatefulSet with %d replicas", w.replicas)
	}
}

// Configuration: every service gets the variables of its mode, each file
// it names is inside a suitable mount, and each address it calls is a
// rendered Service on the right port.
func TestConfig(t *testing.T) {
	for _, tg := range targets {
		r := render(t, tg)
		for _, s := range services {
			t.Run(tg.name()+"/"+s.name, func(t *testing.T) {
				w := r.workload(t, s)
				c := w.container(t, s)
				cfg, other := r.config(t, s, c)
				checkOtherEnv(t, s, c, other)
				checkMode(t, tg, s, cfg)
				for k, v := range cfg {
					checkFileVar(t, w, c, s, k, v)
					checkAddrVar(t, r, s, k, v)
				}
				if dir, ok := cfg[s.env+"_DATA_DIR"]; ok {
					m, v, err := w.mountFor(c, dir)
					if err != nil || m.ReadOnly || (v.EmptyDir == nil && v.PersistentVolumeClaim == nil) {
						t.Errorf("%s_DATA_DIR %s: mount %+v, volume %+v (%v): want a writable emptyDir or claim", s.env, dir, m, v, err)
					}
					if tg.kind(s) == "StatefulSet" && v.PersistentVolumeClaim == nil {
						t.Errorf("%s_DATA_DIR %s is not on the StatefulSet's claim", s.env, dir)
					}
				} else if tg.kind(s) == "StatefulSet" {
					t.Errorf("%s_DATA_DIR is unset: the bbolt file would land in the read-only root", s.env)
				}
				switch s.name {
				case "operator":
					ws := cfg["NEURON_OPERATOR_WORKSPACE"]
					m, v, err := w.mountFor(c, ws)
					if err != nil || m.ReadOnly || v.EmptyDir == nil {
						t.Errorf("NEURON_OPERATOR_WORKSPACE %q: want a writable emptyDir (%v)", ws, err)
					}
					if tools := cfg["NEURON_OPERATOR_TOOLS"]; strings.Contains(tools, "bash") {
						t.Errorf("NEURON_OPERATOR_TOOLS %q: the image has no shell", tools)
					}
					if addr, ok := cfg["NEURON_OPERATOR_LIFECYCLE_ADDR"]; ok != tg.lifecycle() {
						t.Errorf("NEURON_OPERATOR_LIFECYCLE_ADDR = %q (set: %v), want set only with components/lifecycle-events", addr, ok)
					}
				case "environment":
					if got := cfg["NEURON_ENVIRONMENT_BACKEND"]; got != "kubernetes" {
						t.Errorf("NEURON_ENVIRONMENT_BACKEND = %q, want kubernetes", got)
					}
					op := r.workload(t, services[1]).container(t, services[1])
					if got := cfg["NEURON_ENVIRONMENT_DEFAULT_IMAGE"]; got != op.Image {
						t.Errorf("NEURON_ENVIRONMENT_DEFAULT_IMAGE = %q, want the operator Deployment's image %q", got, op.Image)
					}
					if strings.Contains(cfg["NEURON_ENVIRONMENT_OPERATOR_ARGS"], "bash") || !strings.Contains(cfg["NEURON_ENVIRONMENT_OPERATOR_ARGS"], "--tools") {
						t.Errorf("NEURON_ENVIRONMENT_OPERATOR_ARGS = %q: want --tools without bash (the image has no shell)", cfg["NEURON_ENVIRONMENT_OPERATOR_ARGS"])
					}
					if _, ok := cfg["NEURON_ENVIRONMENT_KUBE_NAMESPACE"]; !ok {
						t.Errorf("NEURON_ENVIRONMENT_KUBE_NAMESPACE is unset")
					}
				}
			})
		}
	}
}

// checkOtherEnv: only the operator has variables outside its prefix: the
// model API keys, each from the Secret neuron-provider-keys, optional.
// They are the first key variable of every provider of providers.All, so
// a provider added there and not to the Deployment fails here.
func checkOtherEnv(t *testing.T, s svc, c corev1.Container, other map[string]string) {
	t.Helper()
	want := map[string]bool{}
	if s.name == "operator" {
		for _, d := range providers.All() {
			if len(d.KeyEnv) > 0 {
				want[d.KeyEnv[0]] = true
			}
		}
	}
	for k := range other {
		if !want[k] {
			t.Errorf("variable %s is not a %s_* flag variable", k, s.env)
		}
	}
	for k := range want {
		if _, ok := other[k]; !ok {
			t.Errorf("variable %s is missing", k)
		}
	}
	for _, e := range c.Env {
		if !want[e.Name] {
			continue
		}
		ref := e.ValueFrom
		if e.Value != "" || ref == nil || ref.SecretKeyRef == nil {
			t.Errorf("%s is not from a Secret", e.Name)
			continue
		}
		sk := ref.SecretKeyRef
		if sk.Name != "neuron-provider-keys" || sk.Key != e.Name || sk.Optional == nil || !*sk.Optional {
			t.Errorf("%s: secretKeyRef %+v, want neuron-provider-keys key %s, optional", e.Name, sk, e.Name)
		}
	}
}

// checkMode: dev turns security off; prod turns mTLS and an auth policy
// on, and gives each client side the CA, certificate, key and token for
// each service it calls; base does neither.
func checkMode(t *testing.T, tg target, s svc, cfg map[string]string) {
	t.Helper()
	dev, _ := strconv.ParseBool(cfg[s.env+"_DEV"])
	if dev != (tg.mode == modeDev) {
		t.Errorf("%s_DEV = %q, want dev mode %v", s.env, cfg[s.env+"_DEV"], tg.mode == modeDev)
	}
	if v, ok := cfg[s.env+"_PLAINTEXT"]; ok {
		t.Errorf("%s_PLAINTEXT = %q: no overlay serves without TLS outside dev", s.env, v)
	}
	server := []string{"_TLS_CERT", "_TLS_KEY", "_TLS_CLIENT_CA", "_AUTH_POLICY"}
	var client []string
	peers := slices.Clone(s.peers)
	for k := range cfg {
		if p, ok := strings.CutSuffix(strings.TrimPrefix(k, s.env+"_"), "_ADDR"); ok && p != "" {
			peers = append(peers, p)
		}
	}
	for _, p := range peers {
		for _, suf := range []string{"_CA", "_CERT", "_KEY", "_TOKEN_FILE"} {
			client = append(client, "_"+p+suf)
		}
	}
	for _, suf := range append(server, client...) {
		_, ok := cfg[s.env+suf]
		if want := tg.mode == modeProd; ok != want {
			t.Errorf("%s%s set: %v, want %v in %s", s.env, suf, ok, want, tg.mode)
		}
	}
}

// fileSecret is the Secret that must hold each kind of file a service
// names, by variable suffix.
func fileSecret(s svc, key string) (secret string, isFile bool) {
	switch {
	case strings.HasSuffix(key, "_TOKEN_FILE"):
		return s.object() + "-tokens", true
	case strings.HasSuffix(key, "_AUTH_POLICY"):
		return s.object() + "-auth", true
	case strings.HasSuffix(key, "_CA"), strings.HasSuffix(key, "_CERT"), strings.HasSuffix(key, "_KEY"):
		return s.object() + "-tls", true
	case strings.HasSuffix(key, "_AGENTS"):
		return "", true
	}
	return "", false
}

func checkFileVar(t *testing.T, w workload, c corev1.Container, s svc, k, v string) {
	t.Helper()
	secret, isFile := fileSecret(s, k)
	if !isFile {
		return
	}
	if !path.IsAbs(v) {
		t.Errorf("%s = %q: want an absolute path", k, v)
		return
	}
	m, vol, err := w.mountFor(c, v)
	if err != nil {
		t.Errorf("%s = %s: %v", k, v, err)
		return
	}
	if !m.ReadOnly {
		t.Errorf("%s = %s: mount %s is writable", k, v, m.Name)
	}
	if secret == "" {
		return
	}
	if vol.Secret == nil || vol.Secret.SecretName != secret {
		t.Errorf("%s = %s: volume %+v, want the Secret %s", k, v, vol.VolumeSource, secret)
		return
	}
	if vol.Secret.Optional != nil && *vol.Secret.Optional {
		t.Errorf("%s = %s: Secret %s is optional; the service must not start without it", k, v, secret)
	}
}

// checkAddrVar: an address a service calls names a rendered Service, on
// that Service's gRPC port.
func checkAddrVar(t *testing.T, r *rendering, s svc, k, v string) {
	t.Helper()
	if k == s.env+"_ADDR" || !strings.HasSuffix(k, "_ADDR") {
		return
	}
	if err := r.resolves(v); err != nil {
		t.Errorf("%s = %q: %v", k, v, err)
	}
}

// resolves reports whether addr is host:port of a rendered Service's grpc
// port, host being the Service name (resolved in the caller's namespace).
func (r *rendering) resolves(addr string) error {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(addr, "dns:///"))
	if err != nil {
		return err
	}
	name, _, _ := strings.Cut(host, ".")
	sv, ok := r.services[name]
	if !ok {
		return fmt.Errorf("no Service %q in the rendering", name)
	}
	if host != name && host != name+"."+r.namespace+".svc" && host != name+"."+r.namespace+".svc.cluster.local" {
		return fmt.Errorf("host %q is not Service %s of namespace %s", host, name, r.namespace)
	}
	for _, p := range sv.Spec.Ports {
		if strconv.Itoa(int(p.Port)) == port && p.Name == "grpc" {
			return nil
		}
	}
	return fmt.Errorf("Service %s has no grpc port %s", name, port)
}

// The orchestrator's agent registry parses with the orchestrator's own
// parser, is mounted where --agents points, and every agent's address is
// a rendered Service.
func TestAgentRegistry(t *testing.T) {
	orch := services[0]
	for _, tg := range targets {
		t.Run(tg.name(), func(t *testing.T) {
			r := render(t, tg)
			w := r.workload(t, orch)
			c := w.container(t, orch)
			cfg, _ := r.config(t, orch, c)
			file := cfg["NEURON_ORCHESTRATOR_AGENTS"]
			m, v, err := w.mountFor(c, file)
			if err != nil || v.ConfigMap == nil {
				t.Fatalf("NEURON_ORCHESTRATOR_AGENTS %q: mount %+v, volume %+v (%v): want a ConfigMap volume", file, m, v, err)
			}
			cm := r.configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Fatalf("ConfigMap %s is not in the rendering", v.ConfigMap.Name)
			}
			key := strings.TrimPrefix(strings.TrimPrefix(file, m.MountPath), "/")
			data, ok := cm.Data[key]
			if !ok {
				t.Fatalf("ConfigMap %s has no key %q (keys: %v)", cm.Name, key, keys(cm.Data))
			}
			reg, err := orchestrator.ParseRegistry([]byte(data))
			if err != nil {
				t.Fatalf("ParseRegistry: %v", err)
			}
			agents := reg.Agents()
			if len(agents) == 0 {
				t.Fatal("the registry has no agents")
			}
			var onOperator, onEnvironment int
			for _, a := range agents {
				addr, want := a.Operator, "neuron-operator"
				if a.Environment != "" {
					addr, want = a.Environment, "neuron-environment"
					onEnvironment++
				} else {
					onOperator++
				}
				if err := r.resolves(addr); err != nil {
					t.Errorf("agent %s: address %q: %v", a.ID, addr, err)
				}
				if name, _, _ := strings.Cut(addr, ":"); name != want {
					t.Errorf("agent %s: address %q, want the Service %s", a.ID, addr, want)
				}
			}
			if onOperator == 0 || onEnvironment == 0 {
				t.Errorf("agents on the operator: %d, in an environment: %d; want both paths exercised", onOperator, onEnvironment)
			}
		})
	}
}

// Services: ClusterIP, one port named grpc (appProtocol grpc) reaching the
// container's port, selecting exactly the service's own pods.
func TestServices(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name(), func(t *testing.T) {
			r := render(t, tg)
			if len(r.services) != len(services) {
				t.Errorf("%d Services, want %d", len(r.services), len(services))
			}
			for _, s := range services {
				sv, ok := r.services[s.object()]
				if !ok {
					t.Errorf("no Service %s", s.object())
					continue
				}
				if sv.Spec.Type != corev1.ServiceTypeClusterIP {
					t.Errorf("%s: type %q, want ClusterIP", sv.Name, sv.Spec.Type)
				}
				if len(sv.Spec.Ports) != 1 {
					t.Fatalf("%s: %d ports, want 1", sv.Name, len(sv.Spec.Ports))
				}
				p := sv.Spec.Ports[0]
				if p.Name != "grpc" || p.Port != s.port || p.AppProtocol == nil || *p.AppProtocol != "grpc" {
					t.Errorf("%s: port %+v, want grpc on %d with appProtocol grpc", sv.Name, p, s.port)
				}
				if p.TargetPort != intstr.FromString("grpc") && p.TargetPort != intstr.FromInt32(s.port) {
					t.Errorf("%s: targetPort %v reaches no container port", sv.Name, p.TargetPort)
				}
				sel := labels.SelectorFromSet(sv.Spec.Selector)
				if len(sv.Spec.Selector) == 0 {
					t.Errorf("%s: no selector", sv.Name)
					continue
				}
				for _, o := range services {
					got := sel.Matches(labels.Set(r.workload(t, o).pod.Labels))
					if got != (o.name == s.name) {
						t.Errorf("Service %s selects the %s pods: %v", sv.Name, o.name, got)
					}
				}
				if sel.Matches(labels.Set(invocationPodLabels)) {
					t.Errorf("Service %s selects invocation pods", sv.Name)
				}
			}
		})
	}
}

// The environment service's RBAC: exactly the verbs its kubernetes
// backend calls, in its namespace, for its ServiceAccount only.
func TestEnvironmentRBAC(t *testing.T) {
	want := map[string][]string{
		"batch/jobs":                        {"create", "delete", "get", "watch"},
		"/secrets":                          {"create", "delete", "patch"},
		"networking.k8s.io/networkpolicies": {"create", "delete", "patch"},
		"/pods":                             {"list"},
		"/pods/log":                         {"get"},
		// The workspaces that last: one claim each, kept across runs.
		"/persistentvolumeclaims": {"create", "delete", "get", "list", "patch"},
	}
	for _, tg := range targets {
		t.Run(tg.name(), func(t *testing.T) {
			r := render(t, tg)
			if len(r.roles) != 1 || len(r.roleBindings) != 1 {
				t.Fatalf("%d Roles and %d RoleBindings, want 1 each", len(r.roles), len(r.roleBindings))
			}
			role := r.roles["neuron-environment"]
			if role == nil {
				t.Fatal("no Role neuron-environment")
			}
			got := map[string][]string{}
			for _, rule := range role.Rules {
				if len(rule.ResourceNames) > 0 || len(rule.NonResourceURLs) > 0 {
					t.Errorf("rule %+v: unexpected resourceNames or nonResourceURLs", rule)
				}
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						got[g+"/"+res] = append(got[g+"/"+res], rule.Verbs...)
					}
				}
			}
			for k := range got {
				sort.Strings(got[k])
				if slices.Contains(got[k], "*") || strings.Contains(k, "*") {
					t.Errorf("wildcard in %s: %v", k, got[k])
				}
			}
			if !mapsEqual(got, want) {
				t.Errorf("Role rules\n got %v\nwant %v", got, want)
			}
			rb := r.roleBindings["neuron-environment"]
			if rb == nil {
				t.Fatal("no RoleBinding neuron-environment")
			}
			wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "neuron-environment"}
			if rb.RoleRef != wantRef {
				t.Errorf("roleRef %+v, want %+v", rb.RoleRef, wantRef)
			}
			wantSubj := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "neuron-environment", Namespace: tg.namespace}}
			if !slices.Equal(rb.Subjects, wantSubj) {
				t.Errorf("subjects %+v, want %+v", rb.Subjects, wantSubj)
			}
		})
	}
}

// Availability: in prod the stateless services (and in scale state and
// the orchestrator too) have a PodDisruptionBudget and spread over nodes;
// the single writers have neither a second replica nor a PDB that could
// block a drain forever.
func TestAvailability(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name(), func(t *testing.T) {
			r := render(t, tg)
			wantPDBs := 0
			for _, s := range services {
				if tg.replicated(s) {
					wantPDBs++
				}
			}
			if len(r.pdbs) != wantPDBs {
				t.Errorf("%d PodDisruptionBudgets, want %d", len(r.pdbs), wantPDBs)
			}
			for _, s := range services {
				w := r.workload(t, s)
				podLabels := labels.Set(w.pod.Labels)
				var covering []string
				for _, pdb := range r.pdbs {
					sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
					if err != nil {
						t.Fatal(err)
					}
					if sel.Empty() || !sel.Matches(podLabels) {
						continue
					}
					covering = append(covering, pdb.Name)
					mu := pdb.Spec.MaxUnavailable
					if mu == nil || pdb.Spec.MinAvailable != nil || mu.IntValue() < 1 || mu.IntValue() >= int(w.replicas) {
						t.Errorf("PDB %s: maxUnavailable %v minAvailable %v; want 1 <= maxUnavailable < %d replicas", pdb.Name, mu, pdb.Spec.MinAvailable, w.replicas)
					}
				}
				wantCovered := tg.replicated(s)
				if (len(covering) == 1) != wantCovered || len(covering) > 1 {
					t.Errorf("%s: covered by PDBs %v, want one: %v", s.name, covering, wantCovered)
				}
				spread := false
				for _, c := range w.pod.Spec.TopologySpreadConstraints {
					sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
					if err != nil {
						t.Fatal(err)
					}
					if c.TopologyKey == "kubernetes.io/hostname" && c.WhenUnsatisfiable == corev1.DoNotSchedule && c.MaxSkew == 1 && sel.Matches(podLabels) && !sel.Empty() {
						spread = true
					}
				}
				if spread != wantCovered {
					t.Errorf("%s: spread over nodes: %v, want %v", s.name, spread, wantCovered)
				}
			}
		})
	}
}

// overlays/scale: state is a Deployment of three replicas on PostgreSQL,
// reading its DSN from a file of the Secret neuron-postgres (key dsn) and
// from nowhere else; the orchestrator is a Deployment of two replicas on
// Temporal; no StatefulSet and no volume claim is left.
func TestScale(t *testing.T) {
	i := slices.IndexFunc(targets, func(tg target) bool { return tg.scale })
	if i < 0 {
		t.Fatal("no scale target")
	}
	r := render(t, targets[i])
	if len(r.statefulSets) != 0 {
		t.Errorf("StatefulSets %v are left; want none", keys(r.statefulSets))
	}
	orch, st := services[0], services[2]

	t.Run("state", func(t *testing.T) {
		w := r.workload(t, st)
		if w.kind != "Deployment" || w.replicas != 3 {
			t.Errorf("%s %s with %d replicas; want a Deployment with 3", w.kind, st.object(), w.replicas)
		}
		c := w.container(t, st)
		if got := argValue(c.Args, "--backend"); got != "postgres" {
			t.Errorf("args %q: --backend %q, want postgres", c.Args, got)
		}
		if got := argValue(c.Args, "--postgres-dsn"); got != "" {
			t.Errorf("args %q: --postgres-dsn puts the DSN in argv; want --postgres-dsn-file only", c.Args)
		}
		file := argValue(c.Args, "--postgres-dsn-file")
		if file != "/var/run/secrets/neuron/postgres/dsn" {
			t.Errorf("args %q: --postgres-dsn-file %q, want /var/run/secrets/neuron/postgres/dsn", c.Args, file)
		}
		m, v, err := w.mountFor(c, file)
		if err != nil {
			t.Fatalf("--postgres-dsn-file %s: %v", file, err)
		}
		if !m.ReadOnly || v.Secret == nil || v.Secret.SecretName != "neuron-postgres" {
			t.Fatalf("--postgres-dsn-file %s: mount %+v, volume %+v; want the Secret neuron-postgres, read-only", file, m, v.VolumeSource)
		}
		if v.Secret.Optional != nil && *v.Secret.Optional {
			t.Errorf("Secret neuron-postgres is optional; the service must not start without it")
		}
		// The file's name in the mount is the Secret key, unless items
		// map a key to another path.
		rel := strings.TrimPrefix(strings.TrimPrefix(file, m.MountPath), "/")
		key := rel
		if items := v.Secret.Items; len(items) > 0 {
			key = ""
			for _, it := range items {
				if it.Path == rel {
					key = it.Key
				}
			}
		}
		if key != "dsn" {
			t.Errorf("--postgres-dsn-file %s is key %q of Secret neuron-postgres (items %+v); want key dsn", file, key, v.Secret.Items)
		}
		cfg, _ := r.config(t, st, c)
		for _, k := range []string{"NEURON_STATE_POSTGRES_DSN", "NEURON_STATE_POSTGRES_DSN_FILE", "NEURON_STATE_BACKEND", "NEURON_STATE_DATA_DIR", "NEURON_STATE_LOCK_TIMEOUT"} {
			if val, ok := cfg[k]; ok {
				t.Errorf("%s = %q: want unset (the DSN only in the Secret, the backend in args, no bbolt settings)", k, val)
			}
		}
		checkNoClaims(t, w)
	})

	t.Run("orchestrator", func(t *testing.T) {
		w := r.workload(t, orch)
		if w.kind != "Deployment" || w.replicas != 2 {
			t.Errorf("%s %s with %d replicas; want a Deployment with 2", w.kind, orch.object(), w.replicas)
		}
		c := w.container(t, orch)
		want := map[string]string{
			"--backend":             "temporal",
			"--temporal-address":    "temporal-frontend.temporal.svc:7233",
			"--temporal-namespace":  "neuron",
			"--temporal-task-queue": "neuron",
		}
		for flag, val := range want {
			if got := argValue(c.Args, flag); got != val {
				t.Errorf("args %q: %s %q, want %q", c.Args, flag, got, val)
			}
		}
		cfg, _ := r.config(t, orch, c)
		for _, k := range []string{"NEURON_ORCHESTRATOR_BACKEND", "NEURON_ORCHESTRATOR_DATA_DIR", "NEURON_ORCHESTRATOR_LOCK_TIMEOUT"} {
			if val, ok := cfg[k]; ok {
				t.Errorf("%s = %q: want unset (the backend in args, no bbolt settings)", k, val)
			}
		}
		checkNoClaims(t, w)
	})
}

// checkNoClaims: the workload keeps nothing on a persistent volume.
func checkNoClaims(t *testing.T, w workload) {
	t.Helper()
	if len(w.claims) > 0 {
		t.Errorf("volumeClaimTemplates %+v; want none", w.claims)
	}
	for _, v := range w.pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			t.Errorf("volume %s is a PersistentVolumeClaim; want none", v.Name)
		}
	}
}

// Dev is smaller than base, and prod larger, per service.
func TestOverlaySizes(t *testing.T) {
	byMode := map[mode]*rendering{}
	for _, tg := range targets[:3] {
		byMode[tg.mode] = render(t, tg)
	}
	for _, s := range services {
		q := func(m mode, limit bool, res corev1.ResourceName) resource.Quantity {
			r := byMode[m]
			c := r.workload(t, s).container(t, s)
			if limit {
				return c.Resources.Limits[res]
			}
			return c.Resources.Requests[res]
		}
		for _, limit := range []bool{false, true} {
			for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				dev, base, prod := q(modeDev, limit, res), q(modeBase, limit, res), q(modeProd, limit, res)
				if !(dev.Cmp(base) <= 0 && base.Cmp(prod) <= 0 && dev.Cmp(prod) < 0) {
					t.Errorf("%s %s (limit %v): dev %s, base %s, prod %s; want dev <= base <= prod, dev < prod", s.name, res, limit, dev.String(), base.String(), prod.String())
				}
			}
		}
	}
}

// Every NEURON_* variable the manifests set is one the service's binary
// reads: a misspelt variable is silently ignored at run time, so it is
// caught here by building each binary and reading its --help.
func TestConfigNamesAreFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the four service binaries")
	}
	helpLine := regexp.MustCompile(`^  (--[a-z0-9-]+)  \[([A-Z0-9_]+)\]$`)
	known := map[string]map[string]bool{}      // service -> its variables
	knownFlags := map[string]map[string]bool{} // service -> its flags (--name)
	for _, s := range services {
		bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/"+s.name+"/cmd/"+s.name)
		help := exec.Command(bin, "--help")
		var out bytes.Buffer
		help.Stdout, help.Stderr = &out, &out
		_ = help.Run() // --help exits 0 or 2 depending on the flag package
		known[s.name], knownFlags[s.name] = map[string]bool{}, map[string]bool{}
		for _, line := range strings.Split(out.String(), "\n") {
			if m := helpLine.FindStringSubmatch(line); m != nil {
				knownFlags[s.name][m[1]] = true
				known[s.name][m[2]] = true
			}
		}
		if len(known[s.name]) < 5 {
			t.Fatalf("%s --help listed %d variables; the format changed?\n%s", s.name, len(known[s.name]), out.String())
		}
	}
	for _, tg := range targets {
		r := render(t, tg)
		for _, s := range services {
			flags, ok := known[s.name]
			if !ok {
				continue
			}
			w := r.workload(t, s)
			cfg, _ := r.config(t, s, w.container(t, s))
			for k := range cfg {
				if !flags[k] {
					t.Errorf("%s: %s sets %s, which %s does not read", tg.name(), s.object(), k, s.name)
				}
			}
			if !flags[s.env+"_ADDR"] {
				t.Errorf("%s has no --addr", s.name)
			}
			// Args: every --flag is one the binary has.
			for _, a := range w.container(t, s).Args {
				name, _, _ := strings.Cut(a, "=")
				if strings.HasPrefix(name, "--") && !knownFlags[s.name][name] {
					t.Errorf("%s: %s passes %s, which %s does not have", tg.name(), s.object(), name, s.name)
				}
			}
		}
	}
}

// TestServerDryRun sends each rendering to a real kube-apiserver with
// kubectl apply --dry-run=server: the API server's own validation and
// defaulting of every object, and its Pod Security admission at the
// restricted level, without a kubelet. A warning fails the test.
func TestServerDryRun(t *testing.T) {
	bin := kubectl(t)
	kube := testenv.KubeAPIServer(t)
	created := map[string]bool{}
	for _, tg := range targets {
		t.Run(tg.name(), func(t *testing.T) {
			if !created[tg.namespace] {
				out, err := exec.Command(bin, "--kubeconfig", kube.Kubeconfig, "create", "namespace", tg.namespace).CombinedOutput()
				if err != nil {
					t.Fatalf("kubectl create namespace %s: %v\n%s", tg.namespace, err, out)
				}
				// The restricted Pod Security Standard, as README.md
				// advises: the API server warns about any pod template
				// that falls short.
				out, err = exec.Command(bin, "--kubeconfig", kube.Kubeconfig, "label", "namespace", tg.namespace,
					"pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/warn=restricted").CombinedOutput()
				if err != nil {
					t.Fatalf("kubectl label namespace %s: %v\n%s", tg.namespace, err, out)
				}
				created[tg.namespace] = true
			}
			rendered := kustomize(t, tg)
			cmd := exec.Command(bin, "--kubeconfig", kube.Kubeconfig, "apply", "--dry-run=server", "-o", "name", "-f", "-")
			cmd.Stdin = bytes.NewReader(rendered)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("kubectl apply --dry-run=server: %v\n%s%s", err, stdout.String(), stderr.String())
			}
			names := strings.Fields(stdout.String())
			if want := len(splitYAML(rendered)); len(names) != want {
				t.Errorf("the server accepted %d objects, want %d:\n%s", len(names), want, stdout.String())
			}
			if stderr.Len() > 0 {
				t.Errorf("the server warned (a Pod Security violation, a deprecated field...):\n%s", stderr.String())
			}
		})
	}
}

// helpers

// argValue is the value of flag (--name) in args, given as "--name v" or
// "--name=v"; the last one wins, as in the flag package; "" when absent.
func argValue(args []string, flag string) string {
	v := ""
	for i, a := range args {
		switch {
		case a == flag && i+1 < len(args):
			v = args[i+1]
		case strings.HasPrefix(a, flag+"="):
			v = strings.TrimPrefix(a, flag+"=")
		}
	}
	return v
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func mapsEqual(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
