package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
)

// The trace viewer: GET /api/workflows/{id}/trace reads a workflow's
// trace from the trace store's query API (Jaeger's /api/traces, which
// Jaeger v1 and v2 serve) and answers it as a waterfall's rows. The
// browser never talks to the trace store: the console asks the
// orchestrator for the workflow first with the session's token (a
// principal that may not read the workflow may not read its trace,
// whatever the trace store, which has no auth of its own, would give
// out), then queries the store with a bounded answer and a timeout.

// Trace defaults and bounds.
const (
	// DefaultTracesService is the orchestrator's service name in traces
	// (its OTEL_SERVICE_NAME by default).
	DefaultTracesService = "neuron-orchestrator"
	// traceAttr is the attribute the orchestrator's workflow and
	// dispatch spans carry the workflow id in.
	traceAttr = "neuron.workflow_id"
	// maxTraceBytes bounds the query API's answer the console reads.
	maxTraceBytes = 16 << 20
	// maxTraceSpans bounds the spans one answer shows.
	maxTraceSpans = 5000
	// maxAttrValue bounds one attribute value shown.
	maxAttrValue = 4096
	// traceTimeout bounds one query of the trace store.
	traceTimeout = 15 * time.Second
	// traceSearchLimit is how many traces one search asks for.
	traceSearchLimit = 20
)

// jaegerAnswer is the part of Jaeger's /api/traces answer the viewer uses.
type jaegerAnswer struct {
	Data []jaegerTrace `json:"data"`
}

type jaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []jaegerSpan             `json:"spans"`
	Processes map[string]jaegerProcess `json:"processes"`
}

type jaegerProcess struct {
	ServiceName string `json:"serviceName"`
}

type jaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64       `json:"startTime"` // µs since the epoch
	Duration  int64       `json:"duration"`  // µs
	Tags      []jaegerTag `json:"tags"`
	ProcessID string      `json:"processID"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

// TraceSpan is one row of the waterfall.
type TraceSpan struct {
	SpanID   string `json:"spanId"`
	ParentID string `json:"parentId,omitempty"`
	Service  string `json:"service"`
	Name     string `json:"name"`
	// StartUs is the span's start in µs after the trace's first span.
	StartUs int64 `json:"startUs"`
	// DurationUs is how long it took, in µs.
	DurationUs int64 `json:"durationUs"`
	// Error is set when the span's status is an error.
	Error bool `json:"error,omitempty"`
	// Attrs are the span's attributes, by key, values as text.
	Attrs []TraceAttr `json:"attrs"`
}

// TraceAttr is one span attribute.
type TraceAttr struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Trace is the answer of /api/workflows/{id}/trace.
type Trace struct {
	WorkflowID string `json:"workflowId"`
	TraceID    string `json:"traceId"`
	// Start is the first span's start.
	Start time.Time `json:"start"`
	// DurationUs spans the first start to the last end.
	DurationUs int64 `json:"durationUs"`
	// Services are the services with spans in the trace, sorted.
	Services []string    `json:"services"`
	Spans    []TraceSpan `json:"spans"`
	// Truncated says spans beyond maxTraceSpans were left out.
	Truncated bool `json:"truncated,omitempty"`
	// OtherTraces are further traces that carry the workflow's id (a
	// workflow is one trace; a second means its trace context was lost).
	OtherTraces []string `json:"otherTraces,omitempty"`
	// Source is the trace store's query API the trace came from.
	Source string `json:"source"`
}

// traceError is a failure of the trace store, as the API answers it.
type traceError struct {
	status int
	code   string
	msg    string
}

func (e *traceError) Error() string { return e.msg }

// workflowTrace is GET /api/workflows/{id}/trace.
func (s *Server) workflowTrace(w http.ResponseWriter, r *http.Request, sess *session) {
	if s.opts.TracesURL == "" {
		writeError(w, http.StatusNotImplemented, "TRACES_NOT_CONFIGURED",
			"no trace store is configured: start the console with --traces-url set to Jaeger's query API (neuron up --otel-endpoint 127.0.0.1:4317 --traces-url http://127.0.0.1:16686)")
		return
	}
	id := r.PathValue("id")
	// The orchestrator decides whether this principal may see the
	// workflow; the trace store would answer anyone.
	resp, err := s.orch.GetWorkflow(r.Context(), &orchestratorv1.GetWorkflowRequest{WorkflowId: id}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "GetWorkflow", err)
		return
	}
	created := resp.GetWorkflow().GetCreateTime().AsTime()
	tr, err := s.fetchTrace(r.Context(), id, created)
	var te *traceError
	if errors.As(err, &te) {
		writeError(w, te.status, te.code, te.msg)
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "INTERNAL", "internal error")
		return
	}
	writeJSON(w, tr)
}

// fetchTrace searches the trace store for the traces whose orchestrator
// spans carry workflow id (from a little before created to now) and
// returns the largest as a waterfall.
func (s *Server) fetchTrace(ctx context.Context, id string, created time.Time) (*Trace, error) {
	base := strings.TrimRight(s.opts.TracesURL, "/")
	svc := s.opts.TracesService
	if svc == "" {
		svc = DefaultTracesService
	}
	tags, _ := json.Marshal(map[string]string{traceAttr: id})
	start := created.Add(-5 * time.Minute)
	if created.IsZero() || created.Unix() <= 0 {
		start = time.Now().Add(-7 * 24 * time.Hour)
	}
	q := url.Values{
		"service": {svc},
		"tags":    {string(tags)},
		"limit":   {strconv.Itoa(traceSearchLimit)},
		"start":   {strconv.FormatInt(start.UnixMicro(), 10)},
		"end":     {strconv.FormatInt(time.Now().Add(time.Minute).UnixMicro(), 10)},
	}
	ctx, cancel := context.WithTimeout(ctx, traceTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/traces?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	client := s.traceClient
	if client == nil {
		client = http.DefaultClient
	}
	hr, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL would repeat the query
		}
		return nil, &traceError{http.StatusServiceUnavailable, "TRACES_UNAVAILABLE",
			fmt.Sprintf("the trace store's query API at %s does not answer (%s): is Jaeger running there? The console's --traces-url names it", base, oneLineErr(err))}
	}
	defer hr.Body.Close()
	body, err := io.ReadAll(io.LimitReader(hr.Body, maxTraceBytes+1))
	if err != nil {
		return nil, &traceError{http.StatusBadGateway, "TRACES_UNAVAILABLE", fmt.Sprintf("reading the answer of %s: %s", base, oneLineErr(err))}
	}
	if len(body) > maxTraceBytes {
		return nil, &traceError{http.StatusBadGateway, "TRACE_TOO_LARGE",
			fmt.Sprintf("the trace store's answer is over %d MiB; open the trace in the trace store's own viewer", maxTraceBytes>>20)}
	}
	if hr.StatusCode == http.StatusNotFound {
		return nil, noTrace(id, base, svc)
	}
	if hr.StatusCode != http.StatusOK {
		return nil, &traceError{http.StatusBadGateway, "TRACES_ERROR",
			fmt.Sprintf("the trace store at %s answered %s: %s", base, hr.Status, snippet(body))}
	}
	var ans jaegerAnswer
	if err := json.Unmarshal(body, &ans); err != nil {
		return nil, &traceError{http.StatusBadGateway, "TRACES_ERROR",
			fmt.Sprintf("the answer of %s is not Jaeger's /api/traces JSON (%v): is --traces-url Jaeger's query API?", base, err)}
	}
	if len(ans.Data) == 0 {
		return nil, noTrace(id, base, svc)
	}
	// A workflow is one trace; should there be more, show the largest
	// and name the others.
	best := 0
	for i, t := range ans.Data {
		if len(t.Spans) > len(ans.Data[best].Spans) {
			best = i
		}
	}
	tr := toTrace(ans.Data[best])
	tr.WorkflowID, tr.Source = id, base
	for i, t := range ans.Data {
		if i != best && t.TraceID != tr.TraceID {
			tr.OtherTraces = append(tr.OtherTraces, t.TraceID)
		}
	}
	return tr, nil
}

// noTrace is the answer when the store has no trace of the workflow.
func noTrace(id, base, svc string) error {
	return &traceError{http.StatusNotFound, "NOT_FOUND",
		fmt.Sprintf("no trace of workflow %s in %s (service %s) yet: the services export spans when they end (in batches, and all when they stop); were they started with --otel-endpoint pointing at this store?", id, base, svc)}
}

// toTrace turns one Jaeger trace into the waterfall's rows, sorted by
// start, offsets from the first span.
func toTrace(jt jaegerTrace) *Trace {
	spans := slices.Clone(jt.Spans)
	slices.SortStableFunc(spans, func(a, b jaegerSpan) int {
		switch {
		case a.StartTime < b.StartTime:
			return -1
		case a.StartTime > b.StartTime:
			return 1
		}
		return 0
	})
	tr := &Trace{TraceID: jt.TraceID, Spans: []TraceSpan{}, Services: []string{}}
	if len(spans) == 0 {
		return tr
	}
	t0 := spans[0].StartTime
	var end int64
	services := map[string]bool{}
	for _, sp := range spans {
		end = max(end, sp.StartTime+sp.Duration-t0)
		svc := jt.Processes[sp.ProcessID].ServiceName
		services[svc] = true
	}
	if len(spans) > maxTraceSpans {
		spans, tr.Truncated = spans[:maxTraceSpans], true
	}
	for _, sp := range spans {
		row := TraceSpan{SpanID: sp.SpanID, Service: jt.Processes[sp.ProcessID].ServiceName, Name: sp.OperationName,
			StartUs: sp.StartTime - t0, DurationUs: sp.Duration, Attrs: make([]TraceAttr, 0, len(sp.Tags))}
		for _, ref := range sp.References {
			if ref.TraceID == jt.TraceID && (ref.RefType == "CHILD_OF" || row.ParentID == "") {
				row.ParentID = ref.SpanID
			}
		}
		for _, tag := range sp.Tags {
			v := tagText(tag.Value)
			switch {
			case tag.Key == "error" && v == "true", tag.Key == "otel.status_code" && v == "ERROR":
				row.Error = true
			}
			row.Attrs = append(row.Attrs, TraceAttr{Key: tag.Key, Value: v})
		}
		slices.SortFunc(row.Attrs, func(a, b TraceAttr) int { return strings.Compare(a.Key, b.Key) })
		tr.Spans = append(tr.Spans, row)
	}
	for svc := range services {
		tr.Services = append(tr.Services, svc)
	}
	slices.Sort(tr.Services)
	tr.Start = time.UnixMicro(t0).UTC()
	tr.DurationUs = end
	return tr
}

// tagText is an attribute value as text, bounded.
func tagText(v any) string {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case nil:
		s = ""
	default:
		b, _ := json.Marshal(v)
		s = string(b)
	}
	if len(s) > maxAttrValue {
		s = strings.ToValidUTF8(s[:maxAttrValue], "") + "… (cut)"
	}
	return s
}

// snippet is the start of an error answer, on one line.
func snippet(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return s
}

// oneLineErr is an error on one line.
func oneLineErr(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
