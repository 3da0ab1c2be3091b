package reliable

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/catalog"
	"github.com/secbear/neuron/services/operator/provider"
)

// The catalog prices claude-sonnet-4-5 at 3/15/0.30/3.75 per Mtok. For
// 1234 input, 567 output, 1000 cache read, 200 cache write tokens:
//
//	1234 × 3 + 567 × 15 + 1000 × 0.30 + 200 × 3.75
//	= 3702 + 8505 + 300 + 750 = 13257 → 13257 / 1e6 = 0.013257
const sonnetCost = "0.013257"

var sonnetUsage = wireUsage{Input: 1234, Output: 567, CacheRead: 1000, CacheWrite: 200}

func loadCatalog(t *testing.T) *catalog.Catalog {
	t.Helper()
	c, err := catalog.Load("")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestPricedOverHTTPAfterRetries(t *testing.T) {
	u := sonnetUsage
	srv := newFlakyServer(t, step{status: 529}, step{answer: wireAnswer{Text: "hi", Model: "claude-sonnet-4-5-20250929", Usage: &u}})
	p := Priced(Retry(&httpModel{name: "anthropic", url: srv.URL}, Policy{}, testLogger(t),
		WithSleep((&sleepRecorder{}).sleep)), loadCatalog(t))
	resp, err := p.Complete(context.Background(), &provider.Request{Model: "claude-sonnet-4-5"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Cost.String() != sonnetCost {
		t.Errorf("Cost = %s, want %s", resp.Cost, sonnetCost)
	}
	if p.Name() != "anthropic" {
		t.Errorf("Name = %q", p.Name())
	}
}

func TestPricedModelResolution(t *testing.T) {
	cat := loadCatalog(t)
	tests := []struct {
		name      string
		requested string
		answered  string
		want      string
		warn      bool
	}{
		{"answered model known", "claude-haiku-4-5", "claude-sonnet-4-5", sonnetCost, false},
		{"answered alias known", "", "claude-sonnet-4-5-20250929", sonnetCost, false},
		{"unknown snapshot falls back to the request", "claude-sonnet-4-5", "claude-sonnet-4-5-20270101", sonnetCost, false},
		{"unknown snapshot, request by alias", "claude-sonnet-4-5-20250929", "claude-sonnet-4-5-20270101", sonnetCost, false},
		{"neither known", "my-model", "my-model-v2", "0", true},
		{"neither named", "", "", "0", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs syncBuffer
			inner := providerFunc(func(context.Context, *provider.Request) (*provider.Response, error) {
				return &provider.Response{Model: tt.answered, Usage: provider.Usage{
					InputTokens: 1234, OutputTokens: 567, CacheReadTokens: 1000, CacheWriteTokens: 200}}, nil
			})
			p := Priced(inner, cat, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			for range 3 {
				resp, err := p.Complete(context.Background(), &provider.Request{Model: tt.requested})
				if err != nil {
					t.Fatal(err)
				}
				if resp.Cost.String() != tt.want {
					t.Errorf("Cost = %s, want %s", resp.Cost, tt.want)
				}
			}
			warnings := strings.Count(logs.String(), "model not in the catalog")
			if tt.warn && warnings != 1 || !tt.warn && warnings != 0 {
				t.Errorf("%d warnings in %q", warnings, logs.String())
			}
			if tt.warn && !strings.Contains(logs.String(), "model="+tt.answered) {
				t.Errorf("warning does not name the model: %q", logs.String())
			}
		})
	}
}

func TestPricedWarnsOncePerModel(t *testing.T) {
	var logs syncBuffer
	models := []string{"a", "b", "a", "b", "a"}
	var mu sync.Mutex
	i := 0
	inner := providerFunc(func(context.Context, *provider.Request) (*provider.Response, error) {
		mu.Lock()
		defer mu.Unlock()
		m := models[i%len(models)]
		i++
		return &provider.Response{Model: m}, nil
	})
	p := Priced(inner, loadCatalog(t), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { _, _ = p.Complete(context.Background(), &provider.Request{}) })
	}
	wg.Wait()
	if n := strings.Count(logs.String(), "model not in the catalog"); n != 2 {
		t.Errorf("%d warnings, want one each for a and b:\n%s", n, logs.String())
	}
}

func TestPricedKeepsProviderCostAndErrors(t *testing.T) {
	cat := loadCatalog(t)
	ownCost := decimal.RequireFromString("0.5")
	p := Priced(providerFunc(func(context.Context, *provider.Request) (*provider.Response, error) {
		return &provider.Response{Model: "scripted", Cost: ownCost, Usage: provider.Usage{InputTokens: 100}}, nil
	}), cat)
	resp, err := p.Complete(context.Background(), &provider.Request{})
	if err != nil || !resp.Cost.Equal(ownCost) {
		t.Errorf("cost %v, err %v: a provider's own cost is kept", resp.Cost, err)
	}

	fail := &provider.Error{Provider: "x", Model: "m", Kind: errs.NonRetryable, HTTPStatus: 400, Message: "bad"}
	p = Priced(providerFunc(func(context.Context, *provider.Request) (*provider.Response, error) {
		return nil, fail
	}), cat)
	if _, err := p.Complete(context.Background(), &provider.Request{}); !errors.Is(err, fail) {
		t.Errorf("err = %v", err)
	}
}
