package reliable

import (
	"context"
	"log/slog"
	"sync"

	"github.com/secbear/neuron/services/operator/catalog"
	"github.com/secbear/neuron/services/operator/provider"
)

// Priced returns p with Response.Cost filled from cat after each
// successful call: model.Cost(resp.Usage), where model is the catalog
// entry of resp.Model, the model that answered.
//
// When the catalog does not know resp.Model (a dated snapshot newer than
// the catalog, say), the request's model is priced instead. When it knows
// neither, the cost stays zero and a warning naming the model is logged,
// once per model name, on WithLogger's logger (default slog.Default()):
// add the model or an alias to the catalog.
//
// A response that already carries a non-zero Cost keeps it: the provider
// priced the call itself (the scripted model's script may set a cost, so
// that tests can trip cost limits). Errors pass through unchanged. Name is
// p's name.
func Priced(p provider.Provider, cat *catalog.Catalog, opts ...Option) provider.Provider {
	o := newOptions(opts)
	return &priced{p: p, cat: cat, log: o.logger(), warned: make(map[string]bool)}
}

type priced struct {
	p   provider.Provider
	cat *catalog.Catalog
	log *slog.Logger

	mu     sync.Mutex
	warned map[string]bool
}

func (pp *priced) Name() string { return pp.p.Name() }

func (pp *priced) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	resp, err := pp.p.Complete(ctx, req)
	if err != nil || resp == nil || !resp.Cost.IsZero() {
		return resp, err
	}
	m, ok := pp.cat.Lookup(resp.Model)
	if !ok && req != nil && req.Model != "" {
		m, ok = pp.cat.Lookup(req.Model)
	}
	if !ok {
		pp.warnOnce(ctx, resp.Model, req)
		return resp, nil
	}
	resp.Cost = m.Cost(resp.Usage)
	return resp, nil
}

func (pp *priced) warnOnce(ctx context.Context, answered string, req *provider.Request) {
	requested := ""
	if req != nil {
		requested = req.Model
	}
	key := answered
	if key == "" {
		key = requested
	}
	pp.mu.Lock()
	seen := pp.warned[key]
	pp.warned[key] = true
	pp.mu.Unlock()
	if seen {
		return
	}
	pp.log.WarnContext(ctx, "model not in the catalog; its calls are counted as free",
		"provider", pp.p.Name(), "model", answered, "requested_model", requested)
}
