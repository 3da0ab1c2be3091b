package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// `neuron up --jaeger`: a Jaeger v2 (scripts/jaeger.sh builds it into
// ~/.cache/neuron) started beside the services with its traces in
// memory, the services' --otel-endpoint pointed at its OTLP receiver and
// the console's --traces-url at its query API, stopped after the
// services (which flush their spans to it when they stop).

// jaegerVersion is the Jaeger v2 scripts/jaeger.sh builds.
const jaegerVersion = "v1.76.0"

// Jaeger's usual addresses; a taken one is replaced by a free port.
const (
	jaegerOTLPAddr  = "127.0.0.1:4317"
	jaegerQueryAddr = "127.0.0.1:16686"
)

// upJaegerConfig is the Jaeger v2 configuration neuron up writes: OTLP
// over gRPC, traces in memory, the query API over HTTP (and gRPC).
const upJaegerConfig = `service:
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
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
processors:
  batch:
    timeout: 1s
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// jaegerPath is the Jaeger binary: $NEURON_JAEGER, else where
// scripts/jaeger.sh puts it.
func (c *cli) jaegerPath() string {
	if p := c.getenv("NEURON_JAEGER"); p != "" {
		return p
	}
	cache := c.getenv("NEURON_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "neuron")
	}
	return filepath.Join(cache, "jaeger-"+jaegerVersion, "jaeger")
}

// freeOr is addr when it is free, else a free loopback port.
func freeOr(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startJaeger starts Jaeger for `neuron up --jaeger`, waits until its
// query API answers, and sets f's --otel-endpoint and --traces-url to
// it. stop ends it.
func (c *cli) startJaeger(ctx context.Context, f *upFlags) (stop func(), err error) {
	if f.otelEndpoint != "" || f.tracesURL != "" {
		return nil, usageErrorf("up", "--jaeger sets --otel-endpoint and --traces-url itself: give either --jaeger or those two")
	}
	bin := c.jaegerPath()
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() {
		return nil, &exitError{code: exitFailure, msg: fmt.Sprintf("up: --jaeger: no Jaeger at %s: build it with scripts/jaeger.sh (several minutes, once), or set NEURON_JAEGER to a Jaeger v2 binary", bin)}
	}
	var addrs [3]string
	for i, a := range []string{jaegerOTLPAddr, jaegerQueryAddr, "127.0.0.1:0"} {
		if addrs[i], err = freeOr(a); err != nil {
			return nil, err
		}
	}
	logs, err := filepath.Abs(filepath.Join(f.dataDir, "logs"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(filepath.Dir(logs), "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, upJaegerConfig, addrs[1], addrs[2], addrs[0]), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(logs, "jaeger.log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = childProcAttr() // its own process group: a Ctrl-C reaches neuron up, which stops Jaeger last
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, &exitError{code: exitFailure, msg: fmt.Sprintf("up: --jaeger: starting %s: %v", bin, err)}
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); lf.Close(); close(done) }()
	stop = func() {
		terminate(cmd.Process)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			kill(cmd.Process)
			<-done
		}
	}
	query := "http://" + addrs[1]
	for deadline := time.Now().Add(time.Minute); ; {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, query+"/api/services", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-done:
			return nil, &exitError{code: exitFailure, msg: fmt.Sprintf("up: --jaeger: Jaeger exited at start; its log: %s", logPath)}
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, &exitError{code: exitFailure, msg: fmt.Sprintf("up: --jaeger: Jaeger's query API at %s did not answer within a minute; its log: %s", query, logPath)}
		}
	}
	f.otelEndpoint, f.tracesURL = addrs[0], query
	fmt.Fprintf(c.stdout, "jaeger    OTLP %s, query API %s (traces in memory; the console's Trace page reads them)  log %s\n", addrs[0], query, logPath)
	return stop, nil
}
