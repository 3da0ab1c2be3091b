//go:build linux

package console_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/sandbox"
)

// jaegerVersion is the Jaeger v2 scripts/jaeger.sh builds.
const jaegerVersion = "v1.76.0"

// jaegerBinary is the Jaeger v2 scripts/jaeger.sh built
// ($NEURON_JAEGER overrides), or a skip saying how to build it.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NEURON_JAEGER"); p != "" {
		return p
	}
	cache := os.Getenv("NEURON_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "neuron")
	}
	p := filepath.Join(cache, "jaeger-"+jaegerVersion, "jaeger")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("Jaeger is not built (scripts/jaeger.sh builds it into %s; make test runs it)", p)
	}
	return p
}

// jaegerConfig is a Jaeger v2 configuration: OTLP/gRPC on the first
// address, traces in memory, the query API on the second.
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
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// startJaeger starts Jaeger v2 on free loopback ports and waits until its
// query API answers; it returns the OTLP/gRPC address and the query
// API's URL.
func startJaeger(t *testing.T) (otlp, query string) {
	t.Helper()
	bin := jaegerBinary(t)
	otlp, query, grpcQuery := freeAddr(t), freeAddr(t), freeAddr(t)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, query, grpcQuery, otlp), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfg)
	out := &strings.Builder{}
	var mu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting Jaeger: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			mu.Lock()
			t.Logf("Jaeger's output:\n%s", out.String())
			mu.Unlock()
		}
	})
	query = "http://" + query
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := http.Get(query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return otlp, query
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jaeger's query API did not answer within a minute: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// writerFunc is an io.Writer from a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestBrowserTrace is issue 23's done-when in a real browser: a real
// Jaeger v2 (scripts/jaeger.sh), `neuron up --demo --isolation process
// --otel-endpoint <Jaeger> --traces-url <its query API>`, then
// trace.test.cjs in headless Chromium opens the demo workflow's page,
// follows its trace link and checks the waterfall: spans of the four
// services, the sandboxed operator's invoke_agent nested under the
// workflow span, a chat span's GenAI attributes on click, and axe-core.
// Screenshots go to the artifacts dir (trace.png, trace-span.png). It
// skips, saying why, without Jaeger, chromium, the npm modules, or the
// sandbox the four-service trace needs.
func TestBrowserTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Jaeger, neuron up and a browser; skipped with -short")
	}
	if err := sandbox.Supported(); err != nil {
		t.Skipf("the demo runs its agents in the environment's sandbox (the four services' trace) only where Landlock is: %v", err)
	}
	if err := sandbox.CgroupSupported(); err != nil {
		t.Skipf("the demo runs its agents in the environment's sandbox (the four services' trace) only with a cgroup: %v", err)
	}
	otlp, query := startJaeger(t)
	node, modules := browserDeps(t)
	bin := testenv.BuildStaticDir(t,
		"github.com/secbear/neuron/cmd/neuron",
		"github.com/secbear/neuron/services/state/cmd/state",
		"github.com/secbear/neuron/services/operator/cmd/operator",
		"github.com/secbear/neuron/services/environment/cmd/environment",
		"github.com/secbear/neuron/services/orchestrator/cmd/orchestrator",
		"github.com/secbear/neuron/services/console/cmd/console")

	up := exec.Command(filepath.Join(bin, "neuron"), "up", "--data-dir", t.TempDir(), "--demo", "--isolation", "process",
		"--orchestrator-addr", freeAddr(t), "--operator-addr", freeAddr(t), "--state-addr", freeAddr(t), "--environment-addr", freeAddr(t),
		"--console-addr", "127.0.0.1:0", "--otel-endpoint", otlp, "--traces-url", query)
	up.Env = cleanEnv()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	up.Stdout, up.Stderr = pw, pw
	startUp(t, up, pw)
	var (
		mu  sync.Mutex
		out strings.Builder
	)
	consoleURL, workflowID := make(chan string, 1), make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		reURL := regexp.MustCompile(`^console\s+(http://\S+)`)
		reWF := regexp.MustCompile(`neuron workflows show (\S+)`)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := reURL.FindStringSubmatch(sc.Text()); m != nil {
				consoleURL <- m[1]
			}
			if m := reWF.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case workflowID <- m[1]:
				default:
				}
			}
		}
	}()
	output := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	var url, wf string
	for url == "" || wf == "" {
		select {
		case url = <-consoleURL:
		case wf = <-workflowID:
		case <-time.After(5 * time.Minute):
			t.Fatalf("neuron up did not print the console's URL and the demo's workflow:\n%s", output())
		}
	}

	art := artifactsDir(t)
	if err := os.MkdirAll(art, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(repoRoot(t), "services", "console", "browser", "trace.test.cjs"))
	cmd.Env = append(cleanEnv(), "CONSOLE_URL="+url, "WORKFLOW_ID="+wf, "ARTIFACTS="+art, "NODE_PATH="+modules)
	res, err := cmd.CombinedOutput()
	t.Logf("trace.test.cjs (screenshots in %s):\n%s", art, res)
	if err != nil || !strings.Contains(string(res), "PASS") {
		t.Fatalf("the browser test failed: %v\nneuron up:\n%s", err, output())
	}
}
