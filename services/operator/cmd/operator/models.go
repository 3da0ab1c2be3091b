package main

import (
	"context"
	"errors"
	"flag"
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

// modelFlags configure the model side: providers, catalog, reliability
// and context strategy.
type modelFlags struct {
	anthropicKeyFile, openaiKeyFile, geminiKeyFile, compatibleKeyFile string
	anthropicBaseURL, openaiBaseURL, geminiBaseURL, compatibleURL     string
	openaiAPI                                                         string
	egressProxy                                                       string
	catalogFile                                                       string
	localModels                                                       string
	fallback                                                          string
	retries                                                           int
	compaction                                                        string
	reserve                                                           int
}

func (m *modelFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&m.anthropicKeyFile, "anthropic-key-file", "", "file holding the Anthropic API key (default: $ANTHROPIC_API_KEY)")
	fs.StringVar(&m.openaiKeyFile, "openai-key-file", "", "file holding the OpenAI API key (default: $OPENAI_API_KEY)")
	fs.StringVar(&m.geminiKeyFile, "gemini-key-file", "", "file holding the Gemini API key (default: $GEMINI_API_KEY, then $GOOGLE_API_KEY)")
	fs.StringVar(&m.compatibleKeyFile, "compatible-key-file", "", "file holding the key of the OpenAI-compatible server, if it needs one")
	fs.StringVar(&m.anthropicBaseURL, "anthropic-base-url", "", "Anthropic API base URL (default: $ANTHROPIC_BASE_URL, else the public API)")
	fs.StringVar(&m.openaiBaseURL, "openai-base-url", "", "OpenAI API base URL, with /v1 (default: $OPENAI_BASE_URL, else the public API)")
	fs.StringVar(&m.geminiBaseURL, "gemini-base-url", "", "Gemini API base URL (default: $GOOGLE_GEMINI_BASE_URL, else the public API)")
	fs.StringVar(&m.compatibleURL, "compatible-base-url", "", "base URL of an OpenAI-compatible server such as Ollama or vLLM, e.g. http://127.0.0.1:11434/v1 (default: $OPENAI_BASE_URL when no OpenAI key is set)")
	fs.StringVar(&m.openaiAPI, "openai-api", "chat", "OpenAI API for OpenAI models: chat (Chat Completions) or responses (Responses, chained per session)")
	fs.StringVar(&m.egressProxy, "egress-proxy", "", "send all model traffic through this HTTP proxy: http://HOST:PORT, or unix:///PATH for a proxy on a Unix socket (what the environment service gives a sandbox) (default: $HTTPS_PROXY)")
	fs.StringVar(&m.catalogFile, "catalog", "", "model catalog file adding to or replacing the built-in one (same format as catalog/models.json)")
	fs.StringVar(&m.localModels, "local-models", "", "comma-separated model names served by the OpenAI-compatible server (added to the catalog, free)")
	fs.StringVar(&m.fallback, "fallback-models", "", "comma-separated models tried in order when the default model keeps failing with retryable errors")
	fs.IntVar(&m.retries, "model-retries", reliable.DefaultPolicy().MaxAttempts-1, "retries of a model call after a transient error (429, 5xx, reset), with backoff and Retry-After")
	fs.StringVar(&m.compaction, "compaction", compaction.NameSliding, "context strategy: "+strings.Join(compaction.Names(), ", "))
	fs.IntVar(&m.reserve, "context-reserve", 8192, "tokens of the context window kept free for the response")
}

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

// models builds the catalog router with every provider that has
// credentials, each wrapped with retries and pricing, and the context
// strategy. It returns the catalog for budgets.
func models(f *flags, log *slog.Logger) (provider.Router, *catalog.Catalog, compaction.Strategy, error) {
	m := &f.models
	cat, err := catalog.Load(m.catalogFile)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--catalog: %w", err)
	}
	client := http.DefaultClient
	if m.egressProxy != "" {
		c, err := egressClient(m.egressProxy)
		if err != nil {
			return nil, nil, nil, err
		}
		client = c
		log.Info("model traffic through the egress proxy", "proxy", m.egressProxy)
	}
	policy := reliable.DefaultPolicy()
	policy.MaxAttempts = max(m.retries, 0) + 1
	wrap := func(p provider.Provider) provider.Provider {
		return reliable.Priced(reliable.Retry(p, policy, log), cat)
	}
	providers := map[string]provider.Provider{provider.ScriptedName: reliable.Priced(scripted.New(f.scriptOpts...), cat)}

	if key, err := keyFrom(m.anthropicKeyFile, anthropic.APIKeyEnv); err != nil {
		return nil, nil, nil, fmt.Errorf("--anthropic-key-file: %w", err)
	} else if key != "" {
		p, err := anthropic.New(anthropic.Config{APIKey: key, BaseURL: m.anthropicBaseURL, HTTPClient: client, MaxTokens: f.maxTokens})
		if err != nil {
			return nil, nil, nil, err
		}
		providers[anthropic.Name] = wrap(p)
	}
	openaiKey, err := keyFrom(m.openaiKeyFile, openai.EnvAPIKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--openai-key-file: %w", err)
	}
	if openaiKey != "" {
		var p provider.Provider
		switch m.openaiAPI {
		case "chat":
			p, err = openai.New(openai.Config{APIKey: openaiKey, BaseURL: m.openaiBaseURL, HTTPClient: client, MaxTokens: f.maxTokens})
		case "responses":
			p, err = openairesponses.New(openairesponses.Config{APIKey: openaiKey, BaseURL: m.openaiBaseURL, HTTPClient: client, MaxTokens: f.maxTokens})
		default:
			return nil, nil, nil, fmt.Errorf("--openai-api %q: want chat or responses", m.openaiAPI)
		}
		if err != nil {
			return nil, nil, nil, err
		}
		providers[openai.Name] = wrap(p)
	}
	compatURL := m.compatibleURL
	if compatURL == "" && openaiKey == "" {
		compatURL = os.Getenv("OPENAI_BASE_URL")
	}
	if compatURL != "" {
		key, err := keyFrom(m.compatibleKeyFile)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--compatible-key-file: %w", err)
		}
		p, err := openai.NewCompatible(openai.Config{APIKey: key, BaseURL: compatURL, HTTPClient: client, MaxTokens: f.maxTokens})
		if err != nil {
			return nil, nil, nil, err
		}
		providers[openai.CompatibleName] = wrap(p)
		for _, name := range splitList(m.localModels) {
			if err := cat.AddLocal(name, openai.CompatibleName); err != nil {
				return nil, nil, nil, fmt.Errorf("--local-models: %w", err)
			}
		}
		// A model the catalog does not know is taken to be the local
		// server's, so `--model llama3.2` just works against Ollama.
		if _, known := cat.Lookup(f.model); f.model != "" && !known {
			if err := cat.AddLocal(f.model, openai.CompatibleName); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	if key, err := keyFrom(m.geminiKeyFile, gemini.EnvAPIKey, "GOOGLE_API_KEY"); err != nil {
		return nil, nil, nil, fmt.Errorf("--gemini-key-file: %w", err)
	} else if key != "" {
		p, err := gemini.New(gemini.Config{APIKey: key, BaseURL: m.geminiBaseURL, HTTPClient: client, MaxTokens: f.maxTokens})
		if err != nil {
			return nil, nil, nil, err
		}
		providers[gemini.Name] = wrap(p)
	}

	def := f.model
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
			return nil, nil, nil, errors.New("an OpenAI-compatible server is configured: name its model with --model (e.g. --model llama3.2)")
		}
		def = provider.ScriptedName
	}
	var router provider.Router = catalog.Router{Catalog: cat, Providers: providers, Default: def, Credentials: credentials}
	if _, _, err := router.Route(""); err != nil {
		return nil, nil, nil, fmt.Errorf("--model: %w", err)
	}
	if chain := splitList(m.fallback); len(chain) > 0 {
		if router, err = withFallback(router, def, chain); err != nil {
			return nil, nil, nil, fmt.Errorf("--fallback-models: %w", err)
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

	var strategy compaction.Strategy
	if m.compaction == compaction.NameSummarize {
		p, model, _ := router.Route("")
		strategy, err = compaction.Parse(m.compaction, p, model, compaction.WithLogger(log))
	} else {
		strategy, err = compaction.Parse(m.compaction, nil, "")
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--compaction: %w", err)
	}
	return router, cat, strategy, nil
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

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
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
