package main

import (
	"strings"
	"testing"

	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/pkg/telemetry/telemetrytest"
)

// requireSandboxedAgents skips when `neuron up` cannot run the agents in
// the process sandbox.
func requireSandboxedAgents(t *testing.T) {
	t.Helper()
	if err := sandbox.Supported(); err != nil {
		t.Skipf("agents run sandboxed only where Landlock is: %v", err)
	}
	if err := sandbox.CgroupSupported(); err != nil {
		t.Skipf("agents run sandboxed only with a cgroup: %v", err)
	}
}

// TestUpTracesSandboxed runs the demo's delegating workflow through
// `neuron up --isolation process --otel-endpoint`: every operator call
// is a one-shot operator in the environment service's sandbox, which has
// no network. The trace must still be one, with the orchestrator's, the
// environment's and the sandboxed operator's spans (handed back on its
// stderr and exported by the environment), each invoke_agent under the
// environment's "sandbox process" span of its run, and every parent in
// the trace.
func TestUpTracesSandboxed(t *testing.T) {
	requireSandboxedAgents(t)
	t.Parallel()
	rcv := telemetrytest.Start(t)
	s := newUpSetup(t)
	r := neuron(ctxFor(t), t, s.args("--demo-exit", "--isolation", "process", "--otel-endpoint", rcv.GRPCAddr)...)
	if r.code != 0 {
		t.Fatalf("neuron up --demo-exit --isolation process --otel-endpoint: want exit 0, got:\n%s", r)
	}
	checkSandboxedTrace(t, rcv.Spans())
	metrics := rcv.MetricNames()
	// Peak memory (the cgroup's) and CPU time (wait4's rusage, or the
	// cgroup's count where larger) of every sandboxed run.
	for _, m := range []string{"neuron.sandbox.memory.peak", "neuron.sandbox.cpu.time"} {
		if metrics[m] == 0 {
			t.Errorf("no data points of metric %s (got %v)", m, metrics)
		}
	}
}

// checkSandboxedTrace checks the trace of the demo's workflow run with
// sandboxed agents, as an OTLP receiver or a collector gave it back.
func checkSandboxedTrace(t *testing.T, spans []telemetrytest.Span) {
	t.Helper()
	roots := telemetrytest.Named(spans, "dispatch assistant")
	if len(roots) == 0 {
		t.Fatalf("no dispatch span of the demo's assistant among %d spans: %v", len(spans), names(spans))
	}
	tr := telemetrytest.Trace(spans, roots[0].TraceID)
	byID := map[string]telemetrytest.Span{}
	services := map[string]int{}
	for _, s := range tr {
		byID[s.SpanID] = s
		services[s.Service]++
	}
	for _, svc := range []string{"neuron-orchestrator", "neuron-environment", "neuron-operator", "neuron-state"} {
		if services[svc] == 0 {
			t.Errorf("no span of %s in the workflow's trace (services %v)", svc, services)
		}
	}
	for _, name := range []string{"dispatch assistant", "dispatch researcher", "sandbox process", "invoke_agent assistant", "invoke_agent researcher", "effect delegate"} {
		if len(telemetrytest.Named(tr, name)) == 0 {
			t.Errorf("no %q span in the workflow's trace: %v", name, names(tr))
		}
	}
	var chats int
	for _, s := range tr {
		if strings.HasPrefix(s.Name, "chat ") {
			chats++
			if s.Service != "neuron-operator" || s.Attrs["gen_ai.operation.name"] != "chat" || s.Attrs["gen_ai.usage.input_tokens"] == nil {
				t.Errorf("chat span %+v", s)
			}
			if !under(byID, s, "sandbox process") {
				t.Errorf("%s is not under a sandbox process span", s.Name)
			}
		}
	}
	if chats < 3 {
		t.Errorf("%d chat spans, want at least 3: %v", chats, names(tr))
	}
	// Across the sandbox: each invoke_agent's parent is the environment's
	// span of its run, itself under the dispatch.
	for _, agent := range []string{"assistant", "researcher"} {
		for _, inv := range telemetrytest.Named(tr, "invoke_agent "+agent) {
			p, ok := byID[inv.ParentID]
			if !ok || p.Name != "sandbox process" || p.Service != "neuron-environment" {
				t.Errorf("invoke_agent %s's parent is %+v, want the environment's sandbox process span", agent, p)
			}
			if inv.Service != "neuron-operator" {
				t.Errorf("invoke_agent %s from %s", agent, inv.Service)
			}
			if !under(byID, inv, "dispatch "+agent) {
				t.Errorf("invoke_agent %s is not under dispatch %s", agent, agent)
			}
		}
	}
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
	if t.Failed() {
		t.Logf("spans of the trace: %v", names(tr))
	}
}
