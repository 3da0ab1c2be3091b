package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/secbear/neuron/services/operator/catalog"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/provider/anthropic"
	"github.com/secbear/neuron/services/operator/provider/gemini"
	"github.com/secbear/neuron/services/operator/provider/openai"
	"github.com/secbear/neuron/services/operator/provider/openairesponses"
	"github.com/secbear/neuron/services/operator/provider/providers"
	"github.com/secbear/neuron/services/operator/provider/reliable"
	"github.com/secbear/neuron/services/operator/provider/scripted"
)

// keyFrom reads a key file, else the first env var set. It returns the
// key and where it came from (the flag, or $VARIABLE).
func keyFrom(d providers.Descriptor, file string, getenv func(string) string) (key, source string, err error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", "", err
		}
		k := strings.TrimSpace(string(b))
		if k == "" {
			return "", "", fmt.Errorf("%s is empty", file)
		}
		return k, "--" + d.KeyFileFlag(), nil
	}
	for _, e := range d.KeyEnv {
		if v := strings.TrimSpace(getenv(e)); v != "" {
			return v, "$" + e, nil
		}
	}
	return "", "", nil
}

// settings is what the wiring found for one provider.
type settings struct {
	key, keySource, baseURL string
}

// providerSettings reads the key and base URL of every provider of
// providers.All, the only place the operator reads their variables
// (getenv is os.Getenv outside tests). A key comes from the provider's
// key file, else the first of its key variables that is set; a base URL
// from m.BaseURLs, else the provider's base URL variable, else its public
// API. A provider without key variables is enabled by a base URL; it
// reads the variable only when no provider sharing the variable has a
// key. It returns the enabled providers, by name.
func providerSettings(m Models, getenv func(string) string) (map[string]settings, error) {
	found := map[string]settings{}
	claimed := map[string]bool{} // base URL variables of providers with a key
	all := providers.All()
	// Providers with key variables: enabled by a key.
	for _, d := range all {
		if len(d.KeyEnv) == 0 {
			continue
		}
		key, source, err := keyFrom(d, m.KeyFiles[d.Name], getenv)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", d.KeyFileFlag(), err)
		}
		if key == "" {
			continue
		}
		base := m.BaseURLs[d.Name]
		if base == "" {
			base = getenv(d.BaseURLEnv)
		}
		if base == "" {
			base = d.DefaultBaseURL()
		}
		found[d.Name] = settings{key: key, keySource: source, baseURL: base}
		claimed[d.BaseURLEnv] = true
	}
	// Providers without: enabled by a base URL; a key, if they need one,
	// comes from their key file.
	for _, d := range all {
		if len(d.KeyEnv) > 0 {
			continue
		}
		base := m.BaseURLs[d.Name]
		if base == "" && !claimed[d.BaseURLEnv] {
			base = getenv(d.BaseURLEnv)
		}
		if base == "" {
			continue
		}
		key, source, err := keyFrom(d, m.KeyFiles[d.Name], getenv)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", d.KeyFileFlag(), err)
		}
		found[d.Name] = settings{key: key, keySource: source, baseURL: base}
	}
	return found, nil
}

// newProvider constructs the provider d describes. providers.All imports
// no SDK, so this switch is where a provider's package is linked in: a
// provider added to the list needs its case here.
func newProvider(d providers.Descriptor, s settings, m Models, client *http.Client, maxTokens int) (provider.Provider, error) {
	switch d.Name {
	case anthropic.Name:
		return anthropic.New(anthropic.Config{APIKey: s.key, KeySource: s.keySource, BaseURL: s.baseURL, HTTPClient: client, MaxTokens: maxTokens})
	case openai.Name:
		switch m.OpenAIAPI {
		case "chat", "":
			return openai.New(openai.Config{APIKey: s.key, KeySource: s.keySource, BaseURL: s.baseURL, HTTPClient: client, MaxTokens: maxTokens})
		case "responses":
			return openairesponses.New(openairesponses.Config{APIKey: s.key, BaseURL: s.baseURL, HTTPClient: client, MaxTokens: maxTokens})
		default:
			return nil, fmt.Errorf("--openai-api %q: want chat or responses", m.OpenAIAPI)
		}
	case gemini.Name:
		return gemini.New(gemini.Config{APIKey: s.key, KeySource: s.keySource, BaseURL: s.baseURL, HTTPClient: client, MaxTokens: maxTokens})
	case openai.CompatibleName:
		return openai.NewCompatible(openai.Config{APIKey: s.key, KeySource: s.keySource, BaseURL: s.baseURL, HTTPClient: client, MaxTokens: maxTokens})
	}
	return nil, fmt.Errorf("provider %q is in providers.All but the operator has no constructor for it", d.Name)
}

// models builds the model router, and the context strategy. It returns
// the catalog for budgets.
func models(cfg Config, log *slog.Logger) (provider.Router, *catalog.Catalog, compaction.Strategy, error) {
	m := cfg.Models
	cat, err := catalog.Load(m.Catalog)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--catalog: %w", err)
	}
	router := cfg.Router
	if router == nil {
		if router, err = catalogRouter(cfg, cat, log); err != nil {
			return nil, nil, nil, err
		}
	} else {
		if _, _, err := router.Route(cfg.Model); err != nil {
			return nil, nil, nil, fmt.Errorf("--model: %w", err)
		}
		if chain := m.FallbackModels; len(chain) > 0 {
			if router, err = withFallback(router, cfg.Model, chain); err != nil {
				return nil, nil, nil, fmt.Errorf("--fallback-models: %w", err)
			}
		}
	}

	var strategy compaction.Strategy
	if m.Compaction == compaction.NameSummarize {
		p, model, _ := router.Route("")
		strategy, err = compaction.Parse(m.Compaction, p, model, compaction.WithLogger(log))
	} else {
		strategy, err = compaction.Parse(m.Compaction, nil, "")
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--compaction: %w", err)
	}
	return router, cat, strategy, nil
}

// catalogRouter builds the catalog router with every provider that has
// credentials, each wrapped with retries and pricing. Its default model
// is cfg.Model, else that of the first provider with credentials, else
// the scripted model.
func catalogRouter(cfg Config, cat *catalog.Catalog, log *slog.Logger) (provider.Router, error) {
	m := cfg.Models
	client := http.DefaultClient
	if m.EgressProxy != "" {
		c, err := egressClient(m.EgressProxy)
		if err != nil {
			return nil, err
		}
		client = c
		log.Info("model traffic through the egress proxy", "proxy", m.EgressProxy)
	}
	if cfg.Server.Telemetry || cfg.Server.OTel.Enabled() {
		// A client span per provider request, the trace context carried.
		client = &http.Client{Transport: otelhttp.NewTransport(client.Transport), CheckRedirect: client.CheckRedirect, Jar: client.Jar, Timeout: client.Timeout}
	}
	policy := reliable.DefaultPolicy()
	policy.MaxAttempts = max(m.Retries, 0) + 1
	wrap := func(p provider.Provider) provider.Provider {
		return reliable.Priced(reliable.Retry(p, policy, log), cat)
	}
	var scriptOpts []scripted.Option
	if m.Script != "" {
		s, err := scripted.ParseFile(m.Script)
		if err != nil {
			return nil, fmt.Errorf("--script: %w", err)
		}
		scriptOpts = append(scriptOpts, scripted.WithScript(s))
	}
	byName := map[string]provider.Provider{provider.ScriptedName: reliable.Priced(scripted.New(scriptOpts...), cat)}

	found, err := providerSettings(m, os.Getenv)
	if err != nil {
		return nil, err
	}
	credentials := map[string]string{}
	var defaults []string // default models, in order of preference
	for _, d := range providers.All() {
		credentials[d.Name] = d.Credential()
		s, ok := found[d.Name]
		if !ok {
			continue
		}
		p, err := newProvider(d, s, m, client, cfg.MaxTokens)
		if err != nil {
			return nil, err
		}
		byName[d.Name] = wrap(p)
		if d.DefaultModel != "" {
			defaults = append(defaults, d.DefaultModel)
		}
	}
	if _, ok := byName[openai.CompatibleName]; ok {
		for _, name := range m.LocalModels {
			if err := cat.AddLocal(name, openai.CompatibleName); err != nil {
				return nil, fmt.Errorf("--local-models: %w", err)
			}
		}
		// A model the catalog does not know is taken to be the local
		// server's, so `--model llama3.2` just works against Ollama.
		if _, known := cat.Lookup(cfg.Model); cfg.Model != "" && !known {
			if err := cat.AddLocal(cfg.Model, openai.CompatibleName); err != nil {
				return nil, err
			}
		}
	}

	def := cfg.Model
	if def == "" && len(defaults) > 0 {
		def = defaults[0]
	}
	if def == "" {
		if _, ok := byName[openai.CompatibleName]; ok {
			return nil, errors.New("an OpenAI-compatible server is configured: name its model with --model (e.g. --model llama3.2)")
		}
		def = provider.ScriptedName
	}
	var router provider.Router = catalog.Router{Catalog: cat, Providers: byName, Default: def, Credentials: credentials}
	if _, _, err := router.Route(""); err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	if chain := m.FallbackModels; len(chain) > 0 {
		if router, err = withFallback(router, def, chain); err != nil {
			return nil, fmt.Errorf("--fallback-models: %w", err)
		}
	}
	if def == provider.ScriptedName {
		log.Warn("SCRIPTED MODEL: no model provider is configured; replies come from a deterministic script, not a language model. Set " + providers.EnableVars() + " for a real one")
	}
	configured := make([]string, 0, len(byName))
	for name := range byName {
		configured = append(configured, name)
	}
	log.Info("models", "default", def, "providers", strings.Join(configured, ","), "catalog_version", cat.Version(), "catalog_updated", cat.Updated())

	return router, nil
}

// fallbackRouter serves the default model (asked for by name or by
// omission) through a fallback chain; other models route as usual.
type fallbackRouter struct {
	provider.Router
	head  string
	chain provider.Provider
}

func withFallback(r provider.Router, def string, models []string) (provider.Router, error) {
	entries := []reliable.Entry{}
	for _, name := range append([]string{def}, models...) {
		p, model, err := r.Route(name)
		if err != nil {
			return nil, err
		}
		entries = append(entries, reliable.Entry{Provider: p, Model: model})
	}
	_, head, _ := r.Route(def)
	return fallbackRouter{Router: r, head: head, chain: reliable.Fallback(entries...)}, nil
}

func (f fallbackRouter) Route(model string) (provider.Provider, string, error) {
	p, name, err := f.Router.Route(model)
	if err != nil || name != f.head {
		return p, name, err
	}
	return f.chain, name, nil
}

// budgetFor is the context budget of a model from the catalog: its
// window less the reserve; unknown windows are never compacted.
func budgetFor(cat *catalog.Catalog, reserve int) func(string) compaction.Budget {
	return func(model string) compaction.Budget {
		m, ok := cat.Lookup(model)
		if !ok {
			return compaction.Budget{}
		}
		return compaction.Budget{ContextWindow: m.ContextWindow, Reserve: reserve}
	}
}

// egressClient returns an HTTP client that sends every request through
// the proxy at spec: an http:// URL, or unix:///path for a proxy listening
// on a Unix socket (plain-HTTP requests go to it in absolute form, HTTPS
// ones through CONNECT, all over that socket).
func egressClient(spec string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if path, ok := strings.CutPrefix(spec, "unix://"); ok {
		if !strings.HasPrefix(path, "/") {
			return nil, fmt.Errorf("--egress-proxy %q: want unix:///absolute/path", spec)
		}
		// The host name is a placeholder: every connection dials the socket.
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "egress-proxy"})
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		return &http.Client{Transport: tr}, nil
	}
	u, err := url.Parse(spec)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("--egress-proxy %q: want a URL such as http://127.0.0.1:3128 or unix:///run/egress.sock", spec)
	}
	tr.Proxy = http.ProxyURL(u)
	return &http.Client{Transport: tr}, nil
}
