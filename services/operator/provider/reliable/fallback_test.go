package reliable

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// retried wraps a fake HTTP model in Retry with recorded, instant waits.
func retried(t *testing.T, name, url string, attempts int) provider.Provider {
	return Retry(&httpModel{name: name, url: url}, Policy{MaxAttempts: attempts}, testLogger(t),
		WithSleep((&sleepRecorder{}).sleep), WithRandom(noJitter))
}

func TestFallbackAfterFirstExhausts(t *testing.T) {
	primary := newFlakyServer(t, step{status: 503, message: "overloaded"})
	backup := newFlakyServer(t, step{answer: wireAnswer{Text: "from backup", Model: "backup-2026-01-01"}})
	p := Fallback(
		Entry{Provider: retried(t, "alpha", primary.URL, 3), Model: "primary"},
		Entry{Provider: retried(t, "beta", backup.URL, 3), Model: "backup"},
	)
	req := &provider.Request{Model: "asked"}
	resp, err := p.Complete(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Text() != "from backup" || resp.Model != "backup-2026-01-01" {
		t.Errorf("response %q from %q", resp.Text(), resp.Model)
	}
	if got := primary.requests(); !slices.Equal(got, []string{"primary", "primary", "primary"}) {
		t.Errorf("primary requests = %v, want 3 for model primary", got)
	}
	if got := backup.requests(); !slices.Equal(got, []string{"backup"}) {
		t.Errorf("backup requests = %v", got)
	}
	if req.Model != "asked" {
		t.Errorf("the caller's request was modified: %q", req.Model)
	}
	if p.Name() != "alpha" {
		t.Errorf("Name = %q, want the first provider's", p.Name())
	}
}

func TestFallbackEntryWithoutModelKeepsRequestModel(t *testing.T) {
	primary := newFlakyServer(t, step{status: 500})
	backup := newFlakyServer(t, step{answer: wireAnswer{Text: "ok"}})
	// The backup entry names no model, so the caller's is sent to it.
	p := Fallback(Entry{Provider: retried(t, "alpha", primary.URL, 1), Model: "primary"},
		Entry{Provider: retried(t, "beta", backup.URL, 1)})
	resp, err := p.Complete(context.Background(), &provider.Request{Model: "asked"})
	if err != nil || resp.Model != "asked" || !slices.Equal(backup.requests(), []string{"asked"}) {
		t.Errorf("resp %+v, err %v, backup requests %v", resp, err, backup.requests())
	}
}

func TestFallbackFillsEmptyResponseModel(t *testing.T) {
	p := Fallback(Entry{Provider: providerFunc(func(context.Context, *provider.Request) (*provider.Response, error) {
		return &provider.Response{Stop: provider.StopEndTurn}, nil
	}), Model: "m"})
	resp, err := p.Complete(context.Background(), &provider.Request{})
	if err != nil || resp.Model != "m" {
		t.Errorf("resp %+v, err %v", resp, err)
	}
}

func TestFallbackNeverOnRequestErrors(t *testing.T) {
	for _, status := range []int{400, 401, 404, 422} {
		primary := newFlakyServer(t, step{status: status, message: "bad"})
		backup := newFlakyServer(t, step{})
		p := Fallback(
			Entry{Provider: retried(t, "alpha", primary.URL, 3), Model: "primary"},
			Entry{Provider: retried(t, "beta", backup.URL, 3), Model: "backup"},
		)
		_, err := p.Complete(context.Background(), &provider.Request{})
		var pe *provider.Error
		if !errors.As(err, &pe) || pe.HTTPStatus != status || !errors.Is(err, errs.NonRetryable) || err.Error() != pe.Error() {
			t.Errorf("%d: err = %v", status, err)
		}
		if len(primary.requests()) != 1 || len(backup.requests()) != 0 {
			t.Errorf("%d: primary %v, backup %v", status, primary.requests(), backup.requests())
		}
	}
}

func TestFallbackAllFail(t *testing.T) {
	a := newFlakyServer(t, step{status: 503, message: "a down"})
	b := newFlakyServer(t, step{status: 429, message: "b busy"})
	p := Fallback(
		Entry{Provider: retried(t, "alpha", a.URL, 2), Model: "m1"},
		Entry{Provider: retried(t, "beta", b.URL, 2), Model: "m2"},
	)
	_, err := p.Complete(context.Background(), &provider.Request{})
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.Provider != "beta" || pe.HTTPStatus != 429 || !provider.Retryable(err) {
		t.Fatalf("err = %v, want the last entry's retryable error", err)
	}
	want := "beta model m2: HTTP 429: b busy (gave up after 2 attempts) (every model of the fallback chain failed: alpha/m1, beta/m2)"
	if err.Error() != want {
		t.Errorf("err = %q\nwant  %q", err, want)
	}
	if len(a.requests()) != 2 || len(b.requests()) != 2 {
		t.Errorf("requests %d, %d", len(a.requests()), len(b.requests()))
	}
}

func TestFallbackNotAfterPartialText(t *testing.T) {
	// No Retry here: the primary's own failure after text must stop the
	// chain too.
	primary := newFlakyServer(t, step{chunks: []string{"partial"}, drop: true})
	backup := newFlakyServer(t, step{chunks: []string{"whole"}})
	p := Fallback(
		Entry{Provider: &httpModel{name: "alpha", url: primary.URL}, Model: "m1"},
		Entry{Provider: &httpModel{name: "beta", url: backup.URL}, Model: "m2"},
	)
	var seen []string
	_, err := p.Complete(context.Background(), &provider.Request{OnText: func(s string) { seen = append(seen, s) }})
	if !provider.Retryable(err) || len(backup.requests()) != 0 || !slices.Equal(seen, []string{"partial"}) {
		t.Errorf("err %v, backup requests %v, seen %q", err, backup.requests(), seen)
	}

	// A stream that failed before any text falls back, and the client sees
	// only the backup's text.
	primary2 := newFlakyServer(t, step{status: 503})
	p = Fallback(
		Entry{Provider: &httpModel{name: "alpha", url: primary2.URL}, Model: "m1"},
		Entry{Provider: &httpModel{name: "beta", url: backup.URL}, Model: "m2"},
	)
	seen = nil
	resp, err := p.Complete(context.Background(), &provider.Request{OnText: func(s string) { seen = append(seen, s) }})
	if err != nil || resp.Text() != "whole" || !slices.Equal(seen, []string{"whole"}) {
		t.Errorf("resp %v, err %v, seen %q", resp, err, seen)
	}
}

func TestFallbackNotOnContextCancel(t *testing.T) {
	backup := newFlakyServer(t, step{})
	ctx, cancel := context.WithCancel(context.Background())
	primary := providerFunc(func(ctx context.Context, _ *provider.Request) (*provider.Response, error) {
		cancel()
		// Some transports report the cut connection as a network error.
		return nil, &provider.Error{Provider: "func", Kind: errs.Retryable, Message: "connection reset"}
	})
	p := Fallback(Entry{Provider: primary, Model: "m1"}, Entry{Provider: &httpModel{name: "beta", url: backup.URL}, Model: "m2"})
	_, err := p.Complete(ctx, &provider.Request{})
	if !errors.Is(err, context.Canceled) || len(backup.requests()) != 0 {
		t.Errorf("err %v, backup requests %v", err, backup.requests())
	}

	// Cancelled during the primary's backoff (real sleep): no fallback
	// either, and promptly.
	slow := newFlakyServer(t, step{status: 503})
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(30*time.Millisecond, cancel)
	p = Fallback(
		Entry{Provider: Retry(&httpModel{name: "alpha", url: slow.URL}, Policy{BaseDelay: 10 * time.Second}, testLogger(t)), Model: "m1"},
		Entry{Provider: &httpModel{name: "beta", url: backup.URL}, Model: "m2"},
	)
	start := time.Now()
	_, err = p.Complete(ctx, &provider.Request{})
	if !errors.Is(err, context.Canceled) || len(backup.requests()) != 0 || time.Since(start) > 2*time.Second {
		t.Errorf("err %v, backup requests %v, after %s", err, backup.requests(), time.Since(start))
	}
}

func TestFallbackPanicsOnBadChain(t *testing.T) {
	for name, chain := range map[string][]Entry{"empty": nil, "nil provider": {{Model: "m"}}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			Fallback(chain...)
		}()
	}
}
