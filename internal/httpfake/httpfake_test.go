package httpfake

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeT records what a helper reports; Fatal ends the goroutine as
// testing.T's does. Methods it does not define panic (nil TB).
type fakeT struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}

func (f *fakeT) messages() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.msgs...)
}

// run calls fn with a fakeT on a goroutine of its own and says what it
// reported and whether it stopped the goroutine (Fatal).
func run(fn func(t testing.TB)) (msgs []string, stopped bool) {
	ft := &fakeT{}
	stopped = true
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(ft)
		stopped = false
	}()
	<-done
	return ft.messages(), stopped
}

func get(t *testing.T, url string) *http.Response {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

func readAll(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRecordsConcurrentRequests sends requests from many goroutines at
// once and checks that each is recorded whole, in the order Index says,
// and that the handler still reads the body.
func TestRecordsConcurrentRequests(t *testing.T) {
	const n = 32
	s := New(t, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("handler reading the body: %v", err)
		}
		fmt.Fprintf(w, "%d %s", Index(r), body)
	})
	var wg sync.WaitGroup
	answers := make([]string, n)
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"n":%d}`, i)
			req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/v1/items/%d?i=%d&tag=a+b", s.URL(), i, i), strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("X-N", strconv.Itoa(i))
			req.Header.Add("X-Multi", "one")
			req.Header.Add("X-Multi", "two")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			if err != nil {
				t.Error(err)
			}
			answers[i] = string(b)
		})
	}
	wg.Wait()

	if got := s.Count(); got != n {
		t.Fatalf("Count = %d, want %d", got, n)
	}
	reqs := s.Requests()
	if len(reqs) != n {
		t.Fatalf("%d requests recorded, want %d", len(reqs), n)
	}
	seen := map[int]bool{}
	for pos, r := range reqs {
		i, err := strconv.Atoi(r.Header.Get("X-N"))
		if err != nil || seen[i] {
			t.Fatalf("request %d: X-N %q (seen before: %v)", pos, r.Header.Get("X-N"), seen[i])
		}
		seen[i] = true
		if r.Method != http.MethodPost || r.Path != fmt.Sprintf("/v1/items/%d", i) {
			t.Errorf("request %d: %s %s", pos, r.Method, r.Path)
		}
		if want := fmt.Sprintf("i=%d&tag=a+b", i); r.RawQuery != want || r.Query.Get("i") != strconv.Itoa(i) || r.Query.Get("tag") != "a b" {
			t.Errorf("request %d: query %q %v, want %q", pos, r.RawQuery, r.Query, want)
		}
		if got := r.Header.Values("X-Multi"); len(got) != 2 || got[0] != "one" || got[1] != "two" {
			t.Errorf("request %d: X-Multi %q", pos, got)
		}
		if want := fmt.Sprintf(`{"n":%d}`, i); string(r.Body) != want {
			t.Errorf("request %d: body %q, want %q", pos, r.Body, want)
		}
		if got := r.JSON(t)["n"]; got != float64(i) {
			t.Errorf("request %d: JSON n = %v", pos, got)
		}
		// The handler saw the same body, and Index is the position here.
		if want := fmt.Sprintf(`%d {"n":%d}`, pos, i); answers[i] != want {
			t.Errorf("request %d answered %q, want %q", pos, answers[i], want)
		}
	}
	if got := s.Nth(t, 3); got.Header.Get("X-N") != reqs[3].Header.Get("X-N") {
		t.Errorf("Nth(3) is not the fourth request")
	}
}

// The recorded requests are copies: changing one changes neither the
// server's record nor the next copy.
func TestRequestsAreCopies(t *testing.T) {
	s := New(t, JSON(200, `{}`))
	res := get(t, s.URL()+"/a")
	readAll(t, res.Body)
	r := s.Only(t)
	if r.Method != http.MethodGet || r.Path != "/a" || len(r.Body) != 0 || r.RawQuery != "" || r.Query == nil || len(r.Query) != 0 {
		t.Fatalf("recorded %+v", r)
	}
	r.Header.Set("X-Changed", "yes")
	s.Requests()[0].Path = "/changed"
	if again := s.Only(t); again.Header.Get("X-Changed") != "" || again.Path != "/a" {
		t.Fatalf("the record changed: %+v", again)
	}
}

func TestOnlyAndNthFail(t *testing.T) {
	s := New(t, JSON(200, `{}`))
	msgs, stopped := run(func(ft testing.TB) { s.Only(ft) })
	if !stopped || len(msgs) != 1 || !strings.Contains(msgs[0], "got 0 requests, want 1") {
		t.Errorf("Only with no request: stopped %v, reported %q", stopped, msgs)
	}
	msgs, stopped = run(func(ft testing.TB) { s.Nth(ft, 0) })
	if !stopped || len(msgs) != 1 || !strings.Contains(msgs[0], "want request 0, the server got 0") {
		t.Errorf("Nth(0) with no request: stopped %v, reported %q", stopped, msgs)
	}

	readAll(t, get(t, s.URL()+"/first").Body)
	msgs, stopped = run(func(ft testing.TB) {
		if r := s.Only(ft); r.Path != "/first" {
			t.Errorf("Only = %+v", r)
		}
	})
	if stopped || len(msgs) != 0 {
		t.Errorf("Only with one request: stopped %v, reported %q", stopped, msgs)
	}

	readAll(t, get(t, s.URL()+"/second").Body)
	msgs, stopped = run(func(ft testing.TB) { s.Only(ft) })
	if !stopped || len(msgs) != 1 || !strings.Contains(msgs[0], "got 2 requests (GET /first, GET /second), want 1") {
		t.Errorf("Only with two requests: stopped %v, reported %q", stopped, msgs)
	}
	msgs, stopped = run(func(ft testing.TB) { s.Nth(ft, 2) })
	if !stopped || len(msgs) != 1 || !strings.Contains(msgs[0], "want request 2, the server got 2") {
		t.Errorf("Nth(2) with two requests: stopped %v, reported %q", stopped, msgs)
	}
	if r := s.Nth(t, 1); r.Path != "/second" {
		t.Errorf("Nth(1) = %+v", r)
	}
}

func TestRequestJSONFailsOnNonObjects(t *testing.T) {
	for _, body := range []string{"", "null", "[1]", `{"a":`, "text"} {
		msgs, stopped := run(func(ft testing.TB) { Request{Method: "POST", Path: "/x", Body: []byte(body)}.JSON(ft) })
		if !stopped || len(msgs) != 1 || !strings.Contains(msgs[0], "is not a JSON object") {
			t.Errorf("JSON of %q: stopped %v, reported %q", body, stopped, msgs)
		}
	}
}

// sseFrames reads frames (up to and including an empty line) from br,
// acknowledging each on acks as it arrives.
func sseFrames(t *testing.T, br *bufio.Reader, acks chan<- struct{}) []string {
	t.Helper()
	var frames []string
	var cur strings.Builder
	for {
		line, err := br.ReadString('\n')
		cur.WriteString(line)
		if err == io.EOF {
			if cur.Len() > 0 {
				t.Errorf("stream ends inside a frame: %q", cur.String())
			}
			return frames
		}
		if err != nil {
			t.Fatal(err)
		}
		if line == "\n" || line == "\r\n" {
			frames = append(frames, cur.String())
			cur.Reset()
			if acks != nil {
				acks <- struct{}{}
			}
		}
	}
}

// gatedWriter holds back each write after the first until the client has
// acknowledged the frame before it: unless the handler flushes after
// each frame, the client never sees it and the wait times out.
type gatedWriter struct {
	http.ResponseWriter
	t      *testing.T
	acks   <-chan struct{}
	writes int
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	if g.writes > 0 {
		select {
		case <-g.acks:
		case <-time.After(5 * time.Second):
			g.t.Errorf("the client did not get frame %d before frame %d was written: not flushed", g.writes-1, g.writes)
		}
	}
	g.writes++
	return g.ResponseWriter.Write(p)
}

func (g *gatedWriter) Flush() { g.ResponseWriter.(http.Flusher).Flush() }

func TestSSEFraming(t *testing.T) {
	events := []string{
		`{"id":"chatcmpl-1","choices":[]}`,                 // a data line, as OpenAI sends
		Event("message_start", `{"type":"message_start"}`), // an event and its data, as Anthropic sends
		"data: {\"candidates\":[]}\r\n\r\n",                // a frame with CRLFs, as Gemini sends
		"event: done\ndata: {}\nid: 7\n\n",                 // any other complete frame
		"[DONE]",                                           // a bare data line
	}
	want := []string{
		"data: {\"id\":\"chatcmpl-1\",\"choices\":[]}\n\n",
		"event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
		"data: {\"candidates\":[]}\r\n\r\n",
		"event: done\ndata: {}\nid: 7\n\n",
		"data: [DONE]\n\n",
	}
	acks := make(chan struct{}, len(events))
	s := New(t, func(w http.ResponseWriter, r *http.Request) {
		SSE(events...)(&gatedWriter{ResponseWriter: w, t: t, acks: acks}, r)
	})
	res := get(t, s.URL()+"/stream")
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" || res.Header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("status %d, headers %v", res.StatusCode, res.Header)
	}
	got := sseFrames(t, bufio.NewReader(res.Body), acks)
	if strings.Join(got, "") != strings.Join(want, "") || len(got) != len(want) {
		t.Fatalf("frames\n got %q\nwant %q", got, want)
	}
}

func TestSSEHeadersSetBeforeWin(t *testing.T) {
	s := New(t, WithHeaders(SSE("x"), "Content-Type", "text/event-stream", "request-id", "req_1"))
	res := get(t, s.URL())
	if ct, id := res.Header.Get("Content-Type"), res.Header.Get("Request-Id"); ct != "text/event-stream" || id != "req_1" {
		t.Fatalf("Content-Type %q, request-id %q", ct, id)
	}
	if got := readAll(t, res.Body); got != "data: x\n\n" {
		t.Fatalf("body %q", got)
	}
}

func TestJSON(t *testing.T) {
	s := New(t, Sequence(
		JSON(429, `{"error":"slow down"}`, "Retry-After", "3"),
		JSON(503, "Loading model\n", "Content-Type", "text/plain; charset=utf-8"),
		WithHeaders(JSON(200, `{"ok":true}`), "Content-Type", "application/json; charset=UTF-8", "X-Extra", "1"),
	))
	for _, want := range []struct {
		status              int
		contentType, header string
		body                string
	}{
		{429, "application/json", "3", `{"error":"slow down"}`},
		{503, "text/plain; charset=utf-8", "", "Loading model\n"},
		{200, "application/json; charset=UTF-8", "", `{"ok":true}`},
		{200, "application/json; charset=UTF-8", "", `{"ok":true}`}, // the last answers again
	} {
		res := get(t, s.URL())
		body := readAll(t, res.Body)
		if res.StatusCode != want.status || res.Header.Get("Content-Type") != want.contentType ||
			res.Header.Get("Retry-After") != want.header || body != want.body {
			t.Errorf("got %d %q retry-after %q body %q, want %+v", res.StatusCode, res.Header.Get("Content-Type"),
				res.Header.Get("Retry-After"), body, want)
		}
	}
	if s.Count() != 4 {
		t.Errorf("Count = %d", s.Count())
	}
}

func TestSequenceConcurrent(t *testing.T) {
	var mu sync.Mutex
	served := map[string]int{}
	mark := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			served[name]++
			mu.Unlock()
		}
	}
	s := New(t, Sequence(mark("a"), mark("b"), mark("c")))
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			res, err := http.Get(s.URL())
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
		})
	}
	wg.Wait()
	if served["a"] != 1 || served["b"] != 1 || served["c"] != 8 {
		t.Fatalf("served %v, want a and b once, c the rest", served)
	}
}

func TestRequireJSON(t *testing.T) {
	ft := &fakeT{}
	s := New(t, RequireJSON(ft, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b) // the handler gets the body intact
	}))
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"model":"m"}`, true},
		{"", false},
		{"[1,2]", false},
		{`{"model":`, false},
	} {
		before := len(ft.messages())
		res, err := http.Post(s.URL(), "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		echo := readAll(t, res.Body)
		res.Body.Close()
		if echo != tc.body {
			t.Errorf("%q: the handler read %q", tc.body, echo)
		}
		msgs := ft.messages()[before:]
		if tc.ok != (len(msgs) == 0) || (!tc.ok && !strings.Contains(msgs[0], "is not a JSON object")) {
			t.Errorf("%q: reported %q", tc.body, msgs)
		}
	}
}

func TestAssertJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  any
		want string
		ok   bool
	}{
		{"same bytes", []byte(`{"a":1,"b":[true,null]}`), `{"a":1,"b":[true,null]}`, true},
		{"key order and spacing", []byte(`{"b":[true, null],"a":1.0}`), "{\n  \"a\": 1,\n  \"b\": [true, null]\n}", true},
		{"decoded value", map[string]any{"a": float64(1), "b": []any{"x"}}, `{"b":["x"],"a":1}`, true},
		{"typed value", struct {
			A int      `json:"a"`
			B []string `json:"b"`
		}{1, []string{"x"}}, `{"a":1,"b":["x"]}`, true},
		{"a string value", "hi", `"hi"`, true},
		{"raw message", json.RawMessage(`[1,2]`), `[1,2]`, true},
		{"other number", []byte(`{"a":1}`), `{"a":2}`, false},
		{"extra key", []byte(`{"a":1,"b":2}`), `{"a":1}`, false},
		{"missing key", map[string]any{"a": float64(1)}, `{"a":1,"b":null}`, false},
		{"array order", []byte(`[1,2]`), `[2,1]`, false},
		{"got not JSON", []byte(`{"a":`), `{"a":1}`, false},
		{"string is not parsed", `{"a":1}`, `{"a":1}`, false},
	} {
		msgs, stopped := run(func(ft testing.TB) { AssertJSON(ft, "body", tc.got, tc.want) })
		if stopped || tc.ok != (len(msgs) == 0) {
			t.Errorf("%s: stopped %v, reported %q", tc.name, stopped, msgs)
		}
		if !tc.ok && len(msgs) == 1 && !strings.HasPrefix(msgs[0], "body") {
			t.Errorf("%s: message %q does not name what", tc.name, msgs[0])
		}
	}
	msgs, stopped := run(func(ft testing.TB) { AssertJSON(ft, "body", []byte(`{}`), `{`) })
	if !stopped || len(msgs) != 1 {
		t.Errorf("bad want: stopped %v, reported %q", stopped, msgs)
	}
}

func TestIndexOutsideAServer(t *testing.T) {
	r, _ := http.NewRequest(http.MethodGet, "http://example.invalid/", nil)
	if got := Index(r); got != -1 {
		t.Fatalf("Index = %d, want -1", got)
	}
}
