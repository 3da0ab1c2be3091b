package reliable

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// httpModel is a minimal provider speaking a made-up JSON API over real
// HTTP, mapping failures the way every provider must: status to
// provider.KindForHTTP, Retry-After to RetryAfter, network errors to
// errs.Retryable with HTTPStatus 0, ctx cancellation to ctx's error.
//
// Wire format: POST /complete {"model", "stream"}. Without stream the
// answer is {"model", "text", "usage"}; with stream, one JSON object a
// line: {"text": "..."} for each delta, then {"model", "usage"}. Errors:
// {"error": {"message"}} with a non-200 status.
type httpModel struct {
	name string
	url  string
}

type wireUsage struct {
	Input      uint64 `json:"input"`
	Output     uint64 `json:"output"`
	CacheRead  uint64 `json:"cache_read"`
	CacheWrite uint64 `json:"cache_write"`
}

type wireAnswer struct {
	Model string     `json:"model,omitempty"`
	Text  string     `json:"text,omitempty"`
	Usage *wireUsage `json:"usage,omitempty"`
}

func (h *httpModel) Name() string { return h.name }

func (h *httpModel) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	body, _ := json.Marshal(map[string]any{"model": req.Model, "stream": req.OnText != nil})
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/complete", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return nil, h.networkError(ctx, req, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		_ = json.NewDecoder(res.Body).Decode(&e)
		pe := &provider.Error{Provider: h.name, Model: req.Model, Kind: provider.KindForHTTP(res.StatusCode),
			HTTPStatus: res.StatusCode, Message: e.Error.Message}
		if s, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil {
			pe.RetryAfter = time.Duration(s) * time.Second
		}
		return nil, pe
	}
	out := &provider.Response{Stop: provider.StopEndTurn}
	var text string
	var final wireAnswer
	if req.OnText == nil {
		if err := json.NewDecoder(res.Body).Decode(&final); err != nil {
			return nil, h.networkError(ctx, req, err)
		}
		text = final.Text
	} else {
		sc := bufio.NewScanner(res.Body)
		done := false
		for sc.Scan() {
			var ev wireAnswer
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				return nil, &provider.Error{Provider: h.name, Model: req.Model, Kind: errs.NonRetryable, Message: "malformed event"}
			}
			if ev.Usage != nil {
				final, done = ev, true
				break
			}
			text += ev.Text
			req.OnText(ev.Text)
		}
		if !done {
			err := sc.Err()
			if err == nil {
				err = errors.New("stream ended early")
			}
			return nil, h.networkError(ctx, req, err)
		}
	}
	if text != "" {
		out.Parts = []provider.Part{{Text: text}}
	}
	out.Model = final.Model
	if u := final.Usage; u != nil {
		out.Usage = provider.Usage{InputTokens: u.Input, OutputTokens: u.Output, CacheReadTokens: u.CacheRead, CacheWriteTokens: u.CacheWrite}
	}
	return out, nil
}

func (h *httpModel) networkError(ctx context.Context, req *provider.Request, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return &provider.Error{Provider: h.name, Model: req.Model, Kind: errs.Retryable, Message: "connection failed: " + err.Error()}
}

// step is what the flaky server answers to one request.
type step struct {
	status     int    // 0 means 200
	retryAfter string // Retry-After header
	message    string // error message
	answer     wireAnswer
	// chunks are streamed before the answer; with drop the connection
	// is cut after them, before the answer.
	chunks []string
	drop   bool
}

// flakyServer answers requests with its steps in order, repeating the
// last one when they run out, and records them.
type flakyServer struct {
	URL string
	srv *httpfake.Server
}

func newFlakyServer(t *testing.T, steps ...step) *flakyServer {
	t.Helper()
	handlers := make([]http.HandlerFunc, len(steps))
	for i, st := range steps {
		handlers[i] = st.serve
	}
	srv := httpfake.New(t, httpfake.Sequence(handlers...))
	return &flakyServer{URL: srv.URL(), srv: srv}
}

func (st step) serve(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if r.Method != http.MethodPost || r.URL.Path != "/complete" || json.NewDecoder(r.Body).Decode(&in) != nil {
		http.Error(w, `{"error": {"message": "bad request"}}`, http.StatusBadRequest)
		return
	}
	if st.status != 0 && st.status != http.StatusOK {
		if st.retryAfter != "" {
			w.Header().Set("Retry-After", st.retryAfter)
		}
		httpfake.JSON(st.status, fmt.Sprintf(`{"error": {"message": %q}}`, st.message))(w, r)
		return
	}
	ans := st.answer
	if ans.Model == "" {
		ans.Model = in.Model
	}
	if ans.Usage == nil {
		ans.Usage = &wireUsage{Input: 10, Output: 5}
	}
	if !in.Stream {
		ans.Text += joinChunks(st.chunks)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ans)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, c := range st.chunks {
		_ = enc.Encode(wireAnswer{Text: c})
		w.(http.Flusher).Flush()
	}
	if st.drop {
		// Cut the connection mid-body: the client reads an unexpected EOF.
		panic(http.ErrAbortHandler)
	}
	ans.Text = ""
	_ = enc.Encode(ans)
}

func joinChunks(cs []string) string {
	var s string
	for _, c := range cs {
		s += c
	}
	return s
}

// requests returns the models the requests asked for, in order ("" for
// one that named none or was not JSON).
func (s *flakyServer) requests() []string {
	var models []string
	for _, r := range s.srv.Requests() {
		var in struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(r.Body, &in)
		models = append(models, in.Model)
	}
	return models
}

// sleepRecorder records the waits Retry asks for without waiting.
type sleepRecorder struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (r *sleepRecorder) sleep(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	r.waits = append(r.waits, d)
	r.mu.Unlock()
	return ctx.Err()
}

func (r *sleepRecorder) recorded() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.waits...)
}

// noJitter makes waits exact.
func noJitter() float64 { return 0.5 }
