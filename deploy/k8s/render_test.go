package k8s_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// mode is what a rendering is for; the assertions differ per mode.
type mode int

const (
	modeBase mode = iota // base alone: neither dev nor TLS
	modeDev              // --dev everywhere
	modeProd             // mTLS, tokens, HA
)

func (m mode) String() string {
	return [...]string{"base", "dev", "prod"}[m]
}

// target is one kustomization to render.
type target struct {
	// dir is relative to deploy/k8s.
	dir       string
	namespace string
	mode      mode
	// components are added to dir by a kustomization written in a temp
	// dir (relative to deploy/k8s), as a user's own overlay would.
	components []string
	// scale: state on PostgreSQL and the orchestrator on Temporal, each a
	// replicated Deployment (overlays/scale); the rest as in mode.
	scale bool
}

func (tg target) name() string {
	if len(tg.components) == 0 {
		return tg.dir
	}
	return tg.dir + "+" + strings.Join(tg.components, "+")
}

// lifecycle reports whether the operator -> orchestrator lifecycle path
// is part of the rendering.
func (tg target) lifecycle() bool {
	for _, c := range tg.components {
		if c == "components/lifecycle-events" {
			return true
		}
	}
	return false
}

// scaled reports whether s runs replicated on shared storage in tg
// (overlays/scale): a Deployment of s.scaleReplicas.
func (tg target) scaled(s svc) bool { return tg.scale && s.scaleReplicas > 0 }

// kind is the workload kind of s in tg.
func (tg target) kind(s svc) string {
	if tg.scaled(s) {
		return "Deployment"
	}
	return s.kind
}

// replicas is the number of replicas of s in tg.
func (tg target) replicas(s svc) int32 {
	switch {
	case tg.scaled(s):
		return s.scaleReplicas
	case s.stateless && tg.mode == modeProd:
		return 3
	}
	return 1
}

// replicated reports whether s has more than one replica in tg, and so a
// PodDisruptionBudget and a spread over nodes.
func (tg target) replicated(s svc) bool { return tg.replicas(s) > 1 }

// targets are the renderings every test checks.
var targets = []target{
	{dir: "base", namespace: "neuron", mode: modeBase},
	{dir: "overlays/dev", namespace: "neuron-dev", mode: modeDev},
	{dir: "overlays/prod", namespace: "neuron", mode: modeProd},
	{dir: "overlays/dev", namespace: "neuron-dev", mode: modeDev, components: []string{"components/lifecycle-events"}},
	{dir: "overlays/prod", namespace: "neuron", mode: modeProd, components: []string{"components/lifecycle-events"}},
	{dir: "overlays/scale", namespace: "neuron", mode: modeProd, scale: true},
}

// svc describes one neuron service as every rendering must deploy it.
type svc struct {
	name string // orchestrator
	port int32
	// kind is the workload kind: StatefulSet for the bbolt single writers.
	kind string
	// scaleReplicas is the number of replicas of a single writer whose
	// data overlays/scale moves off the pod (state to PostgreSQL, the
	// orchestrator to Temporal); 0 for the others.
	scaleReplicas int32
	// stateless services scale to three replicas in prod.
	stateless bool
	// env is the prefix of the service's flag variables.
	env string
	// kubeAPI: the only service with a service-account token.
	kubeAPI bool
	// peers are the services it calls whose TLS flags carry this prefix
	// (after env), beside those named by *_ADDR keys.
	peers []string
}

var services = []svc{
	{name: "orchestrator", port: 7070, kind: "StatefulSet", scaleReplicas: 2, env: "NEURON_ORCHESTRATOR", peers: []string{"OPERATOR", "ENVIRONMENT"}},
	{name: "operator", port: 7071, kind: "Deployment", stateless: true, env: "NEURON_OPERATOR"},
	{name: "state", port: 7072, kind: "StatefulSet", scaleReplicas: 3, env: "NEURON_STATE"},
	{name: "environment", port: 7073, kind: "Deployment", stateless: true, env: "NEURON_ENVIRONMENT", kubeAPI: true},
}

func (s svc) object() string { return "neuron-" + s.name }

// rendering is the decoded output of one kubectl kustomize run.
type rendering struct {
	target
	deployments     map[string]*appsv1.Deployment
	statefulSets    map[string]*appsv1.StatefulSet
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	serviceAccounts map[string]*corev1.ServiceAccount
	roles           map[string]*rbacv1.Role
	roleBindings    map[string]*rbacv1.RoleBinding
	pdbs            map[string]*policyv1.PodDisruptionBudget
	policies        []*networkingv1.NetworkPolicy
	// metas holds every object's kind and metadata, in output order.
	metas []objectMeta
}

type objectMeta struct {
	kind string
	meta metav1.ObjectMeta
}

// kubectl returns the kubectl binary, skipping the test without one.
func kubectl(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not on PATH: it renders the kustomizations (kubectl kustomize) and runs the server dry run")
	}
	return p
}

// kustomize renders tg with kubectl kustomize and returns the YAML.
func kustomize(t *testing.T, tg target) []byte {
	t.Helper()
	bin := kubectl(t)
	dir, err := filepath.Abs(tg.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(tg.components) > 0 {
		dir = overlayWith(t, tg)
	}
	cmd := exec.Command(bin, "kustomize", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", tg.name(), err, stderr.String())
	}
	return out
}

// overlayWith writes a kustomization in a temp dir that takes tg.dir as
// its resource and adds tg.components, as components/*/kustomization.yaml
// tells users to. Kustomize refuses absolute paths,
// so they are relative to the temp dir.
func overlayWith(t *testing.T, tg target) string {
	t.Helper()
	tmp := t.TempDir()
	rel := func(p string) string {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := filepath.Rel(tmp, abs)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: %s\nresources:\n  - %s\ncomponents:\n", tg.namespace, rel(tg.dir))
	for _, c := range tg.components {
		fmt.Fprintf(&b, "  - %s\n", rel(c))
	}
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return tmp
}

// render renders and strictly decodes tg.
func render(t *testing.T, tg target) *rendering {
	t.Helper()
	out := kustomize(t, tg)
	r := &rendering{
		target:          tg,
		deployments:     map[string]*appsv1.Deployment{},
		statefulSets:    map[string]*appsv1.StatefulSet{},
		services:        map[string]*corev1.Service{},
		configMaps:      map[string]*corev1.ConfigMap{},
		serviceAccounts: map[string]*corev1.ServiceAccount{},
		roles:           map[string]*rbacv1.Role{},
		roleBindings:    map[string]*rbacv1.RoleBinding{},
		pdbs:            map[string]*policyv1.PodDisruptionBudget{},
	}
	docs := splitYAML(out)
	if len(docs) == 0 {
		t.Fatalf("%s rendered no objects", tg.name())
	}
	for i, doc := range docs {
		obj, err := decodeStrict(doc)
		if err != nil {
			t.Fatalf("%s, document %d: %v\n%s", tg.name(), i, err, doc)
		}
		if err := r.add(obj); err != nil {
			t.Fatalf("%s, document %d: %v", tg.name(), i, err)
		}
	}
	return r
}

// splitYAML splits a multi-document stream at its "---" lines, dropping
// empty documents.
func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), b...), []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

// decodeStrict decodes one document into the k8s.io/api type of its
// apiVersion and kind, rejecting unknown and duplicate fields. A kind the
// deployment is not expected to hold is an error.
func decodeStrict(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, fmt.Errorf("not a Kubernetes object: %v", err)
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "apps/v1 StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1 ServiceAccount":
		obj = &corev1.ServiceAccount{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "rbac.authorization.k8s.io/v1 Role":
		obj = &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		obj = &rbacv1.RoleBinding{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	default:
		return nil, fmt.Errorf("unexpected kind %q (apiVersion %q)", tm.Kind, tm.APIVersion)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: strict decode: %v", tm.Kind, err)
	}
	return obj, nil
}

// add indexes obj by name, rejecting duplicates.
func (r *rendering) add(obj any) error {
	var (
		kind string
		meta metav1.ObjectMeta
		dup  bool
	)
	switch o := obj.(type) {
	case *appsv1.Deployment:
		kind, meta = "Deployment", o.ObjectMeta
		_, dup = r.deployments[o.Name]
		r.deployments[o.Name] = o
	case *appsv1.StatefulSet:
		kind, meta = "StatefulSet", o.ObjectMeta
		_, dup = r.statefulSets[o.Name]
		r.statefulSets[o.Name] = o
	case *corev1.Service:
		kind, meta = "Service", o.ObjectMeta
		_, dup = r.services[o.Name]
		r.services[o.Name] = o
	case *corev1.ConfigMap:
		kind, meta = "ConfigMap", o.ObjectMeta
		_, dup = r.configMaps[o.Name]
		r.configMaps[o.Name] = o
	case *corev1.ServiceAccount:
		kind, meta = "ServiceAccount", o.ObjectMeta
		_, dup = r.serviceAccounts[o.Name]
		r.serviceAccounts[o.Name] = o
	case *rbacv1.Role:
		kind, meta = "Role", o.ObjectMeta
		_, dup = r.roles[o.Name]
		r.roles[o.Name] = o
	case *rbacv1.RoleBinding:
		kind, meta = "RoleBinding", o.ObjectMeta
		_, dup = r.roleBindings[o.Name]
		r.roleBindings[o.Name] = o
	case *policyv1.PodDisruptionBudget:
		kind, meta = "PodDisruptionBudget", o.ObjectMeta
		_, dup = r.pdbs[o.Name]
		r.pdbs[o.Name] = o
	case *networkingv1.NetworkPolicy:
		kind, meta = "NetworkPolicy", o.ObjectMeta
		for _, p := range r.policies {
			dup = dup || p.Name == o.Name
		}
		r.policies = append(r.policies, o)
	default:
		return fmt.Errorf("unhandled type %T", obj)
	}
	if dup {
		return fmt.Errorf("%s %s appears twice", kind, meta.Name)
	}
	r.metas = append(r.metas, objectMeta{kind: kind, meta: meta})
	return nil
}

// workload is the part of a Deployment or StatefulSet the checks need.
type workload struct {
	kind     string
	replicas int32
	selector *metav1.LabelSelector
	pod      corev1.PodTemplateSpec
	claims   []corev1.PersistentVolumeClaim
}

// workload returns the workload of s, failing the test when it is absent.
func (r *rendering) workload(t *testing.T, s svc) workload {
	t.Helper()
	name := s.object()
	d, isDeploy := r.deployments[name]
	ss, isSet := r.statefulSets[name]
	replicas := func(p *int32) int32 {
		if p == nil {
			return 1 // the API's default
		}
		return *p
	}
	switch {
	case isDeploy && isSet:
		t.Fatalf("%s is both a Deployment and a StatefulSet", name)
	case isDeploy:
		return workload{kind: "Deployment", replicas: replicas(d.Spec.Replicas), selector: d.Spec.Selector, pod: d.Spec.Template}
	case isSet:
		return workload{kind: "StatefulSet", replicas: replicas(ss.Spec.Replicas), selector: ss.Spec.Selector, pod: ss.Spec.Template, claims: ss.Spec.VolumeClaimTemplates}
	}
	t.Fatalf("%s: no Deployment or StatefulSet %s", r.name(), name)
	return workload{}
}

// container returns the pod's one container, named after the service.
func (w workload) container(t *testing.T, s svc) corev1.Container {
	t.Helper()
	if n := len(w.pod.Spec.Containers); n != 1 {
		t.Fatalf("%s: %d containers, want 1", s.object(), n)
	}
	c := w.pod.Spec.Containers[0]
	if c.Name != s.name {
		t.Fatalf("%s: container %q, want %q", s.object(), c.Name, s.name)
	}
	return c
}

// config returns the service's flag variables as the container sees them:
// its ConfigMaps' data, then its literal env (valueFrom entries map to
// "<from field>"). Variables not of the service's own prefix are returned
// apart.
func (r *rendering) config(t *testing.T, s svc, c corev1.Container) (own, other map[string]string) {
	t.Helper()
	own, other = map[string]string{}, map[string]string{}
	put := func(k, v string) {
		if strings.HasPrefix(k, s.env+"_") {
			own[k] = v
		} else {
			other[k] = v
		}
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			t.Fatalf("%s: envFrom other than a ConfigMap: %+v", s.object(), ef)
		}
		cm, ok := r.configMaps[ef.ConfigMapRef.Name]
		if !ok {
			t.Fatalf("%s: envFrom names ConfigMap %q, which the rendering lacks", s.object(), ef.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			put(k, v)
		}
	}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			v = "<from field>"
		}
		put(e.Name, v)
	}
	return own, other
}

// mountFor returns the volume mount of c whose directory holds path, and
// the volume behind it (a StatefulSet's claim template appears as a
// persistentVolumeClaim volume).
func (w workload) mountFor(c corev1.Container, path string) (corev1.VolumeMount, corev1.Volume, error) {
	var best corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		dir := strings.TrimSuffix(m.MountPath, "/") + "/"
		if (path == m.MountPath || strings.HasPrefix(path, dir)) && len(m.MountPath) > len(best.MountPath) {
			best = m
		}
	}
	if best.Name == "" {
		return best, corev1.Volume{}, fmt.Errorf("no volume is mounted at or above %s", path)
	}
	for _, v := range w.pod.Spec.Volumes {
		if v.Name == best.Name {
			return best, v, nil
		}
	}
	for _, pvc := range w.claims {
		if pvc.Name == best.Name {
			return best, corev1.Volume{Name: pvc.Name, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name},
			}}, nil
		}
	}
	return best, corev1.Volume{}, errors.New("mount " + best.Name + " names no volume")
}
