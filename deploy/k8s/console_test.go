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

// TestConsoleComponent renders overlays/prod with components/console, as
// its kustomization tells users to, and checks what it promises: one
// hardened replica with probes on /healthz over HTTPS, every variable of
// its ConfigMap a flag of the console binary, its certificate mounted
// read-only, and NetworkPolicies that open console -> orchestrator:7070
// and console -> state:7072 and nothing else.
func TestConsoleComponent(t *testing.T) {
	tg := target{dir: "overlays/prod", namespace: "neuron", mode: modeProd, components: []string{"components/console"}}
	r := render(t, tg)
	d, ok := r.deployments["neuron-console"]
	if !ok {
		t.Fatal("no Deployment neuron-console")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1 (sessions are in memory)", d.Spec.Replicas)
	}
	pod := d.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the console's pod mounts a service account token")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	checkContainerSecurity(t, c)
	checkResources(t, c)
	if c.Image != "neuron/console:dev" {
		t.Errorf("image %q", c.Image)
	}
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s probe %+v: want HTTPS GET /healthz", name, p)
		}
	}
	var mounted bool
	for _, m := range c.VolumeMounts {
		mounted = mounted || (m.MountPath == "/etc/neuron/tls" && m.ReadOnly)
	}
	if !mounted {
		t.Error("the console's certificate is not mounted read-only at /etc/neuron/tls")
	}

	// Every variable is a flag of the binary; none is a token (the console
	// calls with each person's own).
	cm := r.configMaps[configMapName(t, c)]
	if cm == nil {
		t.Fatal("no ConfigMap behind the console's envFrom")
	}
	bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/console/cmd/console")
	var out bytes.Buffer
	help := exec.Command(bin, "--help")
	help.Stdout, help.Stderr = &out, &out
	_ = help.Run()
	vars := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  --[a-z0-9-]+  \[([A-Z0-9_]+)\]$`).FindAllStringSubmatch(out.String(), -1) {
		vars[m[1]] = true
	}
	if len(vars) < 10 {
		t.Fatalf("console --help listed %d variables:\n%s", len(vars), out.String())
	}
	for k := range cm.Data {
		if !vars[k] {
			t.Errorf("neuron-console-config sets %s, which the console does not read", k)
		}
		if strings.Contains(k, "TOKEN") {
			t.Errorf("neuron-console-config sets %s: the console must hold no token of its own", k)
		}
	}
	if cm.Data["NEURON_CONSOLE_DEV"] != "" {
		t.Error("the component turns on dev mode")
	}

	// The NetworkPolicies of the component.
	out2 := kustomize(t, tg)
	policies := map[string]*networkingv1.NetworkPolicy{}
	for _, doc := range splitYAML(out2) {
		if !bytes.Contains(doc, []byte("kind: NetworkPolicy")) {
			continue
		}
		np := &networkingv1.NetworkPolicy{}
		if err := yaml.UnmarshalStrict(doc, np); err != nil {
			t.Fatal(err)
		}
		policies[np.Name] = np
	}
	egress := policies["neuron-console"]
	if egress == nil || len(egress.Spec.Egress) != 2 {
		t.Fatalf("neuron-console NetworkPolicy: %+v, want two egress rules", egress)
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
	for _, name := range []string{"neuron-console-to-orchestrator", "neuron-console-to-state"} {
		np := policies[name]
		if np == nil || len(np.Spec.Ingress) != 1 || np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "console" {
			t.Errorf("%s: %+v, want ingress from the console only", name, np)
		}
	}
}

// configMapName is the ConfigMap a container takes its environment from.
func configMapName(t *testing.T, c corev1.Container) string {
	t.Helper()
	for _, e := range c.EnvFrom {
		if e.ConfigMapRef != nil {
			return e.ConfigMapRef.Name
		}
	}
	t.Fatal("no envFrom ConfigMap")
	return ""
}
