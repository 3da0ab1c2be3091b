package reliable

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/secbear/neuron/services/operator/provider"
)

// Entry is one step of a fallback chain: a provider and the model to ask
// it for.
type Entry struct {
	Provider provider.Provider
	// Model replaces Request.Model for this entry; empty keeps the
	// caller's.
	Model string
}

func (e Entry) label(model string) string { return e.Provider.Name() + "/" + model }

// Fallback returns a provider that tries each entry of chain in order,
// with Request.Model set to the entry's Model, and returns the first
// answer. Response.Model is the model that answered (the entry's model
// when the provider left it empty).
//
// It moves to the next entry only when an entry fails with a retryable
// error (provider.Retryable: 429, 5xx, network failures, after that
// entry's own retries when it is wrapped in Retry). It returns at once,
// without falling back, on any other error: a request the model refused
// (400-class), a refused key, a context error, and an error after the
// caller's Request.OnText received text from the failed entry. When every
// entry fails, the last entry's error is returned, annotated with the
// models tried.
//
// Name returns the first entry's provider name: the chain is configured
// as that provider, and the Response.Model of a fallback answer says
// which model actually answered. Fallbacks are logged at WARN on
// slog.Default(). Fallback panics when chain is empty or an entry has no
// provider.
func Fallback(chain ...Entry) provider.Provider {
	if len(chain) == 0 {
		panic("reliable.Fallback: empty chain")
	}
	for i, e := range chain {
		if e.Provider == nil {
			panic(fmt.Sprintf("reliable.Fallback: entry %d has no provider", i))
		}
	}
	return &fallback{chain: chain, log: slog.Default()}
}

type fallback struct {
	chain []Entry
	log   *slog.Logger
}

func (f *fallback) Name() string { return f.chain[0].Provider.Name() }

func (f *fallback) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	if req == nil {
		return f.chain[0].Provider.Complete(ctx, req)
	}
	var tried []string
	for i, e := range f.chain {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		entryReq := *req
		if e.Model != "" {
			entryReq.Model = e.Model
		}
		call, streamed := guardStream(&entryReq)
		resp, err := e.Provider.Complete(ctx, call)
		if err == nil {
			if resp != nil && resp.Model == "" {
				resp.Model = entryReq.Model
			}
			return resp, nil
		}
		tried = append(tried, e.label(entryReq.Model))
		if !provider.Retryable(err) {
			return nil, err
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		if streamed.Load() {
			return nil, err
		}
		if i == len(f.chain)-1 {
			if len(tried) > 1 {
				return nil, fmt.Errorf("%w (every model of the fallback chain failed: %s)", err, strings.Join(tried, ", "))
			}
			return nil, err
		}
		next := f.chain[i+1]
		nextModel := next.Model
		if nextModel == "" {
			nextModel = req.Model
		}
		f.log.WarnContext(ctx, "model call failed; falling back",
			"from", e.label(entryReq.Model), "to", next.label(nextModel), "error", err)
	}
	panic("unreachable")
}
