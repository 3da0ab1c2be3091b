package reliable

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

func TestPolicyBackoff(t *testing.T) {
	p := Policy{} // defaults: 500ms ×2, max 30s, jitter 0.2
	if got := p.withDefaults(); got != DefaultPolicy() {
		t.Errorf("zero policy = %+v", got)
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, w := range want {
		if got := p.Backoff(i+1, 0.5); got != w {
			t.Errorf("Backoff(%d) = %s, want %s", i+1, got, w)
		}
	}
	for r := 0.0; r < 1; r += 0.01 {
		if got := p.Backoff(1, r); got < 400*time.Millisecond || got > 600*time.Millisecond {
			t.Errorf("Backoff(1, %v) = %s, outside 500ms ± 20%%", r, got)
		}
	}
	for _, tt := range []struct {
		policy  Policy
		attempt int
		random  float64
		want    time.Duration
	}{
		{Policy{}, 1, 0, 400 * time.Millisecond},                                 // 500ms × 0.8
		{Policy{}, 1, 0.75, 550 * time.Millisecond},                              // 500ms × 1.1
		{Policy{}, 2, 0.75, 1100 * time.Millisecond},                             // 1s × 1.1
		{Policy{}, 7, 0.75, 30 * time.Second},                                    // capped after jitter too
		{Policy{Jitter: -1}, 1, 0, 500 * time.Millisecond},                       // no jitter
		{Policy{Multiplier: 0.5}, 3, 0.5, 500 * time.Millisecond},                // multiplier below 1 is 1
		{Policy{BaseDelay: time.Second, Multiplier: 3}, 3, 0.5, 9 * time.Second}, // 1s × 3²
		{Policy{MaxDelay: 2 * time.Second}, 4, 0.5, 2 * time.Second},             // 4s capped
		{Policy{}, 1000, 0.5, 30 * time.Second},                                  // no overflow
		{Policy{Jitter: 5}, 1, 0, 0},                                             // jitter above 1 is 1
	} {
		if got := tt.policy.Backoff(tt.attempt, tt.random); got != tt.want {
			t.Errorf("%+v.Backoff(%d, %v) = %s, want %s", tt.policy, tt.attempt, tt.random, got, tt.want)
		}
	}
}

// The flaky server answers 429 with Retry-After, then 503, then 200: three
// calls over real HTTP, the first wait the Retry-After, the second the
// backoff.
func TestRetryOverFlakyHTTP(t *testing.T) {
	srv := newFlakyServer(t,
		step{status: 429, retryAfter: "2", message: "rate limited"},
		step{status: 503, message: "overloaded"},
		step{answer: wireAnswer{Text: "hello"}},
	)
	rec := &sleepRecorder{}
	p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{}, testLogger(t),
		WithSleep(rec.sleep), WithRandom(noJitter))
	resp, err := p.Complete(context.Background(), &provider.Request{Model: "m1"})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if resp.Text() != "hello" || resp.Model != "m1" {
		t.Errorf("response = %q from %q", resp.Text(), resp.Model)
	}
	if got := srv.requests(); !slices.Equal(got, []string{"m1", "m1", "m1"}) {
		t.Errorf("requests = %v, want 3", got)
	}
	// After the 429: max(backoff 500ms, Retry-After 2s) = 2s.
	// After the 503: backoff 500ms × 2 = 1s.
	if got, want := rec.recorded(), []time.Duration{2 * time.Second, time.Second}; !slices.Equal(got, want) {
		t.Errorf("waits = %v, want %v", got, want)
	}
	if p.Name() != "fake" {
		t.Errorf("Name = %q", p.Name())
	}
}

func TestRetryAfterShorterThanBackoff(t *testing.T) {
	srv := newFlakyServer(t, step{status: 503}, step{status: 429, retryAfter: "1"}, step{})
	rec := &sleepRecorder{}
	p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{BaseDelay: 2 * time.Second}, testLogger(t),
		WithSleep(rec.sleep), WithRandom(noJitter))
	if _, err := p.Complete(context.Background(), &provider.Request{Model: "m"}); err != nil {
		t.Fatal(err)
	}
	// 2s, then max(4s, Retry-After 1s) = 4s: Retry-After is a minimum.
	if got, want := rec.recorded(), []time.Duration{2 * time.Second, 4 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("waits = %v, want %v", got, want)
	}
}

func TestRetryGivesUpAfterMaxAttempts(t *testing.T) {
	srv := newFlakyServer(t, step{status: 503, message: "overloaded"})
	rec := &sleepRecorder{}
	p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{MaxAttempts: 3}, testLogger(t),
		WithSleep(rec.sleep), WithRandom(noJitter))
	_, err := p.Complete(context.Background(), &provider.Request{Model: "m"})
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.Kind != errs.Retryable || pe.HTTPStatus != 503 || !errors.Is(err, errs.Retryable) {
		t.Fatalf("err = %v, want the last 503 as a retryable provider.Error", err)
	}
	if want := "fake model m: HTTP 503: overloaded (gave up after 3 attempts)"; err.Error() != want {
		t.Errorf("err = %q, want %q", err, want)
	}
	if n := len(srv.requests()); n != 3 {
		t.Errorf("requests = %d, want 3", n)
	}
	if got, want := rec.recorded(), []time.Duration{500 * time.Millisecond, time.Second}; !slices.Equal(got, want) {
		t.Errorf("waits = %v, want %v", got, want)
	}
}

func TestRetryNeverRetriesRequestErrors(t *testing.T) {
	for _, status := range []int{400, 401, 403, 404, 413, 422} {
		srv := newFlakyServer(t, step{status: status, message: "no"}, step{})
		rec := &sleepRecorder{}
		p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{}, testLogger(t), WithSleep(rec.sleep))
		_, err := p.Complete(context.Background(), &provider.Request{Model: "m"})
		var pe *provider.Error
		if !errors.As(err, &pe) || pe.Kind != errs.NonRetryable || pe.HTTPStatus != status {
			t.Errorf("%d: err = %v", status, err)
		}
		if err.Error() != pe.Error() {
			t.Errorf("%d: a non-retryable error is returned unchanged, got %q", status, err)
		}
		if n := len(srv.requests()); n != 1 || len(rec.recorded()) != 0 {
			t.Errorf("%d: %d requests, %d waits; want 1 and 0", status, n, len(rec.recorded()))
		}
	}
}

func TestRetryAfterBeyondMaxDelayGivesUp(t *testing.T) {
	srv := newFlakyServer(t, step{status: 429, retryAfter: "60", message: "slow down"}, step{})
	rec := &sleepRecorder{}
	p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{MaxDelay: 30 * time.Second}, testLogger(t),
		WithSleep(rec.sleep))
	_, err := p.Complete(context.Background(), &provider.Request{Model: "m"})
	if !provider.Retryable(err) {
		t.Fatalf("err = %v, want retryable", err)
	}
	want := "fake model m: HTTP 429: slow down (not retried: the provider asked to wait 1m0s, more than the 30s allowed)"
	if err.Error() != want {
		t.Errorf("err = %q\nwant  %q", err, want)
	}
	if n := len(srv.requests()); n != 1 || len(rec.recorded()) != 0 {
		t.Errorf("%d requests, waits %v; want 1 and none", n, rec.recorded())
	}
}

func TestRetryConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	var calls atomic.Int32
	counting := providerFunc(func(ctx context.Context, req *provider.Request) (*provider.Response, error) {
		calls.Add(1)
		return (&httpModel{name: "fake", url: url}).Complete(ctx, req)
	})
	rec := &sleepRecorder{}
	p := Retry(counting, Policy{MaxAttempts: 2}, testLogger(t), WithSleep(rec.sleep), WithRandom(noJitter))
	_, err = p.Complete(context.Background(), &provider.Request{Model: "m"})
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.Kind != errs.Retryable || pe.HTTPStatus != 0 {
		t.Fatalf("err = %v", err)
	}
	if calls.Load() != 2 || len(rec.recorded()) != 1 {
		t.Errorf("calls = %d, waits %v", calls.Load(), rec.recorded())
	}
}

// A stream that failed after the client saw text is not repeated; one that
// failed before any text is.
func TestRetryStreaming(t *testing.T) {
	t.Run("no retry after partial text", func(t *testing.T) {
		srv := newFlakyServer(t, step{chunks: []string{"Hel", "lo, wo"}, drop: true}, step{chunks: []string{"Hello"}})
		rec := &sleepRecorder{}
		p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{}, testLogger(t), WithSleep(rec.sleep))
		var seen []string
		_, err := p.Complete(context.Background(), &provider.Request{Model: "m", OnText: func(s string) { seen = append(seen, s) }})
		if !provider.Retryable(err) {
			t.Fatalf("err = %v, want the retryable stream failure", err)
		}
		if !strings.HasPrefix(err.Error(), "fake model m: connection failed: ") || strings.Contains(err.Error(), "gave up") {
			t.Errorf("err = %q, want the failure as is", err)
		}
		if n := len(srv.requests()); n != 1 || len(rec.recorded()) != 0 {
			t.Errorf("%d requests, waits %v; want 1 and none", n, rec.recorded())
		}
		if !slices.Equal(seen, []string{"Hel", "lo, wo"}) {
			t.Errorf("OnText got %q", seen)
		}
	})
	t.Run("retry when no text was streamed", func(t *testing.T) {
		srv := newFlakyServer(t,
			step{status: 529, message: "overloaded"},
			step{chunks: []string{""}, drop: true}, // an empty delta is not text
			step{chunks: []string{"Hel", "lo"}},
		)
		rec := &sleepRecorder{}
		p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{}, testLogger(t), WithSleep(rec.sleep), WithRandom(noJitter))
		var seen []string
		req := &provider.Request{Model: "m", OnText: func(s string) { seen = append(seen, s) }}
		resp, err := p.Complete(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Text() != "Hello" || !slices.Equal(seen, []string{"", "Hel", "lo"}) {
			t.Errorf("text %q, OnText got %q", resp.Text(), seen)
		}
		if n := len(srv.requests()); n != 3 {
			t.Errorf("requests = %d, want 3", n)
		}
	})
}

func TestRetryContextCancelledDuringBackoff(t *testing.T) {
	srv := newFlakyServer(t, step{status: 503}, step{})
	// The real sleep: a 10s backoff the cancellation must cut short.
	p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{BaseDelay: 10 * time.Second}, testLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := p.Complete(ctx, &provider.Request{Model: "m"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("returned after %s", d)
	}
	if n := len(srv.requests()); n != 1 {
		t.Errorf("requests = %d, want 1", n)
	}
}

func TestRetryRespectsDeadline(t *testing.T) {
	srv := newFlakyServer(t, step{status: 503, message: "busy"}, step{status: 503}, step{})
	rec := &sleepRecorder{}
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{BaseDelay: 5 * time.Second}, testLogger(t),
		WithSleep(rec.sleep), WithRandom(noJitter), WithClock(func() time.Time { return now }))
	// The deadline is 4s after the (fake) now, the backoff 5s: no wait.
	// The real clock is past that deadline, so the context reports it
	// without enforcing it.
	_, err := p.Complete(deadlineOnly{Context: context.Background(), deadline: now.Add(4 * time.Second)}, &provider.Request{Model: "m"})
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.HTTPStatus != 503 || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the last 503", err)
	}
	if want := "fake model m: HTTP 503: busy (not retried: waiting 5s would pass the deadline)"; err.Error() != want {
		t.Errorf("err = %q\nwant  %q", err, want)
	}
	if n := len(srv.requests()); n != 1 || len(rec.recorded()) != 0 {
		t.Errorf("%d requests, waits %v; want 1 and none", n, rec.recorded())
	}

	// With room before the deadline, the retry happens.
	_, err = p.Complete(deadlineOnly{Context: context.Background(), deadline: now.Add(6 * time.Second)}, &provider.Request{Model: "m"})
	if err != nil || len(rec.recorded()) != 1 {
		t.Errorf("err = %v, waits %v", err, rec.recorded())
	}
}

// deadlineOnly reports a deadline it never enforces, so that the fake
// clock decides.
type deadlineOnly struct {
	context.Context
	deadline time.Time
}

func (d deadlineOnly) Deadline() (time.Time, bool) { return d.deadline, true }

func TestRetryRealDeadline(t *testing.T) {
	srv := newFlakyServer(t, step{status: 503}, step{})
	p := Retry(&httpModel{name: "fake", url: srv.URL}, Policy{BaseDelay: 10 * time.Second}, testLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := p.Complete(ctx, &provider.Request{Model: "m"})
	if !provider.Retryable(err) || time.Since(start) > 500*time.Millisecond {
		t.Errorf("err = %v after %s; want the 503 at once", err, time.Since(start))
	}
}

func TestRetryContextErrorsPassThrough(t *testing.T) {
	var calls atomic.Int32
	p := Retry(providerFunc(func(ctx context.Context, _ *provider.Request) (*provider.Response, error) {
		calls.Add(1)
		return nil, context.DeadlineExceeded
	}), Policy{}, testLogger(t))
	_, err := p.Complete(context.Background(), &provider.Request{})
	if !errors.Is(err, context.DeadlineExceeded) || calls.Load() != 1 {
		t.Errorf("err = %v after %d calls", err, calls.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Complete(ctx, &provider.Request{}); !errors.Is(err, context.Canceled) || calls.Load() != 1 {
		t.Errorf("cancelled before the call: err = %v, calls %d", err, calls.Load())
	}
}

type providerFunc func(ctx context.Context, req *provider.Request) (*provider.Response, error)

func (f providerFunc) Name() string { return "func" }
func (f providerFunc) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	return f(ctx, req)
}
