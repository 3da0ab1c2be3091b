// Package httpfake is a recording fake HTTP server for the tests of HTTP
// clients, such as the model providers: New starts an httptest server
// that records every request it gets (method, path, query, headers,
// body) and answers it with a handler; the handlers here answer JSON
// (JSON), server-sent events (SSE, Event) or a sequence of answers
// (Sequence); AssertJSON compares JSON documents as values.
//
// A typical test:
//
//	f := httpfake.New(t, httpfake.JSON(200, `{"ok":true}`))
//	// ... point the client at f.URL() and call it ...
//	req := f.Only(t)
//	httpfake.AssertJSON(t, "request body", req.Body, `{"model":"m"}`)
//
// The handlers are http.HandlerFunc values, so a func literal serves as
// one as it is, and so does any http.Handler's ServeHTTP method.
package httpfake

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Request is one request the Server received.
type Request struct {
	Method string
	// Path is the URL path, as in http.Request.URL.Path.
	Path string
	// RawQuery is the query string as sent, without the '?'.
	RawQuery string
	// Query is RawQuery parsed (empty, not nil, without a query).
	Query url.Values
	// Header is a copy of the request's headers.
	Header http.Header
	// Body is the whole request body (empty when there was none).
	Body []byte
}

// JSON decodes the body, which must be a JSON object; the test fails
// at once unless it is.
func (r Request) JSON(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil || m == nil {
		t.Fatalf("httpfake: the body of %s %s is not a JSON object (%v): %s", r.Method, r.Path, err, r.Body)
	}
	return m
}

// Server is an httptest server that records every request and answers
// it with its handler. It is safe for concurrent use.
type Server struct {
	t       testing.TB
	srv     *httptest.Server
	handler http.HandlerFunc

	mu   sync.Mutex
	reqs []Request
}

// New starts a Server answering with handler; it is closed when the test
// ends (Close waits for the handlers still running). The handler sees
// the request with its body intact (the Server has read and restored
// it) and the original ResponseWriter, so it may flush or hijack.
func New(t testing.TB, handler http.HandlerFunc) *Server {
	t.Helper()
	if handler == nil {
		t.Fatal("httpfake.New: nil handler")
	}
	s := &Server{t: t, handler: handler}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

type indexKey struct{}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		s.t.Errorf("httpfake: reading the body of %s %s: %v", r.Method, r.URL.Path, err)
	}
	query, _ := url.ParseQuery(r.URL.RawQuery)
	req := Request{
		Method:   r.Method,
		Path:     r.URL.Path,
		RawQuery: r.URL.RawQuery,
		Query:    query,
		Header:   r.Header.Clone(),
		Body:     body,
	}
	s.mu.Lock()
	n := len(s.reqs)
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.handler(w, r.WithContext(context.WithValue(r.Context(), indexKey{}, n)))
}

// Index is the position of r among the requests its Server received,
// from 0, in the order they were recorded; -1 for a request no Server
// served.
func Index(r *http.Request) int {
	if n, ok := r.Context().Value(indexKey{}).(int); ok {
		return n
	}
	return -1
}

// URL is the server's base URL, "http://127.0.0.1:port" (no slash at
// the end).
func (s *Server) URL() string { return s.srv.URL }

// Requests returns the requests received so far, in order: deep copies,
// which the caller may change.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = r.clone()
	}
	return out
}

func (r Request) clone() Request {
	r.Header = r.Header.Clone()
	q := make(url.Values, len(r.Query))
	for k, v := range r.Query {
		q[k] = append([]string(nil), v...)
	}
	r.Query = q
	r.Body = append([]byte{}, r.Body...)
	return r
}

// Count is how many requests the server has received.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// Only returns the one request received; the test fails at once unless
// exactly one came.
func (s *Server) Only(t testing.TB) Request {
	t.Helper()
	reqs := s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("httpfake: the server got %d requests%s, want 1", len(reqs), list(reqs))
	}
	return reqs[0]
}

// Nth returns the i-th request received, from 0; the test fails at once
// unless that many came.
func (s *Server) Nth(t testing.TB, i int) Request {
	t.Helper()
	reqs := s.Requests()
	if i < 0 || i >= len(reqs) {
		t.Fatalf("httpfake: want request %d, the server got %d%s", i, len(reqs), list(reqs))
	}
	return reqs[i]
}

// list names the requests for a failure message.
func list(reqs []Request) string {
	if len(reqs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(" (")
	for i, r := range reqs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(r.Method + " " + r.Path)
	}
	b.WriteString(")")
	return b.String()
}

// setDefault sets a response header unless it is set already, so that
// headers set before a handler runs (WithHeaders) win over its defaults.
func setDefault(h http.Header, key, value string) {
	if h.Get(key) == "" {
		h.Set(key, value)
	}
}

// setPairs sets the headers given as name, value pairs; an odd last name
// is ignored.
func setPairs(h http.Header, pairs []string) {
	for i := 0; i+1 < len(pairs); i += 2 {
		h.Set(pairs[i], pairs[i+1])
	}
}

// JSON answers with status and body. The Content-Type is
// application/json unless set already; headers are name, value pairs
// set after it, so they may override it.
func JSON(status int, body string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		setDefault(w.Header(), "Content-Type", "application/json")
		setPairs(w.Header(), headers)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// SSE answers 200 with a text/event-stream (and Cache-Control: no-cache,
// each unless set already) of the events in order, flushing after each.
// An event that ends in "\n" is a complete frame, written as it is (see
// Event; a frame may use CRLF line ends); any other is the data of one
// frame, written as "data: " + event + "\n\n".
func SSE(events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		setDefault(w.Header(), "Content-Type", "text/event-stream; charset=utf-8")
		setDefault(w.Header(), "Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		fl, _ := w.(http.Flusher)
		for _, e := range events {
			if !strings.HasSuffix(e, "\n") {
				e = "data: " + e + "\n\n"
			}
			_, _ = io.WriteString(w, e)
			if fl != nil {
				fl.Flush()
			}
		}
	}
}

// Event is a complete server-sent event frame with an event name:
// "event: <name>\ndata: <data>\n\n".
func Event(name, data string) string {
	return "event: " + name + "\ndata: " + data + "\n\n"
}

// Sequence answers the n-th request it gets (from 0, in the order they
// reach it) with the n-th handler, and every request after the last
// handler's with the last. It panics without handlers.
func Sequence(handlers ...http.HandlerFunc) http.HandlerFunc {
	if len(handlers) == 0 {
		panic("httpfake.Sequence: no handlers")
	}
	var next atomic.Int64
	return func(w http.ResponseWriter, r *http.Request) {
		n := int(next.Add(1) - 1)
		handlers[min(n, len(handlers)-1)](w, r)
	}
}

// WithHeaders sets the response headers given as name, value pairs, then
// runs h; h's own defaults (JSON's and SSE's) do not override them.
func WithHeaders(h http.HandlerFunc, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		setPairs(w.Header(), headers)
		h(w, r)
	}
}

// RequireJSON runs h after checking that the request body is a JSON
// object; the test fails (t.Errorf, from the handler) unless it is. h
// gets the body intact.
func RequireJSON(t testing.TB, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("httpfake: reading the body of %s %s: %v", r.Method, r.URL.Path, err)
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil || m == nil {
			t.Errorf("httpfake: the body of %s %s is not a JSON object (%v): %s", r.Method, r.URL.Path, err, body)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h(w, r)
	}
}

// AssertJSON checks that got equals the JSON document want as a value:
// object keys in any order, numbers by value. got is JSON text when it
// is a []byte or a json.RawMessage; anything else (a decoded value such
// as a map[string]any, or a string) is compared as what it encodes to.
// A mismatch fails the test (t.Errorf) showing both, named by what; a
// want that is not JSON stops it.
func AssertJSON(t testing.TB, what string, got any, want string) {
	t.Helper()
	var w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: the expected JSON is not valid: %v\n%s", what, err, want)
	}
	var text []byte
	switch g := got.(type) {
	case []byte:
		text = g
	case json.RawMessage:
		text = g
	default:
		b, err := json.Marshal(got)
		if err != nil {
			t.Errorf("%s: cannot encode %T as JSON: %v", what, got, err)
			return
		}
		text = b
	}
	var g any
	if err := json.Unmarshal(text, &g); err != nil {
		t.Errorf("%s is not valid JSON: %v\n%s", what, err, text)
		return
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got %s\nwant %s", what, indent(g), indent(w))
	}
}

func indent(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}
