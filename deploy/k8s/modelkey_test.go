package k8s_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// sandboxKeys is the Secret holding the model keys of sandboxed agents.
const sandboxKeys = "neuron-sandbox-model-keys"

// podRefs returns where pod refers to Secret name: volumes, env and
// envFrom of every container.
func podRefs(pod corev1.PodSpec, name string) []string {
	var out []string
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == name {
			out = append(out, "volume "+v.Name)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.Secret != nil && s.Secret.Name == name {
					out = append(out, "projected volume "+v.Name)
				}
			}
		}
	}
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == name {
				out = append(out, "env "+e.Name)
			}
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil && ef.SecretRef.Name == name {
				out = append(out, "envFrom")
			}
		}
	}
	return out
}

// TestSandboxModelKey: the model keys of sandboxed agents (Secret
// neuron-sandbox-model-keys) reach the environment service alone, as
// its --secrets-dir, where its egress proxies inject them as sidecar
// credentials; no other workload refers to the Secret, specs cannot
// name it by reference (so no Job's pod gets it), the service knows its
// pod IP for the proxies (--kube-egress-host), and invocation pods may
// reach the proxies' port range on it, nothing else of it.
func TestSandboxModelKey(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name(), func(t *testing.T) {
			r := render(t, tg)
			for name, d := range r.deployments {
				refs := podRefs(d.Spec.Template.Spec, sandboxKeys)
				if name != "neuron-environment" && len(refs) > 0 {
					t.Errorf("Deployment %s refers to %s: %v", name, sandboxKeys, refs)
				}
			}
			for name, s := range r.statefulSets {
				if refs := podRefs(s.Spec.Template.Spec, sandboxKeys); len(refs) > 0 {
					t.Errorf("StatefulSet %s refers to %s: %v", name, sandboxKeys, refs)
				}
			}
			env := services[3]
			w := r.workload(t, env)
			c := w.container(t, env)
			cfg, _ := r.config(t, env, c)
			dir := cfg["NEURON_ENVIRONMENT_SECRETS_DIR"]
			m, v, err := w.mountFor(c, dir+"/OPENAI_API_KEY")
			if err != nil || m.MountPath != dir || !m.ReadOnly || v.Secret == nil || v.Secret.SecretName != sandboxKeys {
				t.Errorf("NEURON_ENVIRONMENT_SECRETS_DIR %q: mount %+v, volume %+v (%v): want the Secret %s there, read-only", dir, m, v, err, sandboxKeys)
			}
			if refs := podRefs(w.pod.Spec, sandboxKeys); !slices.Equal(refs, []string{"volume " + v.Name}) {
				t.Errorf("the environment refers to %s as %v, want its secrets volume alone", sandboxKeys, refs)
			}
			for _, s := range strings.Split(cfg["NEURON_ENVIRONMENT_KUBE_CREDENTIAL_SECRETS"], ",") {
				if s == sandboxKeys || s == "neuron-provider-keys" || s == "" {
					t.Errorf("NEURON_ENVIRONMENT_KUBE_CREDENTIAL_SECRETS %q: specs could hand model keys (or any Secret) to a pod", cfg["NEURON_ENVIRONMENT_KUBE_CREDENTIAL_SECRETS"])
				}
			}
			host := false
			for _, e := range c.Env {
				if e.Name == "NEURON_ENVIRONMENT_KUBE_EGRESS_HOST" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
					host = true
				}
			}
			if !host {
				t.Error("NEURON_ENVIRONMENT_KUBE_EGRESS_HOST is not the pod's IP (status.podIP)")
			}
			if got := cfg["NEURON_ENVIRONMENT_KUBE_EGRESS_PORTS"]; got != "20000-20999" {
				t.Errorf("NEURON_ENVIRONMENT_KUBE_EGRESS_PORTS = %q", got)
			}
			// The environment's policy lets invocation pods reach the
			// proxies' range, and only that.
			var found bool
			for _, p := range r.policies {
				if p.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "environment" {
					continue
				}
				for _, in := range p.Spec.Ingress {
					invocations := len(in.From) == 1 && in.From[0].PodSelector != nil && len(in.From[0].PodSelector.MatchExpressions) == 1 &&
						in.From[0].PodSelector.MatchExpressions[0].Key == "neuron.dev/invocation"
					if !invocations {
						continue
					}
					found = true
					if len(in.Ports) != 1 || in.Ports[0].Port == nil || in.Ports[0].Port.IntValue() != 20000 || in.Ports[0].EndPort == nil || *in.Ports[0].EndPort != 20999 ||
						in.Ports[0].Protocol == nil || *in.Ports[0].Protocol != corev1.ProtocolTCP {
						t.Errorf("invocation pods may reach the environment on %+v, want TCP 20000-20999 alone", in.Ports)
					}
				}
			}
			if !found {
				t.Error("no NetworkPolicy lets invocation pods reach the environment's egress proxies")
			}
		})
	}
}
