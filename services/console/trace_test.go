package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/services/console"
)

// fakeOrch answers GetWorkflow: wf-1 exists, wf-secret is
// PERMISSION_DENIED, anything else NOT_FOUND.
type fakeOrch struct {
	orchestratorv1.OrchestratorServiceClient
	created time.Time
}

func (f *fakeOrch) GetWorkflow(_ context.Context, r *orchestratorv1.GetWorkflowRequest, _ ...grpc.CallOption) (*orchestratorv1.GetWorkflowResponse, error) {
	switch r.GetWorkflowId() {
	case "wf-1":
		return &orchestratorv1.GetWorkflowResponse{Workflow: &orchestratorv1.Workflow{WorkflowId: "wf-1", CreateTime: timestamppb.New(f.created)}}, nil
	case "wf-secret":
		return nil, status.Error(codes.PermissionDenied, "reader may not call GetWorkflow")
	}
	return nil, status.Errorf(codes.NotFound, "workflow %q not found", r.GetWorkflowId())
}

// jaegerTrace is a Jaeger /api/traces answer: three spans of two
// services, out of order, one failed, a child in another service.
const jaegerTraceJSON = `{"data":[{"traceID":"t1","spans":[
 {"traceID":"t1","spanID":"c","operationName":"chat scripted","startTime":1000300,"duration":100,"processID":"p2",
  "references":[{"refType":"CHILD_OF","traceID":"t1","spanID":"b"}],
  "tags":[{"key":"gen_ai.request.model","type":"string","value":"scripted"},{"key":"gen_ai.usage.output_tokens","type":"int64","value":7},
          {"key":"error","type":"bool","value":true},{"key":"otel.status_code","type":"string","value":"ERROR"}]},
 {"traceID":"t1","spanID":"a","operationName":"workflow assistant","startTime":1000000,"duration":1000,"processID":"p1","references":[],
  "tags":[{"key":"neuron.workflow_id","type":"string","value":"wf-1"}]},
 {"traceID":"t1","spanID":"b","operationName":"dispatch assistant","startTime":1000100,"duration":500,"processID":"p1",
  "references":[{"refType":"CHILD_OF","traceID":"t1","spanID":"a"}],"tags":[]}],
 "processes":{"p1":{"serviceName":"neuron-orchestrator"},"p2":{"serviceName":"neuron-operator"}}}]}`

// traceConsole serves a dev console over fakeOrch whose trace store is
// tracesURL; it returns the console's URL.
func traceConsole(t *testing.T, tracesURL string) string {
	t.Helper()
	srv := console.New(console.Options{Dev: true, Log: harness.Quiet(), TracesURL: tracesURL},
		&fakeOrch{created: time.UnixMicro(1000000)}, nil, nil)
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	return hs.URL
}

// getJSON GETs path and decodes the answer into v; it returns the status.
func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode
}

// apiErr is the console's error body.
type apiErr struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// TestTraceViewer checks GET /api/workflows/{id}/trace against a fake
// Jaeger query API: the search it makes (the orchestrator's service, the
// workflow id's tag, from before the workflow began), the waterfall's
// rows (sorted by start, offsets, parents, services, errors, attributes),
// and that a principal the orchestrator refuses never reaches the store.
func TestTraceViewer(t *testing.T) {
	var calls atomic.Int32
	var got atomic.Value
	jaeger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		got.Store(r.URL.Query())
		if r.URL.Path != "/api/traces" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(jaegerTraceJSON))
	}))
	defer jaeger.Close()
	base := traceConsole(t, jaeger.URL)

	var tr console.Trace
	if code := getJSON(t, base+"/api/workflows/wf-1/trace", &tr); code != http.StatusOK {
		t.Fatalf("status %d: %+v", code, tr)
	}
	q := got.Load().(url.Values)
	if q["service"][0] != "neuron-orchestrator" || q["tags"][0] != `{"neuron.workflow_id":"wf-1"}` {
		t.Errorf("the search: %v", q)
	}
	if start, _ := strconv.ParseInt(q["start"][0], 10, 64); start >= 1000000 {
		t.Errorf("the search starts at %d, after the workflow began (1000000 µs)", start)
	}
	if tr.TraceID != "t1" || tr.WorkflowID != "wf-1" || tr.DurationUs != 1000 || len(tr.Spans) != 3 ||
		strings.Join(tr.Services, ",") != "neuron-operator,neuron-orchestrator" {
		t.Fatalf("trace %+v", tr)
	}
	names := []string{}
	for _, s := range tr.Spans {
		names = append(names, s.Name)
	}
	if strings.Join(names, ",") != "workflow assistant,dispatch assistant,chat scripted" {
		t.Errorf("spans not sorted by start: %v", names)
	}
	chat := tr.Spans[2]
	if chat.ParentID != "b" || chat.StartUs != 300 || chat.DurationUs != 100 || !chat.Error || chat.Service != "neuron-operator" {
		t.Errorf("chat span %+v", chat)
	}
	attrs := map[string]string{}
	for _, a := range chat.Attrs {
		attrs[a.Key] = a.Value
	}
	if attrs["gen_ai.request.model"] != "scripted" || attrs["gen_ai.usage.output_tokens"] != "7" {
		t.Errorf("chat attributes %v", attrs)
	}
	if tr.Spans[0].Error || tr.Spans[0].ParentID != "" {
		t.Errorf("root span %+v", tr.Spans[0])
	}

	// The orchestrator decides who sees a workflow; the store, which
	// answers anyone, is not asked for one the principal may not read.
	before := calls.Load()
	var e apiErr
	if code := getJSON(t, base+"/api/workflows/wf-secret/trace", &e); code != http.StatusForbidden || e.Code != "PERMISSION_DENIED" {
		t.Errorf("a workflow the principal may not read: %d %+v", code, e)
	}
	if code := getJSON(t, base+"/api/workflows/wf-none/trace", &e); code != http.StatusNotFound {
		t.Errorf("an unknown workflow: %d %+v", code, e)
	}
	if calls.Load() != before {
		t.Errorf("the trace store was asked for a workflow the orchestrator refused")
	}
}

// TestTraceViewerFailures: no store configured, a store that is down,
// one that has no trace of the workflow, an answer over the bound and
// one that is not Jaeger's: each a status and a message saying what to
// do, never a hang or a 500.
func TestTraceViewerFailures(t *testing.T) {
	var e apiErr
	if code := getJSON(t, traceConsole(t, "")+"/api/workflows/wf-1/trace", &e); code != http.StatusNotImplemented ||
		e.Code != "TRACES_NOT_CONFIGURED" || !strings.Contains(e.Message, "--traces-url") {
		t.Errorf("no store: %d %+v", code, e)
	}

	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close()
	if code := getJSON(t, traceConsole(t, downURL)+"/api/workflows/wf-1/trace", &e); code != http.StatusServiceUnavailable ||
		e.Code != "TRACES_UNAVAILABLE" || !strings.Contains(e.Message, downURL) {
		t.Errorf("store down: %d %+v", code, e)
	}

	for _, c := range []struct {
		name   string
		answer func(http.ResponseWriter)
		status int
		code   string
	}{
		{"no trace", func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"data":[]}`)) }, http.StatusNotFound, "NOT_FOUND"},
		{"too large", func(w http.ResponseWriter) {
			_, _ = w.Write([]byte(`{"data":[{"traceID":"` + strings.Repeat("x", 17<<20) + `"}]}`))
		}, http.StatusBadGateway, "TRACE_TOO_LARGE"},
		{"not Jaeger", func(w http.ResponseWriter) { _, _ = w.Write([]byte(`<html>hello</html>`)) }, http.StatusBadGateway, "TRACES_ERROR"},
		{"store error", func(w http.ResponseWriter) { http.Error(w, "storage is down", http.StatusInternalServerError) }, http.StatusBadGateway, "TRACES_ERROR"},
	} {
		store := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { c.answer(w) }))
		code := getJSON(t, traceConsole(t, store.URL)+"/api/workflows/wf-1/trace", &e)
		store.Close()
		if code != c.status || e.Code != c.code || e.Message == "" {
			t.Errorf("%s: %d %+v, want %d %s", c.name, code, e, c.status, c.code)
		}
	}
}
