package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/telemetry/telemetrytest"
)

// jaegerBinary is the Jaeger v2 binary scripts/jaeger.sh built
// ($NEURON_JAEGER overrides), or a skip saying how to build it.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	p := (&cli{getenv: os.Getenv}).jaegerPath()
	if _, err := os.Stat(p); err != nil {
		t.Skipf("Jaeger is not built (scripts/jaeger.sh builds it into %s); TestUpTracesSandboxed checks the same trace against an in-process OTLP receiver", p)
	}
	return p
}

// jaegerConfig is a Jaeger v2 configuration: OTLP on otlpGRPC and
// otlpHTTP, traces kept in memory, the query API (and UI) on queryHTTP.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: %s
    grpc:
      endpoint: %s
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// jaeger is a running Jaeger v2.
type jaeger struct {
	otlp  string // OTLP/gRPC host:port
	query string // http://host:port of the query API and UI
}

// startJaeger starts Jaeger v2 on free loopback ports with in-memory
// storage and waits until its query API answers.
func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	bin := jaegerBinary(t)
	a := freeAddrs(t, 4)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, a[2], a[3], a[0], a[1]), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfg)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting Jaeger: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("Jaeger's output:\n%s", out.String())
		}
	})
	j := &jaeger{otlp: a[0], query: "http://" + a[2]}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(j.query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return j
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jaeger's query API did not answer within a minute: %v\n%s", err, out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// jaegerTraces is the query API's answer to /api/traces.
type jaegerTraces struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			TraceID       string `json:"traceID"`
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			References    []struct {
				RefType string `json:"refType"`
				TraceID string `json:"traceID"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			ProcessID string `json:"processID"`
			Tags      []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
		} `json:"processes"`
	} `json:"data"`
}

// traces reads the traces of service back from Jaeger's query API, as
// telemetrytest spans.
func (j *jaeger) traces(ctx context.Context, service string) ([]telemetrytest.Span, error) {
	u := j.query + "/api/traces?" + url.Values{"service": {service}, "limit": {"50"}, "lookback": {"1h"}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	var tr jaegerTraces
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
		return nil, fmt.Errorf("GET %s: %v", u, err)
	}
	var out []telemetrytest.Span
	for _, d := range tr.Data {
		for _, s := range d.Spans {
			sp := telemetrytest.Span{Service: d.Processes[s.ProcessID].ServiceName, Name: s.OperationName,
				TraceID: s.TraceID, SpanID: s.SpanID, Attrs: map[string]any{}}
			for _, r := range s.References {
				if r.RefType == "CHILD_OF" && r.TraceID == s.TraceID {
					sp.ParentID = r.SpanID
				}
			}
			for _, tag := range s.Tags {
				sp.Attrs[tag.Key] = tag.Value
			}
			out = append(out, sp)
		}
	}
	return out, nil
}

// TestUpJaeger runs the demo's delegating workflow, agents sandboxed,
// through `neuron up --otel-endpoint` pointed at a real Jaeger v2
// (scripts/jaeger.sh builds it; the test skips without it) and reads the
// trace back through Jaeger's query API: one trace, spans from every
// service, the GenAI attributes, parents across the sandbox
// (checkSandboxedTrace, as TestUpTracesSandboxed checks them against an
// in-process receiver).
func TestUpJaeger(t *testing.T) {
	requireSandboxedAgents(t)
	j := startJaeger(t)
	t.Parallel()
	s := newUpSetup(t)
	r := neuron(ctxFor(t), t, s.args("--demo-exit", "--isolation", "process", "--otel-endpoint", j.otlp)...)
	if r.code != 0 {
		t.Fatalf("neuron up --demo-exit --isolation process --otel-endpoint (Jaeger): want exit 0, got:\n%s", r)
	}
	// Jaeger stores what its batch processor passes on: wait for the
	// sandboxed operator's spans to be there.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var spans []telemetrytest.Span
	for {
		var err error
		spans, err = j.traces(ctx, "neuron-orchestrator")
		ready := err == nil && len(telemetrytest.Named(spans, "invoke_agent researcher")) > 0 && len(telemetrytest.Named(spans, "workflow assistant")) > 0 &&
			slices.ContainsFunc(spans, func(s telemetrytest.Span) bool { return s.Service == "neuron-state" }) // State stops, and flushes, last
		if ready || ctx.Err() != nil {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	checkSandboxedTrace(t, spans)
	if len(telemetrytest.Named(spans, "workflow assistant")) != 1 {
		t.Errorf("want one workflow span: %v", names(spans))
	}
	for _, c := range spans {
		if strings.HasPrefix(c.Name, "chat ") && (c.Attrs["gen_ai.request.model"] == nil || c.Attrs["gen_ai.usage.output_tokens"] == nil) {
			t.Errorf("chat span without its GenAI attributes in Jaeger: %+v", c)
		}
	}
	// Each sandboxed run carries its CPU time (the process backend
	// measures it on every machine: wait4's rusage, or the cgroup's).
	for _, c := range telemetrytest.Named(spans, "sandbox process") {
		if v, ok := c.Attrs["neuron.sandbox.cpu_time_s"].(float64); !ok || v <= 0 {
			t.Errorf("sandbox span without its CPU time: %+v", c.Attrs)
		}
	}
	t.Logf("the trace is at %s/trace/%s", j.query, telemetrytest.Named(spans, "dispatch assistant")[0].TraceID)
}

// lockedBuffer is an output buffer safe for a process's two streams.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
