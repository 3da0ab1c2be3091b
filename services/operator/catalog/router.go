package catalog

import (
	"fmt"
	"sort"
	"strings"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// Router routes a model name to the provider its catalog entry names. A
// model whose provider has no credentials configured is refused with a
// message saying which credential to set, so a misconfiguration shows at
// start-up (for the default model) or at the request that names it, never
// as a failed call mid-run.
type Router struct {
	Catalog *Catalog
	// Providers maps a catalog provider name ("anthropic", "openai",
	// "gemini", "openai-compatible", "scripted") to the provider serving
	// it. For "openai" the caller chooses the API (Chat Completions or
	// Responses) by what it puts here.
	Providers map[string]provider.Provider
	// Default is the model used when a request names none.
	Default string
	// Credentials names, per provider, what to set to enable it; used in
	// error messages (the operator gives each provider's
	// providers.Descriptor.Credential, e.g. "anthropic":
	// "ANTHROPIC_API_KEY or --anthropic-key-file").
	Credentials map[string]string
}

// Route implements provider.Router.
func (r Router) Route(name string) (provider.Provider, string, error) {
	if name == "" {
		name = r.Default
	}
	if name == "" {
		return nil, "", fmt.Errorf("no model named and no default model configured: %w", errs.InvalidArgument)
	}
	m, err := r.Catalog.Resolve(name)
	if err != nil {
		return nil, "", err
	}
	p, ok := r.Providers[m.Provider]
	if !ok {
		hint := ""
		if c := r.Credentials[m.Provider]; c != "" {
			hint = "; set " + c
		}
		return nil, "", fmt.Errorf("model %q is served by provider %q, which is not configured on this operator%s (available models: %s): %w",
			name, m.Provider, hint, strings.Join(r.Models(), ", "), errs.InvalidArgument)
	}
	return p, m.Name, nil
}

// Models implements provider.Router: the catalog models whose provider is
// configured.
func (r Router) Models() []string {
	var out []string
	for _, m := range r.Catalog.Models() {
		if _, ok := r.Providers[m.Provider]; ok {
			out = append(out, m.Name)
		}
	}
	sort.Strings(out)
	return out
}
