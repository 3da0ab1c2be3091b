package k8s_test

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/secbear/neuron/internal/testenv"
)

// TestGatewayComponent renders overlays/prod with components/gateway, as
// its kustomization tells users to, and checks what it promises: hardened
// replicas with probes on /healthz over HTTPS, every variable of its
// ConfigMap a flag of the gateway binary (no token among them), its
// certificate and auth policy mounted read-only, and NetworkPolicies that
// open gateway -> orchestrator:7070 and gateway -> state:7072 and nothing
// else.
func TestGatewayComponent(t *testing.T) {
	tg := target{dir: "overlays/prod", namespace: "neuron", mode: modeProd, components: []string{"components/gateway"}}
	r := render(t, tg)
	d, ok := r.deployments["neuron-gateway"]
	if !ok {
		t.Fatal("no Deployment neuron-gateway")
	}
	pod := d.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the gateway's pod mounts a service account token")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	checkContainerSecurity(t, c)
	checkResources(t, c)
	if c.Image != "neuron/gateway:dev" {
		t.Errorf("image %q", c.Image)
	}
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s probe %+v: want HTTPS GET /healthz", name, p)
		}
	}
	mounted := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounted[m.MountPath] = m.ReadOnly
	}
	if !mounted["/etc/neuron/tls"] || !mounted["/etc/neuron/auth"] {
		t.Errorf("mounts %v: want the certificate and the auth policy read-only", mounted)
	}

	cm := r.configMaps[configMapName(t, c)]
	if cm == nil {
		t.Fatal("no ConfigMap behind the gateway's envFrom")
	}
	bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/gateway/cmd/gateway")
	var out bytes.Buffer
	help := exec.Command(bin, "--help")
	help.Stdout, help.Stderr = &out, &out
	_ = help.Run()
	vars := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  --[a-z0-9-]+  \[([A-Z0-9_]+)\]$`).FindAllStringSubmatch(out.String(), -1) {
		vars[m[1]] = true
	}
	if len(vars) < 10 {
		t.Fatalf("gateway --help listed %d variables:\n%s", len(vars), out.String())
	}
	for k := range cm.Data {
		if !vars[k] {
			t.Errorf("neuron-gateway-config sets %s, which the gateway does not read", k)
		}
		if strings.Contains(k, "TOKEN") {
			t.Errorf("neuron-gateway-config sets %s: tokens go in Secrets", k)
		}
	}
	if cm.Data["NEURON_GATEWAY_DEV"] != "" {
		t.Error("the component turns on dev mode")
	}

	policies := map[string]*networkingv1.NetworkPolicy{}
	for _, doc := range splitYAML(kustomize(t, tg)) {
		if !bytes.Contains(doc, []byte("kind: NetworkPolicy")) {
			continue
		}
		np := &networkingv1.NetworkPolicy{}
		if err := yaml.UnmarshalStrict(doc, np); err != nil {
			t.Fatal(err)
		}
		policies[np.Name] = np
	}
	egress := policies["neuron-gateway"]
	if egress == nil || len(egress.Spec.Egress) != 2 {
		t.Fatalf("neuron-gateway NetworkPolicy: %+v, want two egress rules", egress)
	}
	want := map[string]int32{"orchestrator": 7070, "state": 7072}
	for _, rule := range egress.Spec.Egress {
		name := rule.To[0].PodSelector.MatchLabels["app.kubernetes.io/name"]
		if len(rule.Ports) != 1 || rule.Ports[0].Port.IntVal != want[name] {
			t.Errorf("egress to %s: ports %+v, want only %d", name, rule.Ports, want[name])
		}
		delete(want, name)
	}
	if len(want) != 0 {
		t.Errorf("no egress to %v", want)
	}
	for _, name := range []string{"neuron-gateway-to-orchestrator", "neuron-gateway-to-state"} {
		np := policies[name]
		if np == nil || len(np.Spec.Ingress) != 1 || np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "gateway" {
			t.Errorf("%s: %+v, want ingress from the gateway only", name, np)
		}
	}
}
