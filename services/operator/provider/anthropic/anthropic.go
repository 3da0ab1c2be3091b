package anthropic

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// Name is the provider's Name.
const Name = "anthropic"

// DefaultMaxTokens is the output cap when neither the request nor the
// Config sets one: the Messages API requires max_tokens.
const DefaultMaxTokens = 4096

// noTimeout is the per-request timeout handed to the SDK for non-streaming
// calls. The SDK otherwise imposes its own 10-minute timeout on them (and
// refuses large max_tokens outright); the only deadline of a call is its
// context's.
const noTimeout = 100 * 365 * 24 * time.Hour

// Config configures a Provider.
type Config struct {
	// APIKey is the Anthropic API key. Required.
	APIKey string
	// KeySource says where APIKey came from (e.g. "$ANTHROPIC_API_KEY"),
	// for the message of a refused key; it never holds the key. Empty:
	// "the configured API key".
	KeySource string
	// BaseURL is the API's base URL, e.g. "https://api.anthropic.com";
	// empty means the SDK's default, https://api.anthropic.com.
	BaseURL string
	// HTTPClient sends the requests, e.g. through an egress proxy; nil
	// means a plain client with no timeout of its own.
	HTTPClient *http.Client
	// DefaultModel is sent when a Request names no model.
	DefaultModel string
	// MaxTokens caps a response when Request.MaxTokens is 0; 0 means
	// DefaultMaxTokens.
	MaxTokens int
}

// Provider is a provider.Provider backed by the Anthropic Messages API. It
// is safe for concurrent use.
type Provider struct {
	client       sdk.Client
	defaultModel string
	maxTokens    int
	// keySource says where the API key came from, for the message of a
	// refused key. It never holds the key.
	keySource string
}

var _ provider.Provider = (*Provider)(nil)

// New returns a Provider. The API key is cfg.APIKey; without one New
// fails. The base URL is cfg.BaseURL, else the SDK's default. Nothing is
// read from the environment: the SDK's own environment and credential
// chain (keys, auth tokens, base URL, profiles, custom headers) is
// switched off. Errors wrap errs.InvalidArgument and never contain the
// key.
func New(cfg Config) (*Provider, error) {
	key, keySource := cfg.APIKey, "the configured API key"
	if cfg.KeySource != "" {
		keySource = "the API key from " + cfg.KeySource
	}
	if key == "" {
		return nil, fmt.Errorf("anthropic provider: no API key in the configuration: %w", errs.InvalidArgument)
	}
	if cfg.MaxTokens < 0 {
		return nil, fmt.Errorf("anthropic provider: max tokens %d is negative: %w", cfg.MaxTokens, errs.InvalidArgument)
	}
	maxTokens := cfg.MaxTokens
	if maxTokens == 0 {
		maxTokens = DefaultMaxTokens
	}
	hc := provider.WithInMemoryBodies(cfg.HTTPClient)
	opts := []option.RequestOption{
		option.WithoutEnvironmentDefaults(),
		option.WithAPIKey(key),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
	}
	if base := cfg.BaseURL; base != "" {
		u, err := url.Parse(base)
		if err != nil {
			return nil, fmt.Errorf("anthropic provider: base URL is not a URL: %w", errs.InvalidArgument)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("anthropic provider: base URL %q is not an absolute http(s) URL: %w",
				u.Redacted(), errs.InvalidArgument)
		}
		opts = append(opts, option.WithBaseURL(base))
	}
	return &Provider{
		client:       sdk.NewClient(opts...),
		defaultModel: cfg.DefaultModel,
		maxTokens:    maxTokens,
		keySource:    keySource,
	}, nil
}

// Name implements provider.Provider; it is always "anthropic".
func (p *Provider) Name() string { return Name }

// Complete implements provider.Provider. With req.OnText set it streams
// (Messages.NewStreaming) and calls OnText for every text delta; otherwise
// it makes one non-streaming call (Messages.New). Failures are
// *provider.Error, except a done ctx, which yields an error wrapping
// ctx.Err().
func (p *Provider) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	if req == nil {
		return nil, p.invalid("", "nil request")
	}
	model := req.Model
	if model == "" {
		model = p.defaultModel
	}
	if model == "" {
		return nil, p.invalid("", "no model named and no default model configured")
	}
	params, err := p.params(model, req)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("anthropic model %s: %w", model, err)
	}
	if req.OnText != nil {
		return p.stream(ctx, model, params, req.OnText)
	}
	msg, err := p.client.Messages.New(ctx, params,
		option.WithRequestTimeout(noTimeout),
		option.WithHeaderDel("X-Stainless-Timeout"))
	if err != nil {
		return nil, p.callError(ctx, model, err)
	}
	return p.response(model, msg)
}

// response converts a complete Message.
func (p *Provider) response(model string, msg *sdk.Message) (*provider.Response, error) {
	if msg == nil || msg.Type != "message" {
		return nil, p.malformed(model, `the response is not a message (want "type":"message")`)
	}
	resp := &provider.Response{
		Model: string(msg.Model),
		Usage: usage(msg.Usage.InputTokens, msg.Usage.OutputTokens,
			msg.Usage.CacheReadInputTokens, msg.Usage.CacheCreationInputTokens),
	}
	if resp.Model == "" {
		resp.Model = model
	}
	for _, b := range msg.Content {
		switch b.Type {
		case "text":
			if b.Text != "" {
				resp.Parts = append(resp.Parts, provider.Part{Text: b.Text})
			}
		case "tool_use":
			resp.Parts = append(resp.Parts, provider.Part{ToolUse: &provider.ToolUse{
				ID: b.ID, Name: b.Name, Input: toolInput(b.Input),
			}})
		}
	}
	resp.Stop = stopReason(msg.StopReason, resp)
	return resp, nil
}

// toolInput is a copy of the model's tool input, {} when absent.
func toolInput(raw []byte) []byte {
	if len(raw) == 0 {
		return []byte("{}")
	}
	return append([]byte(nil), raw...)
}

// usage converts the API's token counts; negative counts (never sent) are
// zero.
func usage(in, out, cacheRead, cacheWrite int64) provider.Usage {
	u := func(n int64) uint64 { return uint64(max(n, 0)) }
	return provider.Usage{
		InputTokens:      u(in),
		OutputTokens:     u(out),
		CacheReadTokens:  u(cacheRead),
		CacheWriteTokens: u(cacheWrite),
	}
}

// stopReason maps the API's stop_reason:
//
//   - end_turn, stop_sequence: StopEndTurn;
//   - tool_use: StopToolUse;
//   - max_tokens, model_context_window_exceeded: StopMaxTokens;
//   - refusal: StopContentFilter;
//   - pause_turn: StopEndTurn. The API pauses a long turn only when it runs
//     server-side tools, which this provider never offers; should it happen
//     anyway, the partial answer is final rather than resumed.
//
// An absent or unknown reason is StopToolUse when the response has tool
// calls, else StopEndTurn.
func stopReason(r sdk.StopReason, resp *provider.Response) provider.StopReason {
	switch r {
	case sdk.StopReasonEndTurn, sdk.StopReasonStopSequence, sdk.StopReasonPauseTurn:
		return provider.StopEndTurn
	case sdk.StopReasonToolUse:
		return provider.StopToolUse
	case sdk.StopReasonMaxTokens, sdk.StopReasonModelContextWindowExceeded:
		return provider.StopMaxTokens
	case sdk.StopReasonRefusal:
		return provider.StopContentFilter
	}
	if len(resp.ToolUses()) > 0 {
		return provider.StopToolUse
	}
	return provider.StopEndTurn
}

// invalid is a request this provider cannot express.
func (p *Provider) invalid(model, format string, args ...any) error {
	return &provider.Error{Provider: Name, Model: model, Kind: errs.InvalidArgument,
		Message: fmt.Sprintf(format, args...)}
}

// malformed is a response this provider cannot read.
func (p *Provider) malformed(model, format string, args ...any) error {
	return &provider.Error{Provider: Name, Model: model, Kind: errs.NonRetryable,
		Message: "malformed response: " + fmt.Sprintf(format, args...)}
}

// ctxError returns ctx's error, wrapped, when ctx is done.
func ctxError(ctx context.Context, model string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("anthropic model %s: %w", model, err)
	}
	return nil
}
