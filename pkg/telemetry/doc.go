// Package telemetry installs a process's OpenTelemetry tracer and meter
// providers: OTLP export over gRPC or HTTP, a Prometheus scrape endpoint,
// and the W3C trace-context propagator. Every service gets it through
// pkg/grpcserver, whose Config.BindFlags registers these flags (each
// also read from the service's NEURON_<SERVICE>_* variable):
//
//	--otel-endpoint         OTLP collector: host:port (plaintext), http://host:port or https://host:port
//	--otel-protocol         grpc (default) or http/protobuf
//	--metrics-addr          serve Prometheus metrics at http://ADDR/metrics
//	--otel-capture-content  record GenAI message content on spans (off by default)
//	--otel-queue-size       spans held for export at most (2048); past it spans are dropped
//
// With no flag, the standard variables apply: OTEL_EXPORTER_OTLP_ENDPOINT
// (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns export on,
// OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_HEADERS and the rest
// are read by the exporters, OTEL_SERVICE_NAME replaces the default
// service.name ("neuron-" and the service's name),
// OTEL_RESOURCE_ATTRIBUTES adds resource attributes, and
// OTEL_SDK_DISABLED=true turns everything off. Nothing is set: nothing is
// installed (off by default).
//
// Spans are batched with a bounded queue: a collector that is down or
// never answers costs dropped spans, never a blocked or slowed call
// (TestDeadCollectorBlocksNothing). grpcserver's Serve flushes what is
// queued when it returns, bounded by DefaultShutdownTimeout.
//
// A sandboxed one-shot operator has no network: it records its spans in
// a Recorder and writes them on one stderr line (SpansPrefix), which the
// environment service cuts out (CutSpans), checks as untrusted input
// (SandboxSpans: bounded, only the run's trace, fresh span ids, unknown
// parents and cycles put under the run, strings scrubbed) and exports
// through Setup's queue (Reexport). EmitSpan exports a span whose ids were
// chosen before it ended (the orchestrator's workflow span).
//
// Package telemetrytest is an in-process OTLP receiver for tests.
package telemetry
