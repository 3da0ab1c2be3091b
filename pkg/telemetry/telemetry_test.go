package telemetry

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/secbear/neuron/pkg/telemetry/telemetrytest"
)

// noEnv hides the OTEL_* variables of the environment the test runs in.
func noEnv(t *testing.T, vars map[string]string) {
	old := lookupEnv
	lookupEnv = func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	t.Cleanup(func() { lookupEnv = old })
}

// Spans reach a collector over OTLP/gRPC and OTLP/HTTP, parent links
// kept, service.name set (and overridden by OTEL_SERVICE_NAME), flushed
// by Shutdown.
func TestExport(t *testing.T) {
	for _, tc := range []struct {
		name, proto, service, want string
		endpoint                   func(r *telemetrytest.Receiver) string
	}{
		{"grpc host:port", "grpc", "", "neuron-test", func(r *telemetrytest.Receiver) string { return r.GRPCAddr }},
		{"grpc url", "", "", "neuron-test", func(r *telemetrytest.Receiver) string { return "http://" + r.GRPCAddr }},
		{"http", "http/protobuf", "", "neuron-test", func(r *telemetrytest.Receiver) string { return r.HTTPURL }},
		{"service name from env", "grpc", "custom", "custom", func(r *telemetrytest.Receiver) string { return r.GRPCAddr }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noEnv(t, nil)
			t.Setenv("OTEL_SERVICE_NAME", tc.service)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
			r := telemetrytest.Start(t)
			ctx := context.Background()
			tel, err := Setup(ctx, Config{Endpoint: tc.endpoint(r), Protocol: tc.proto}, "test", nil)
			if err != nil {
				t.Fatal(err)
			}
			tr := otel.Tracer("test")
			pctx, parent := tr.Start(ctx, "parent")
			_, child := tr.Start(pctx, "child", trace.WithAttributes(attribute.String("k", "v")))
			child.End()
			parent.End()
			if err := tel.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			spans := r.Spans()
			if len(spans) != 2 {
				t.Fatalf("got %d spans, want 2: %+v", len(spans), spans)
			}
			p, c := telemetrytest.Named(spans, "parent"), telemetrytest.Named(spans, "child")
			if len(p) != 1 || len(c) != 1 || c[0].ParentID != p[0].SpanID || c[0].TraceID != p[0].TraceID {
				t.Fatalf("parent link lost: %+v", spans)
			}
			if c[0].Service != tc.want || c[0].Attrs["k"] != "v" {
				t.Fatalf("service %q attrs %v, want %q and k=v", c[0].Service, c[0].Attrs, tc.want)
			}
		})
	}
}

// A collector that accepts connections and never answers blocks no
// span and no metric; Shutdown returns within its context.
func TestDeadCollectorBlocksNothing(t *testing.T) {
	noEnv(t, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never read or answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(proto, func(t *testing.T) {
			ctx := context.Background()
			tel, err := Setup(ctx, Config{Endpoint: lis.Addr().String(), Protocol: proto, QueueSize: 8, ExportTimeout: time.Hour}, "test", nil)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				tr := otel.Tracer("test")
				calls := otel.Meter("test")
				n, _ := calls.Int64Counter("calls")
				for range 10_000 { // far past the queue
					_, s := tr.Start(ctx, "call")
					n.Add(ctx, 1)
					s.End()
				}
			}()
			select {
			case <-done:
			case <-time.After(2 * time.Minute): // a hang, not a speed bound
				t.Fatal("spans blocked on a collector that never answers")
			}
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			stopped := make(chan error, 1)
			go func() { stopped <- tel.Shutdown(sctx) }()
			select {
			case <-stopped: // an error (the flush did not finish) is expected
			case <-time.After(2 * time.Minute):
				t.Fatal("Shutdown hung on a collector that never answers")
			}
		})
	}
}

// --metrics-addr serves the process's metrics for Prometheus.
func TestPrometheusEndpoint(t *testing.T) {
	noEnv(t, nil)
	ctx := context.Background()
	tel, err := Setup(ctx, Config{MetricsAddr: "127.0.0.1:0"}, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(ctx)
	if tel.TracerProvider() != nil {
		t.Error("a scrape endpoint alone installed a span exporter")
	}
	c, _ := otel.Meter("test").Int64Counter("neuron.test.calls")
	c.Add(ctx, 3, metric.WithAttributes(attribute.String("tool", "bash")))
	resp, err := http.Get("http://" + tel.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `neuron_test_calls_total{`; !strings.Contains(string(body), want) {
		t.Fatalf("no %s in\n%s", want, body)
	}
	if !strings.Contains(string(body), `tool="bash"`) || !strings.Contains(string(body), `service_name="neuron-test"`) {
		t.Fatalf("labels missing in\n%s", body)
	}
}

// Off by default: nothing is installed without an endpoint; the standard
// variable turns export on; bad values are refused with the flag named.
func TestConfig(t *testing.T) {
	noEnv(t, nil)
	if (Config{}).Enabled() {
		t.Error("enabled with nothing configured")
	}
	tel, err := Setup(context.Background(), Config{}, "test", nil)
	if err != nil || tel.TracerProvider() != nil {
		t.Fatalf("disabled Setup: %v, %v", tel.TracerProvider(), err)
	}
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
	noEnv(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
	if !(Config{}).Enabled() {
		t.Error("OTEL_EXPORTER_OTLP_ENDPOINT did not turn export on")
	}
	noEnv(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_SDK_DISABLED": "true"})
	if (Config{}).Enabled() {
		t.Error("OTEL_SDK_DISABLED ignored")
	}
	noEnv(t, nil)
	for _, c := range []Config{
		{Endpoint: "collector"},
		{Endpoint: "ftp://collector:4317"},
		{Endpoint: "collector:4317", Protocol: "thrift"},
	} {
		_, err := Setup(context.Background(), c, "test", nil)
		if err == nil || !strings.Contains(err.Error(), "--otel-") {
			t.Errorf("%+v: %v, want an error naming the flag", c, err)
		}
	}
}
