package gemini

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/genai"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// Name is the provider's name.
const Name = "gemini"

// DefaultBaseURL is the Gemini Developer API's base URL, used when
// Config.BaseURL is empty (the API version is appended).
const DefaultBaseURL = "https://generativelanguage.googleapis.com/"

// Config configures a Provider.
type Config struct {
	// APIKey is the Gemini API key. Required.
	APIKey string
	// KeySource says where APIKey came from (e.g. "$GEMINI_API_KEY"), for
	// the message of a refused key; it never holds the key. Empty:
	// "Config.APIKey".
	KeySource string
	// BaseURL replaces DefaultBaseURL (the API version, v1beta, is
	// appended). Empty means DefaultBaseURL.
	BaseURL string
	// HTTPClient sends the requests; nil means a new default client. Its
	// transport is used as it is (for instance to reach an egress proxy).
	HTTPClient *http.Client
	// DefaultModel is used when Request.Model is empty, e.g.
	// "gemini-2.5-flash".
	DefaultModel string
	// MaxTokens caps the output when Request.MaxTokens is 0; 0 leaves the
	// model's own limit.
	MaxTokens int
}

// Provider is Google Gemini through the Gemini Developer API. It keeps no
// state between calls and is safe for concurrent use.
type Provider struct {
	models       *genai.Models
	apiKey       string
	keySource    string
	defaultModel string
	maxTokens    int
}

var _ provider.Provider = (*Provider)(nil)

// New returns a Gemini provider. It fails when no API key is configured.
// It makes no network call, and takes nothing from the environment: the
// key and base URL it passes the SDK are always explicit, so the SDK's own
// GEMINI_API_KEY, GOOGLE_API_KEY and GOOGLE_GEMINI_BASE_URL are not used
// (the operator's wiring reads the first and last).
func New(cfg Config) (*Provider, error) {
	key, source := cfg.APIKey, cfg.KeySource
	if source == "" {
		source = "Config.APIKey"
	}
	if key == "" {
		return nil, &provider.Error{
			Provider: Name,
			Model:    cfg.DefaultModel,
			Kind:     errs.InvalidArgument,
			Message:  "no API key: set Config.APIKey",
		}
	}
	if cfg.MaxTokens < 0 {
		return nil, &provider.Error{
			Provider: Name,
			Model:    cfg.DefaultModel,
			Kind:     errs.InvalidArgument,
			Message:  fmt.Sprintf("max tokens %d is negative", cfg.MaxTokens),
		}
	}
	hc := &http.Client{}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient
		hc = &c
	}
	hc.Transport = &captureTransport{base: hc.Transport}
	base := cfg.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	one := int32(1)
	client, err := genai.NewClient(context.Background(), &genai.ClientConfig{
		APIKey:     key,
		Backend:    genai.BackendGeminiAPI,
		HTTPClient: hc,
		HTTPOptions: genai.HTTPOptions{
			BaseURL: base,
			// One attempt: retries live outside providers. (A nil
			// RetryOptions also means one attempt in v1.77.0; this says so
			// explicitly, whatever a later version's default.)
			RetryOptions: &genai.HTTPRetryOptions{Attempts: &one},
		},
	})
	if err != nil {
		// The SDK's message prints its whole config, key included.
		return nil, &provider.Error{
			Provider: Name,
			Model:    cfg.DefaultModel,
			Kind:     errs.InvalidArgument,
			Message:  "cannot create the Gemini client: " + redact(sdkConfigError(err), key),
		}
	}
	return &Provider{
		models:       client.Models,
		apiKey:       key,
		keySource:    source,
		defaultModel: cfg.DefaultModel,
		maxTokens:    cfg.MaxTokens,
	}, nil
}

// Name implements provider.Provider; it is always "gemini".
func (p *Provider) Name() string { return Name }

// Complete implements provider.Provider: one generateContent call, or one
// streamGenerateContent call when req.OnText is set.
func (p *Provider) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	if req == nil {
		return nil, p.invalid(p.defaultModel, "nil request")
	}
	model := req.Model
	if model == "" {
		model = p.defaultModel
	}
	if model == "" {
		return nil, p.invalid("", "no model named and no default model configured")
	}
	contents, err := buildContents(req.Messages)
	if err != nil {
		return nil, p.invalid(model, err.Error())
	}
	config, err := p.buildConfig(req)
	if err != nil {
		return nil, p.invalid(model, err.Error())
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s model %s: %w", Name, model, err)
	}
	c := &capture{}
	cctx := context.WithValue(ctx, captureKey{}, c)
	a := newAssembler(model, countToolUses(req.Messages), req.OnText)
	if req.OnText == nil {
		resp, err := p.models.GenerateContent(cctx, model, contents, config)
		if err != nil {
			return nil, p.mapError(ctx, model, err, c)
		}
		a.add(resp)
		return a.finish(false, p.failure(model))
	}
	for chunk, err := range p.models.GenerateContentStream(cctx, model, contents, config) {
		if err != nil {
			return nil, p.mapError(ctx, model, err, c)
		}
		a.add(chunk)
	}
	if err := ctx.Err(); err != nil && !a.complete() {
		return nil, fmt.Errorf("%s model %s: %w", Name, model, err)
	}
	return a.finish(true, p.failure(model))
}

func (p *Provider) invalid(model, msg string) error {
	return &provider.Error{Provider: Name, Model: model, Kind: errs.InvalidArgument, Message: msg}
}

// failure returns a constructor of response-level errors (no HTTP status).
func (p *Provider) failure(model string) func(kind *errs.Kind, msg string) error {
	return func(kind *errs.Kind, msg string) error {
		return &provider.Error{Provider: Name, Model: model, Kind: kind, Message: redact(msg, p.apiKey)}
	}
}

// sdkConfigError is the SDK's client error without the dump of the client
// config that follows "ClientConfig:".
func sdkConfigError(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	s, _, _ = strings.Cut(s, " ClientConfig:")
	return strings.TrimSuffix(strings.TrimSpace(s), ".")
}

// redact removes the key from s, should an SDK message ever echo it.
func redact(s, key string) string {
	if key == "" {
		return s
	}
	return strings.ReplaceAll(s, key, "[redacted]")
}
