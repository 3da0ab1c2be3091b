package main

import (
	"strings"
	"testing"

	"github.com/secbear/neuron/pkg/telemetry/telemetrytest"
)

// TestUpTraces runs the demo's delegating workflow through `neuron up
// --otel-endpoint` (agents on the operator service directly) against an
// in-process OTLP receiver (pkg/telemetry/telemetrytest, the
// collector's TraceService implemented in the test; no external
// collector runs here) and checks the trace the real service binaries
// export: one trace for the workflow, spans from the orchestrator, the
// operator and the state service, the GenAI spans and attributes, and
// every span's parent in the same trace.
func TestUpTraces(t *testing.T) {
	t.Parallel()
	rcv := telemetrytest.Start(t)
	s := newUpSetup(t)
	r := neuron(ctxFor(t), t, s.args("--demo-exit", "--isolation", "none", "--otel-endpoint", rcv.GRPCAddr)...)
	if r.code != 0 {
		t.Fatalf("neuron up --demo-exit --otel-endpoint: want exit 0, got:\n%s", r)
	}
	// Every service flushed its spans when it stopped, before up exited.
	spans := rcv.Spans()
	roots := telemetrytest.Named(spans, "dispatch assistant")
	if len(roots) == 0 {
		t.Fatalf("no dispatch span of the demo's assistant among %d spans: %v", len(spans), names(spans))
	}
	traceID := roots[0].TraceID
	tr := telemetrytest.Trace(spans, traceID)
	byID := map[string]telemetrytest.Span{}
	services := map[string]int{}
	for _, s := range tr {
		byID[s.SpanID] = s
		services[s.Service]++
	}
	for _, svc := range []string{"neuron-orchestrator", "neuron-operator", "neuron-state"} {
		if services[svc] == 0 {
			t.Errorf("no span of %s in the workflow's trace (services %v)", svc, services)
		}
	}
	// The delegation is in the same trace: both agents' dispatches and
	// invocations.
	for _, name := range []string{"dispatch assistant", "dispatch researcher", "invoke_agent assistant", "invoke_agent researcher", "effect delegate"} {
		if len(telemetrytest.Named(tr, name)) == 0 {
			t.Errorf("no %q span in the workflow's trace: %v", name, names(tr))
		}
	}
	var chats, toolSpans int
	for _, s := range tr {
		switch {
		case strings.HasPrefix(s.Name, "chat "):
			chats++
			for _, k := range []string{"gen_ai.request.model", "gen_ai.response.model", "gen_ai.response.finish_reasons", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "neuron.gen_ai.cost_usd"} {
				if _, ok := s.Attrs[k]; !ok {
					t.Errorf("%s has no %s: %v", s.Name, k, s.Attrs)
				}
			}
			if s.Service != "neuron-operator" || s.Attrs["gen_ai.operation.name"] != "chat" {
				t.Errorf("chat span %+v", s)
			}
		case strings.HasPrefix(s.Name, "execute_tool "):
			toolSpans++
			if s.Attrs["gen_ai.tool.name"] == nil || s.Attrs["gen_ai.tool.call.id"] == nil || s.Attrs["neuron.tool.outcome"] == nil {
				t.Errorf("tool span %+v", s)
			}
		}
	}
	if chats < 3 || toolSpans < 2 {
		t.Errorf("%d chat and %d execute_tool spans, want at least 3 and 2: %v", chats, toolSpans, names(tr))
	}
	// Parent links: one root (the StartWorkflow call's server span, the
	// CLI exporting nothing), every other span's parent in the trace, and
	// each invoke_agent under its dispatch through the gRPC spans.
	var rootSpans []string
	for _, s := range tr {
		if s.ParentID == "" {
			rootSpans = append(rootSpans, s.Name)
			continue
		}
		if _, ok := byID[s.ParentID]; !ok {
			t.Errorf("%s (%s): parent %s is not in the trace", s.Name, s.Service, s.ParentID)
		}
	}
	if len(rootSpans) != 1 {
		t.Errorf("roots %v, want one", rootSpans)
	}
	for _, inv := range telemetrytest.Named(tr, "invoke_agent assistant") {
		if !under(byID, inv, "dispatch assistant") {
			t.Errorf("invoke_agent assistant is not under dispatch assistant")
		}
	}
	// Metrics, pushed over OTLP when each service stopped: tokens and
	// cost by model and agent, model-call latency, tool calls, dispatch
	// latency and outcomes, workflows by status, and every service's call
	// latency (otelgrpc's, which is the State operations' latency).
	metrics := rcv.MetricNames()
	for _, m := range []string{"gen_ai.client.token.usage", "gen_ai.client.operation.duration", "neuron.gen_ai.cost",
		"neuron.tool.calls", "neuron.dispatch.duration", "neuron.dispatch.calls", "neuron.workflows"} {
		if metrics[m] == 0 {
			t.Errorf("no data points of metric %s (got %v)", m, metrics)
		}
	}
	var rpc bool
	for m := range metrics {
		rpc = rpc || strings.HasPrefix(m, "rpc.server.")
	}
	if !rpc {
		t.Errorf("no rpc.server.* metric (got %v)", metrics)
	}
	if t.Failed() {
		t.Logf("spans of the trace: %v", names(tr))
	}
}

// under says whether an ancestor of s is named name.
func under(byID map[string]telemetrytest.Span, s telemetrytest.Span, name string) bool {
	for i := 0; i < 64 && s.ParentID != ""; i++ {
		p, ok := byID[s.ParentID]
		if !ok {
			return false
		}
		if p.Name == name {
			return true
		}
		s = p
	}
	return false
}

func names(spans []telemetrytest.Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Service + ":" + s.Name
	}
	return out
}
