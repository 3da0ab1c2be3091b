package k8s_test

import (
	"strings"
	"testing"
)

// overlays/otel sends every service's traces and metrics to the collector
// (each service's NEURON_<SERVICE>_OTEL_ENDPOINT, the --otel-endpoint
// flag), serves Prometheus metrics, and lets the services reach the
// collector through the default-deny policies.
func TestOTelOverlay(t *testing.T) {
	out := string(kustomize(t, target{dir: "overlays/otel", namespace: "neuron-dev", mode: modeDev}))
	for _, s := range []string{"ORCHESTRATOR", "OPERATOR", "STATE", "ENVIRONMENT"} {
		for _, want := range []string{
			"NEURON_" + s + "_OTEL_ENDPOINT: otel-collector.observability.svc:4317",
			"NEURON_" + s + "_METRICS_ADDR: :9464",
			"NEURON_" + s + "_DEV: \"1\"", // the dev overlay under it
		} {
			if !strings.Contains(out, want) {
				t.Errorf("rendering lacks %q", want)
			}
		}
	}
	i := strings.Index(out, "name: neuron-allow-otel")
	if i < 0 {
		t.Fatal("no neuron-allow-otel NetworkPolicy")
	}
	if doc := out[i:min(len(out), i+600)]; !strings.Contains(doc, "namespace: neuron-dev") || !strings.Contains(doc, "port: 4317") {
		t.Errorf("neuron-allow-otel: %s", doc)
	}
}
