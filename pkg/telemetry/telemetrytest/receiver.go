// Package telemetrytest is an in-process OTLP receiver for tests: it
// implements the OpenTelemetry collector's TraceService and
// MetricsService over gRPC, and OTLP/HTTP's /v1/traces and /v1/metrics
// (protobuf), and keeps what it receives for the test to assert on.
package telemetrytest

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is a received span, flattened.
type Span struct {
	// Service is the resource's service.name.
	Service string
	Name    string
	// TraceID, SpanID and ParentID are hex; ParentID is empty for a root.
	TraceID, SpanID, ParentID string
	Kind                      tracepb.Span_SpanKind
	// Attrs are the span's attributes: string, int64, float64, bool, or
	// []any for arrays.
	Attrs      map[string]any
	StatusCode tracepb.Status_StatusCode
	Start, End time.Time
}

// Receiver is a running OTLP receiver. Close stops it (Start registers
// that with t.Cleanup).
type Receiver struct {
	// GRPCAddr is the OTLP/gRPC address, host:port.
	GRPCAddr string
	// HTTPURL is the OTLP/HTTP base URL, http://host:port.
	HTTPURL string

	mu      sync.Mutex
	spans   []Span
	metrics map[string]int // metric name: data points received
	changed chan struct{}  // closed and replaced on each export

	grpc *grpc.Server
	http *http.Server
}

// Start starts a receiver on loopback ports.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{metrics: map[string]int{}, changed: make(chan struct{})}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.GRPCAddr, r.HTTPURL = gl.Addr().String(), "http://"+hl.Addr().String()
	r.grpc = grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(r.grpc, traceService{r: r})
	colmetricpb.RegisterMetricsServiceServer(r.grpc, metricsService{r: r})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.httpTraces)
	mux.HandleFunc("POST /v1/metrics", r.httpMetrics)
	r.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.grpc.Serve(gl) }()
	go func() { _ = r.http.Serve(hl) }()
	t.Cleanup(r.Close)
	return r
}

// Close stops the receiver.
func (r *Receiver) Close() {
	r.grpc.Stop()
	_ = r.http.Close()
}

// Spans is every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// MetricNames is every metric name received so far, with its count of
// data points.
func (r *Receiver) MetricNames() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.metrics))
	for k, v := range r.metrics {
		out[k] = v
	}
	return out
}

// Wait returns the spans once ok says they are enough, or ctx's error
// with the spans received by then.
func (r *Receiver) Wait(ctx context.Context, ok func([]Span) bool) ([]Span, error) {
	for {
		r.mu.Lock()
		spans, ch := slices.Clone(r.spans), r.changed
		r.mu.Unlock()
		if ok(spans) {
			return spans, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return spans, ctx.Err()
		}
	}
}

func (r *Receiver) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Receiver) addTraces(req *coltracepb.ExportTraceServiceRequest) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		service, _ := value(attr(rs.GetResource().GetAttributes(), "service.name")).(string)
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Service:    service,
					Name:       s.GetName(),
					TraceID:    hex.EncodeToString(s.GetTraceId()),
					SpanID:     hex.EncodeToString(s.GetSpanId()),
					Kind:       s.GetKind(),
					Attrs:      map[string]any{},
					StatusCode: s.GetStatus().GetCode(),
					Start:      time.Unix(0, int64(s.GetStartTimeUnixNano())),
					End:        time.Unix(0, int64(s.GetEndTimeUnixNano())),
				}
				if len(s.GetParentSpanId()) > 0 {
					sp.ParentID = hex.EncodeToString(s.GetParentSpanId())
				}
				for _, kv := range s.GetAttributes() {
					sp.Attrs[kv.GetKey()] = value(kv.GetValue())
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.notify()
	r.mu.Unlock()
}

func (r *Receiver) addMetrics(req *colmetricpb.ExportMetricsServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				n := len(m.GetSum().GetDataPoints()) + len(m.GetGauge().GetDataPoints()) +
					len(m.GetHistogram().GetDataPoints()) + len(m.GetExponentialHistogram().GetDataPoints())
				r.metrics[m.GetName()] += n
			}
		}
	}
	r.notify()
}

func attr(kvs []*commonpb.KeyValue, key string) *commonpb.AnyValue {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue()
		}
	}
	return nil
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, value(e))
		}
		return out
	case *commonpb.AnyValue_BytesValue:
		return x.BytesValue
	}
	return nil
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.addTraces(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

type metricsService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	r *Receiver
}

func (s metricsService) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	s.r.addMetrics(req)
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

func (r *Receiver) httpTraces(w http.ResponseWriter, req *http.Request) {
	var m coltracepb.ExportTraceServiceRequest
	if !decode(w, req, &m) {
		return
	}
	r.addTraces(&m)
	reply(w, &coltracepb.ExportTraceServiceResponse{})
}

func (r *Receiver) httpMetrics(w http.ResponseWriter, req *http.Request) {
	var m colmetricpb.ExportMetricsServiceRequest
	if !decode(w, req, &m) {
		return
	}
	r.addMetrics(&m)
	reply(w, &colmetricpb.ExportMetricsServiceResponse{})
}

func decode(w http.ResponseWriter, req *http.Request, m proto.Message) bool {
	body, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
	if err == nil && req.Header.Get("Content-Type") != "application/x-protobuf" {
		err = errors.New("want Content-Type application/x-protobuf")
	}
	if err == nil {
		err = proto.Unmarshal(body, m)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func reply(w http.ResponseWriter, m proto.Message) {
	b, _ := proto.Marshal(m)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(b)
}

// Trace is the spans of one trace id.
func Trace(spans []Span, traceID string) []Span {
	var out []Span
	for _, s := range spans {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Named is the spans called name.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}
