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

	"github.com/secbear/neuron/services/operator/catalog"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/provider/anthropic"
	"github.com/secbear/neuron/services/operator/provider/gemini"
	"github.com/secbear/neuron/services/operator/provider/openai"
	"github.com/secbear/neuron/services/operator/provider/openairesponses"
	"github.com/secbear/neuron/services/operator/provider/reliable"
	"github.com/secbear/neuron/services/operator/provider/scripted"
)

// credentials names what enables each provider, for error messages.
var credentials = map[string]string{
	anthropic.Name:        "ANTHROPIC_API_KEY or --anthropic-key-file",
	openai.Name:           "OPENAI_API_KEY or --openai-key-file",
	gemini.Name:           "GEMINI_API_KEY or --gemini-key-file",
	openai.CompatibleName: "OPENAI_BASE_URL or --compatible-base-url",
}

// defaultModels is the default model per provider, in order of preference
// when --model is not given.
var defaultModels = []struct{ provider, model string }{
	{anthropic.Name, "claude-sonnet-4-5"},
	{openai.Name, "gpt-4.1-mini"},
	{gemini.Name, "gemini-2.5-flash"},
}

// keyFrom reads a key file, else the first env var set.
func keyFrom(file string, env ...string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		k := strings.TrimSpace(string(b))
		if k == "" {
			return "", fmt.Errorf("%s is empty", file)
		}
		return k, nil
	}
	for _, e := range env {
		if v := strings.TrimSpace(os.Getenv(e)); v != "" {
			return v, nil
		}
	}
	return "", nil
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
	providers := map[string]provider.Provider{provider.ScriptedName: reliable.Priced(scripted.New(scriptOpts...), cat)}

	if key, err := keyFrom(m.AnthropicKeyFile, anthropic.APIKeyEnv); err != nil {
		return nil, fmt.Errorf("--anthropic-key-file: %w", err)
	} else if key != "" {
		p, err := anthropic.New(anthropic.Config{APIKey: key, BaseURL: m.AnthropicBaseURL, HTTPClient: client, MaxTokens: cfg.MaxTokens})
		if err != nil {
			return nil, err
		}
		providers[anthropic.Name] = wrap(p)
	}
	openaiKey, err := keyFrom(m.OpenAIKeyFile, openai.EnvAPIKey)
	if err != nil {
		return nil, fmt.Errorf("--openai-key-file: %w", err)
	}
	if openaiKey != "" {
		var p provider.Provider
		switch m.OpenAIAPI {
		case "chat", "":
			p, err = openai.New(openai.Config{APIKey: openaiKey, BaseURL: m.OpenAIBaseURL, HTTPClient: client, MaxTokens: cfg.MaxTokens})
		case "responses":
			p, err = openairesponses.New(openairesponses.Config{APIKey: openaiKey, BaseURL: m.OpenAIBaseURL, HTTPClient: client, MaxTokens: cfg.MaxTokens})
		default:
			return nil, fmt.Errorf("--openai-api %q: want chat or responses", m.OpenAIAPI)
		}
		if err != nil {
			return nil, err
		}
		providers[openai.Name] = wrap(p)
	}
	compatURL := m.CompatibleBaseURL
	if compatURL == "" && openaiKey == "" {
		compatURL = os.Getenv("OPENAI_BASE_URL")
	}
	if compatURL != "" {
		key, err := keyFrom(m.CompatibleKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--compatible-key-file: %w", err)
		}
		p, err := openai.NewCompatible(openai.Config{APIKey: key, BaseURL: compatURL, HTTPClient: client, MaxTokens: cfg.MaxTokens})
		if err != nil {
			return nil, err
		}
		providers[openai.CompatibleName] = wrap(p)
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
	if key, err := keyFrom(m.GeminiKeyFile, gemini.EnvAPIKey, "GOOGLE_API_KEY"); err != nil {
		return nil, fmt.Errorf("--gemini-key-file: %w", err)
	} else if key != "" {
		p, err := gemini.New(gemini.Config{APIKey: key, BaseURL: m.GeminiBaseURL, HTTPClient: client, MaxTokens: cfg.MaxTokens})
		if err != nil {
			return nil, err
		}
		providers[gemini.Name] = wrap(p)
	}

	def := cfg.Model
	if def == "" {
		for _, d := range defaultModels {
			if _, ok := providers[d.provider]; ok {
				def = d.model
				break
			}
		}
	}
	if def == "" {
		if _, ok := providers[openai.CompatibleName]; ok {
			return nil, errors.New("an OpenAI-compatible server is configured: name its model with --model (e.g. --model llama3.2)")
		}
		def = provider.ScriptedName
	}
	var router provider.Router = catalog.Router{Catalog: cat, Providers: providers, Default: def, Credentials: credentials}
	if _, _, err := router.Route(""); err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	if chain := m.FallbackModels; len(chain) > 0 {
		if router, err = withFallback(router, def, chain); err != nil {
			return nil, fmt.Errorf("--fallback-models: %w", err)
		}
	}
	if def == provider.ScriptedName {
		log.Warn("SCRIPTED MODEL: no model provider is configured; replies come from a deterministic script, not a language model. Set ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY or OPENAI_BASE_URL for a real one")
	}
	configured := make([]string, 0, len(providers))
	for name := range providers {
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
