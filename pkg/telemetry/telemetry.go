package telemetry

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Protocols of the OTLP exporters.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Defaults.
const (
	DefaultQueueSize       = 2048
	DefaultExportTimeout   = 10 * time.Second
	DefaultShutdownTimeout = 5 * time.Second
	DefaultMetricInterval  = 30 * time.Second
)

// Config says where a process's traces and metrics go. The zero value
// exports nothing, unless the standard OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) variable is set.
type Config struct {
	// Endpoint is the OTLP collector: host:port (plaintext, for a local
	// collector or a sidecar), http://host:port[/base] (plaintext) or
	// https://host:port[/base] (TLS). Empty: the OTEL_EXPORTER_OTLP_*
	// variables, read by the exporters themselves; none set: no export.
	Endpoint string
	// Protocol is "grpc" or "http/protobuf" ("http" too). Empty:
	// OTEL_EXPORTER_OTLP_PROTOCOL, else grpc.
	Protocol string
	// MetricsAddr, when set, serves the process's metrics for Prometheus
	// to scrape at http://MetricsAddr/metrics.
	MetricsAddr string
	// CaptureContent records GenAI message content (prompts, answers,
	// tool arguments and results) on spans. Off by default: content may
	// hold personal data and secrets.
	CaptureContent bool
	// QueueSize bounds the spans waiting for export; past it new spans
	// are dropped, never waited for.
	QueueSize int
	// ExportTimeout bounds one export to the collector.
	ExportTimeout time.Duration
	// MetricInterval is how often metrics are pushed over OTLP.
	MetricInterval time.Duration
}

// BindFlags registers the telemetry flags on fs, with c's current values
// as defaults. Use with flagenv.Parse for env fallbacks.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Endpoint, "otel-endpoint", c.Endpoint, "OTLP collector for traces and metrics: host:port (plaintext), http://host:port or https://host:port (default: $OTEL_EXPORTER_OTLP_ENDPOINT; none: no export)")
	fs.StringVar(&c.Protocol, "otel-protocol", c.Protocol, "OTLP protocol: grpc or http/protobuf (default: $OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "serve Prometheus metrics at http://ADDR/metrics (host:port; empty: off)")
	fs.BoolVar(&c.CaptureContent, "otel-capture-content", c.CaptureContent, "record GenAI message content (prompts, answers, tool arguments and results) on spans (may hold personal data)")
	fs.IntVar(&c.QueueSize, "otel-queue-size", cmpOr(c.QueueSize, DefaultQueueSize), "spans held for export at most; past it new spans are dropped, never waited for")
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// lookupEnv is os.LookupEnv; tests replace it.
var lookupEnv = os.LookupEnv

// env is a non-empty variable's value.
func env(name string) string {
	v, _ := lookupEnv(name)
	return strings.TrimSpace(v)
}

// exporting says whether spans and metrics go to a collector.
func (c Config) exporting() bool {
	if strings.EqualFold(env("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	return c.Endpoint != "" || env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Enabled says whether Setup installs anything: an exporter or a scrape
// endpoint.
func (c Config) Enabled() bool { return c.exporting() || c.MetricsAddr != "" }

// protocol is the exporters' protocol, checked.
func (c Config) protocol() (string, error) {
	p := c.Protocol
	if p == "" {
		p = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	}
	if p == "" {
		p = env("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch strings.ToLower(p) {
	case "", "grpc":
		return ProtocolGRPC, nil
	case "http", "http/protobuf":
		return ProtocolHTTP, nil
	}
	return "", fmt.Errorf("--otel-protocol %q: want grpc or http/protobuf", p)
}

// endpoint is Config.Endpoint split: host:port, the base path (for
// HTTP) and whether to skip TLS. ok is false when Endpoint is empty.
type endpoint struct {
	host     string
	base     string
	insecure bool
}

func (c Config) endpoint() (endpoint, bool, error) {
	e := c.Endpoint
	if e == "" {
		return endpoint{}, false, nil
	}
	if !strings.Contains(e, "://") {
		if _, _, err := net.SplitHostPort(e); err != nil {
			return endpoint{}, false, fmt.Errorf("--otel-endpoint %q: want host:port, http://host:port or https://host:port", e)
		}
		return endpoint{host: e, insecure: true}, true, nil
	}
	u, err := url.Parse(e)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return endpoint{}, false, fmt.Errorf("--otel-endpoint %q: want host:port, http://host:port or https://host:port", e)
	}
	return endpoint{host: u.Host, base: u.Path, insecure: u.Scheme == "http"}, true, nil
}

// Telemetry is what Setup installed. Shutdown flushes and stops it.
type Telemetry struct {
	tp      *sdktrace.TracerProvider
	mp      *sdkmetric.MeterProvider
	metrics *http.Server
	scrape  string // the scrape endpoint's address
	log     *slog.Logger
}

// Setup installs the process's tracer and meter providers (as the
// OpenTelemetry globals, so otelgrpc, otelhttp and every span of the
// services use them) and the W3C trace-context and baggage propagator.
// service names the process (service.name), unless OTEL_SERVICE_NAME
// says otherwise; OTEL_RESOURCE_ATTRIBUTES adds to the resource.
//
// Spans go through a batch processor with a bounded queue: a collector
// that is down, slow or never answers costs a dropped span, never a
// blocked call. Nothing is dialled before the first export.
//
// With a disabled config it installs nothing and returns a Telemetry
// whose Shutdown does nothing.
func Setup(ctx context.Context, cfg Config, service string, log *slog.Logger) (*Telemetry, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Telemetry{log: log}
	if !cfg.Enabled() {
		return t, nil
	}
	proto, err := cfg.protocol()
	if err != nil {
		return nil, err
	}
	ep, haveEP, err := cfg.endpoint()
	if err != nil {
		return nil, err
	}
	res, err := Resource(ctx, service)
	if err != nil {
		return nil, err
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	timeout := cmpOr(cfg.ExportTimeout, DefaultExportTimeout)
	var readers []sdkmetric.Option
	if cfg.exporting() {
		sx, err := spanExporter(ctx, proto, ep, haveEP, timeout)
		if err != nil {
			return nil, err
		}
		bsp := sdktrace.NewBatchSpanProcessor(sx,
			sdktrace.WithMaxQueueSize(cmpOr(cfg.QueueSize, DefaultQueueSize)),
			sdktrace.WithExportTimeout(timeout),
		)
		t.tp = sdktrace.NewTracerProvider(
			sdktrace.WithResource(res),
			sdktrace.WithSpanProcessor(bsp),
		)
		otel.SetTracerProvider(t.tp)
		// The spans sandboxed operators hand back go out the same way.
		SetReexporter(bsp)
		processResource.Store(res)
		mx, err := metricExporter(ctx, proto, ep, haveEP, timeout)
		if err != nil {
			return nil, err
		}
		readers = append(readers, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mx,
			sdkmetric.WithInterval(cmpOr(cfg.MetricInterval, DefaultMetricInterval)),
			sdkmetric.WithTimeout(timeout))))
	}
	if cfg.MetricsAddr != "" {
		reg := prometheus.NewRegistry()
		px, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, fmt.Errorf("prometheus exporter: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(px))
		lis, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			_ = t.shutdownTraces(ctx)
			return nil, fmt.Errorf("--metrics-addr %s: %w", cfg.MetricsAddr, err)
		}
		t.scrape = lis.Addr().String()
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		t.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := t.metrics.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Warn("metrics endpoint stopped", "err", err)
			}
		}()
		log.Info("serving Prometheus metrics", "addr", lis.Addr().String(), "path", "/metrics")
	}
	t.mp = sdkmetric.NewMeterProvider(append(readers, sdkmetric.WithResource(res))...)
	otel.SetMeterProvider(t.mp)
	log.Info("OpenTelemetry on", "export", cfg.exporting(), "protocol", proto, "endpoint", cfg.Endpoint)
	return t, nil
}

// Resource is the resource of service's telemetry: service.name (which
// OTEL_SERVICE_NAME overrides), OTEL_RESOURCE_ATTRIBUTES, and the SDK.
func Resource(ctx context.Context, service string) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(ServiceName(service))),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // after: OTEL_SERVICE_NAME wins
	)
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES or OTEL_SERVICE_NAME: %w", err)
	}
	return res, nil
}

// ServiceName is the default service.name of a neuron service:
// "neuron-" and its name.
func ServiceName(service string) string {
	if service == "" {
		return "neuron"
	}
	return "neuron-" + service
}

func spanExporter(ctx context.Context, proto string, ep endpoint, haveEP bool, timeout time.Duration) (sdktrace.SpanExporter, error) {
	if proto == ProtocolHTTP {
		opts := []otlptracehttp.Option{otlptracehttp.WithTimeout(timeout)}
		if haveEP {
			opts = append(opts, otlptracehttp.WithEndpoint(ep.host), otlptracehttp.WithURLPath(path.Join("/", ep.base, "v1/traces")))
			if ep.insecure {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
		return otlptracehttp.New(ctx, opts...)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(timeout)}
	if haveEP {
		opts = append(opts, otlptracegrpc.WithEndpoint(ep.host))
		if ep.insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
	}
	return otlptracegrpc.New(ctx, opts...)
}

func metricExporter(ctx context.Context, proto string, ep endpoint, haveEP bool, timeout time.Duration) (sdkmetric.Exporter, error) {
	if proto == ProtocolHTTP {
		opts := []otlpmetrichttp.Option{otlpmetrichttp.WithTimeout(timeout)}
		if haveEP {
			opts = append(opts, otlpmetrichttp.WithEndpoint(ep.host), otlpmetrichttp.WithURLPath(path.Join("/", ep.base, "v1/metrics")))
			if ep.insecure {
				opts = append(opts, otlpmetrichttp.WithInsecure())
			}
		}
		return otlpmetrichttp.New(ctx, opts...)
	}
	opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithTimeout(timeout)}
	if haveEP {
		opts = append(opts, otlpmetricgrpc.WithEndpoint(ep.host))
		if ep.insecure {
			opts = append(opts, otlpmetricgrpc.WithInsecure())
		}
	}
	return otlpmetricgrpc.New(ctx, opts...)
}

// TracerProvider is the installed tracer provider, nil when Setup
// exported nothing.
func (t *Telemetry) TracerProvider() *sdktrace.TracerProvider { return t.tp }

// MetricsAddr is the Prometheus scrape endpoint's address (host:port),
// empty when there is none.
func (t *Telemetry) MetricsAddr() string { return t.scrape }

// Shutdown flushes what is queued and stops the exporters and the scrape
// endpoint. ctx bounds it: a collector that never answers costs the
// queued spans, not a hung exit. It is safe on a nil or disabled
// Telemetry and to call more than once.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultShutdownTimeout)
		defer cancel()
	}
	var errs []error
	if err := t.shutdownTraces(ctx); err != nil {
		errs = append(errs, fmt.Errorf("flush spans: %w", err))
	}
	if t.mp != nil {
		if err := t.mp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("flush metrics: %w", err))
		}
		t.mp = nil
	}
	if t.metrics != nil {
		if err := t.metrics.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("metrics endpoint: %w", err))
		}
		t.metrics = nil
	}
	return errors.Join(errs...)
}

func (t *Telemetry) shutdownTraces(ctx context.Context) error {
	if t.tp == nil {
		return nil
	}
	SetReexporter(nil)
	err := t.tp.Shutdown(ctx)
	t.tp = nil
	return err
}
