package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// Provider names.
const (
	// Name is the Name of a provider made by New.
	Name = "openai"
	// CompatibleName is the Name of a provider made by NewCompatible.
	CompatibleName = "openai-compatible"
)

// DefaultBaseURL is the OpenAI API's base URL, used by New when
// Config.BaseURL is empty.
const DefaultBaseURL = "https://api.openai.com/v1"

// Config configures a Provider.
type Config struct {
	// APIKey is sent as "Authorization: Bearer <key>". New requires a
	// key; NewCompatible sends no Authorization header without one.
	APIKey string
	// KeySource says where APIKey came from (e.g. "$OPENAI_API_KEY"), for
	// the message of a refused key; it never holds the key. Empty:
	// "Config.APIKey".
	KeySource string
	// BaseURL is the API root INCLUDING its version path, exactly like
	// OPENAI_BASE_URL: requests go to BaseURL + "/chat/completions". For
	// example "https://api.openai.com/v1", Ollama's
	// "http://localhost:11434/v1", vLLM's "http://localhost:8000/v1" or
	// llama.cpp's "http://localhost:8080/v1". New falls back to
	// DefaultBaseURL; NewCompatible requires it.
	BaseURL string
	// HTTPClient makes the requests; nil means a plain &http.Client{}
	// with no timeout (the call's context is the only deadline). Callers
	// set it to route through an egress proxy.
	HTTPClient *http.Client
	// DefaultModel is used when Request.Model is empty.
	DefaultModel string
	// MaxTokens caps the output when Request.MaxTokens is 0; 0 sends no
	// cap, leaving the server's default.
	MaxTokens int
}

// Provider is a model served by the Chat Completions API, either OpenAI's
// own (New) or an OpenAI-compatible server's (NewCompatible). It keeps no
// per-call state and is safe for concurrent use.
type Provider struct {
	name       string
	compatible bool
	client     oa.Client
	// key is kept only to scrub it from error messages.
	key string
	// authHint starts the message of a 401 or 403: which key was
	// refused, never the key.
	authHint     string
	tools        *toolCache
	defaultModel string
	maxTokens    int
}

var _ provider.Provider = (*Provider)(nil)

// New returns a provider named "openai" for the OpenAI API. The key is
// Config.APIKey; no key is an error wrapping errs.InvalidArgument. The
// base URL is Config.BaseURL, else DefaultBaseURL. No environment
// variable is read (the operator's wiring reads OPENAI_API_KEY and
// OPENAI_BASE_URL).
func New(cfg Config) (*Provider, error) {
	if cfg.APIKey == "" {
		return nil, configError(Name, cfg, "no API key: set Config.APIKey")
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	return newProvider(Name, false, cfg, "the API key from "+keySource(cfg)+" was refused")
}

// NewCompatible returns a provider named "openai-compatible" for a server
// that speaks the Chat Completions API (Ollama, vLLM, llama.cpp, LM
// Studio, ...). Config.BaseURL is required; Config.APIKey is optional and,
// when empty, no Authorization header is sent. Like New it reads no
// environment variable, so an OPENAI_API_KEY meant for OpenAI never
// reaches another server.
func NewCompatible(cfg Config) (*Provider, error) {
	if cfg.BaseURL == "" {
		return nil, configError(CompatibleName, cfg, "no base URL: set Config.BaseURL to the server's API root, e.g. http://localhost:11434/v1")
	}
	hint := "the API key from " + keySource(cfg) + " was refused"
	if cfg.APIKey == "" {
		hint = "the server wants an API key and Config.APIKey is empty"
	}
	return newProvider(CompatibleName, true, cfg, hint)
}

func newProvider(name string, compatible bool, cfg Config, authHint string) (*Provider, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, configError(name, cfg, "base URL is not an absolute http(s) URL")
	}
	if cfg.MaxTokens < 0 {
		return nil, configError(name, cfg, fmt.Sprintf("max tokens %d is negative", cfg.MaxTokens))
	}
	hc := provider.WithInMemoryBodies(cfg.HTTPClient)
	// The client is built from explicit options only (not oa.NewClient),
	// so no ambient OPENAI_* variable (organization, project, custom
	// headers, another key) leaks into the requests.
	opts := []option.RequestOption{
		option.WithBaseURL(cfg.BaseURL),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	return &Provider{
		name:         name,
		compatible:   compatible,
		client:       oa.Client{Options: opts},
		key:          cfg.APIKey,
		authHint:     authHint,
		tools:        newToolCache(),
		defaultModel: cfg.DefaultModel,
		maxTokens:    cfg.MaxTokens,
	}, nil
}

// keySource names where the key came from, for the message of a refused
// key.
func keySource(cfg Config) string {
	if cfg.KeySource != "" {
		return cfg.KeySource
	}
	return "Config.APIKey"
}

func configError(name string, cfg Config, msg string) error {
	return &provider.Error{Provider: name, Model: cfg.DefaultModel, Kind: errs.InvalidArgument, Message: msg}
}

// Name implements provider.Provider: "openai" or "openai-compatible".
func (p *Provider) Name() string { return p.name }

// Complete implements provider.Provider. With Request.OnText it streams;
// otherwise it makes one plain call. Failures are *provider.Error values,
// except a done ctx, which returns ctx.Err().
func (p *Provider) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	if req == nil {
		return nil, &provider.Error{Provider: p.name, Model: p.defaultModel, Kind: errs.InvalidArgument, Message: "nil request"}
	}
	model := req.Model
	if model == "" {
		model = p.defaultModel
	}
	params, err := p.params(req, model)
	if err != nil {
		return nil, err
	}
	if req.OnText != nil {
		return p.stream(ctx, model, params, req.OnText)
	}
	body, err := p.encode(model, params)
	if err != nil {
		return nil, err
	}
	var call callRecorder
	var res chatCompletion
	if err := p.client.Post(ctx, "chat/completions", body, &res, call.option()); err != nil {
		return nil, p.callError(ctx, model, err, &call)
	}
	return p.fromCompletion(model, &res)
}

// encode is the request body: params, then its tools as toolsJSON
// encoded them. It fails only on a value encoding/json cannot write,
// which params never builds.
func (p *Provider) encode(model string, params *chatRequest) ([]byte, error) {
	b, err := json.Marshal(params)
	if err != nil {
		return nil, p.errorf(model, errs.InvalidArgument, "encoding the request: %v", err)
	}
	if len(params.tools) == 0 {
		return b, nil
	}
	// b is an object with at least "model" and "messages": the tools
	// go before its closing brace.
	out := make([]byte, 0, len(b)+len(`,"tools":`)+len(params.tools))
	out = append(out, b[:len(b)-1]...)
	out = append(out, `,"tools":`...)
	out = append(out, params.tools...)
	return append(out, '}'), nil
}

// WireRequest returns the JSON body Complete would POST to
// /chat/completions for req (in its non-streaming form), without sending
// it. It is for benchmarks and debugging; it fails, with a
// *provider.Error, exactly when Complete would reject req before calling.
func (p *Provider) WireRequest(req *provider.Request) ([]byte, error) {
	if req == nil {
		return nil, &provider.Error{Provider: p.name, Model: p.defaultModel, Kind: errs.InvalidArgument, Message: "nil request"}
	}
	model := req.Model
	if model == "" {
		model = p.defaultModel
	}
	params, err := p.params(req, model)
	if err != nil {
		return nil, err
	}
	return p.encode(model, params)
}

// callRecorder captures, for one call, the HTTP response (status, headers,
// an error body) and whether reading the body failed, so that a failure is
// classified by what happened on the wire rather than by error strings.
type callRecorder struct {
	res     *http.Response
	readErr error
}

func (c *callRecorder) option() option.RequestOption {
	return option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		res, err := next(req)
		if res != nil {
			c.res = res
			if res.Body != nil {
				res.Body = &recordingBody{ReadCloser: res.Body, c: c}
			}
		}
		return res, err
	})
}

// recordingBody notes the first read error other than io.EOF.
type recordingBody struct {
	io.ReadCloser
	c *callRecorder
}

func (b *recordingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && b.c.readErr == nil {
		b.c.readErr = err
	}
	return n, err
}
