package openairesponses

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// Name is the provider's Name.
const Name = "openai-responses"

// DefaultBaseURL is the OpenAI API's base URL, used when Config.BaseURL
// is empty.
const DefaultBaseURL = "https://api.openai.com/v1"

// Config configures a Provider.
type Config struct {
	// APIKey authenticates to the API. A key is required: a server that
	// needs none takes any placeholder.
	APIKey string
	// BaseURL is the API's base URL including its version path, such as
	// "https://api.openai.com/v1"; empty means DefaultBaseURL.
	BaseURL string
	// HTTPClient sends the requests, e.g. through an egress proxy; nil
	// means a plain client without timeouts (the call's context bounds
	// it).
	HTTPClient *http.Client
	// DefaultModel is used when a request names no model.
	DefaultModel string
	// MaxTokens caps a response's output when the request sets no cap; 0
	// leaves it to the API.
	MaxTokens int
	// DisableChain turns previous_response_id chaining off: every call
	// sends the whole conversation, with store=false so the API keeps
	// nothing.
	DisableChain bool
	// MaxSessions bounds how many sessions' chains are remembered, least
	// recently used first out; 0 means DefaultMaxSessions.
	MaxSessions int
}

// Provider is a provider.Provider over the OpenAI Responses API. It is
// safe for concurrent use.
type Provider struct {
	client responses.ResponseService
	// key is kept only to scrub it from error messages.
	key       string
	model     string
	maxTokens int
	// sessions is nil when chaining is disabled.
	sessions *sessions
}

var _ provider.Provider = (*Provider)(nil)

// New returns a Provider. It fails, wrapping errs.InvalidArgument, when no
// API key is configured; the error never holds a key. It reads no
// environment variable: the client is built from explicit options only,
// so neither OPENAI_API_KEY, OPENAI_BASE_URL nor any other ambient
// OPENAI_* setting (organization, project, custom headers) reaches the
// requests.
func New(cfg Config) (*Provider, error) {
	key := cfg.APIKey
	if key == "" {
		return nil, fmt.Errorf("%s: no API key: set Config.APIKey: %w", Name, errs.InvalidArgument)
	}
	if cfg.MaxTokens < 0 {
		return nil, fmt.Errorf("%s: MaxTokens %d is negative: %w", Name, cfg.MaxTokens, errs.InvalidArgument)
	}
	if cfg.MaxSessions < 0 {
		return nil, fmt.Errorf("%s: MaxSessions %d is negative: %w", Name, cfg.MaxSessions, errs.InvalidArgument)
	}
	hc := provider.WithInMemoryBodies(cfg.HTTPClient)
	opts := []option.RequestOption{
		option.WithAPIKey(key),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
	}
	base := cfg.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	opts = append(opts, option.WithBaseURL(base))
	p := &Provider{
		client:    responses.NewResponseService(opts...),
		key:       key,
		model:     cfg.DefaultModel,
		maxTokens: cfg.MaxTokens,
	}
	if !cfg.DisableChain {
		n := cfg.MaxSessions
		if n == 0 {
			n = DefaultMaxSessions
		}
		p.sessions = newSessions(n)
	}
	return p, nil
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return Name }

// Complete implements provider.Provider.
func (p *Provider) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	model := req.Model
	if model == "" {
		model = p.model
	}
	invalid := func(format string, args ...any) error {
		return &provider.Error{Provider: Name, Model: model, Kind: errs.InvalidArgument, Message: fmt.Sprintf(format, args...)}
	}
	if model == "" {
		return nil, invalid("no model: the request names none and the provider has no default model")
	}
	if req.MaxTokens < 0 {
		return nil, invalid("max tokens %d is negative", req.MaxTokens)
	}
	perMessage, err := inputItems(req.Messages)
	if err != nil {
		return nil, invalid("%v", err)
	}
	toolParams, err := tools(req.Tools)
	if err != nil {
		return nil, invalid("%v", err)
	}

	params := responses.ResponseNewParams{
		Model:    model,
		Tools:    toolParams,
		Metadata: metadata(req.Metadata),
	}
	if req.System != "" {
		params.Instructions = openai.String(req.System)
	}
	if n := firstNonZero(req.MaxTokens, p.maxTokens); n > 0 {
		params.MaxOutputTokens = openai.Int(int64(n))
	}
	if t := req.Temperature; t != nil {
		params.Temperature = openai.Float(*t)
	}
	if req.ReasoningEffort != "" {
		params.Reasoning = shared.ReasoningParam{Effort: shared.ReasoningEffort(req.ReasoningEffort)}
	}
	if req.OutputSchema != nil {
		params.Text = responses.ResponseTextConfigParam{
			Format: responses.ResponseFormatTextConfigParamOfJSONSchema("output", req.OutputSchema),
		}
	}

	chaining := p.sessions != nil && req.SessionID != ""
	params.Store = openai.Bool(chaining)
	full := slices.Concat(perMessage...)
	if len(full) == 0 {
		return nil, invalid("the request has no content to send")
	}
	setInput(&params, full, "")
	var prev chain
	if chaining {
		if c, ok := p.sessions.get(req.SessionID); ok && len(req.Messages) > c.covered && prefixHash(req.Messages[:c.covered]) == c.hash {
			if fresh := slices.Concat(perMessage[c.covered:]...); len(fresh) > 0 {
				prev = c
				setInput(&params, fresh, c.responseID)
			}
		}
	}

	res, emitted, err := p.call(ctx, params, req.OnText)
	if err != nil && prev.responseID != "" && !emitted && previousNotFound(err) && ctx.Err() == nil {
		// The stored response is gone (expired or deleted): start a new
		// chain from the whole conversation.
		p.sessions.drop(req.SessionID)
		setInput(&params, full, "")
		res, _, err = p.call(ctx, params, req.OnText)
	}
	if err != nil {
		return nil, p.mapErr(ctx, model, err)
	}
	if res.resp.Model == "" {
		res.resp.Model = model
	}
	if chaining && res.id != "" {
		assistant := []provider.Message{{Role: provider.Assistant, Parts: res.resp.Parts}}
		p.sessions.put(req.SessionID, chain{
			responseID: res.id,
			covered:    len(req.Messages) + 1,
			hash:       prefixHash(req.Messages, assistant),
		})
	}
	return res.resp, nil
}

// firstNonZero returns the first non-zero of a and b.
func firstNonZero(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func setInput(params *responses.ResponseNewParams, items []responses.ResponseInputItemUnionParam, previous string) {
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: items}
	params.PreviousResponseID = param.Opt[string]{}
	if previous != "" {
		params.PreviousResponseID = openai.String(previous)
	}
}

// call runs one API call, streaming when onText is set. emitted reports
// whether onText was called.
func (p *Provider) call(ctx context.Context, params responses.ResponseNewParams, onText func(string)) (res result, emitted bool, err error) {
	if onText != nil {
		return p.stream(ctx, params, onText)
	}
	r, err := p.client.New(ctx, params)
	if err != nil {
		return result{}, false, err
	}
	if r == nil {
		return result{}, false, &malformed{msg: "empty response body"}
	}
	res, err = fromResponse(r)
	return res, false, err
}

// fromResponse converts a complete (non-streamed, or final streamed)
// response.
func fromResponse(r *responses.Response) (result, error) {
	if !r.JSON.ID.Valid() && !r.JSON.Output.Valid() && !r.JSON.Status.Valid() {
		return result{}, &malformed{msg: "the body is not a response object (no id, status or output)"}
	}
	if err := checkStatus(r); err != nil {
		return result{}, err
	}
	items := make([]outItem, 0, len(r.Output))
	for _, it := range r.Output {
		items = append(items, itemFromAPI(it))
	}
	return result{
		resp: finish(r.Status, r.IncompleteDetails.Reason, r.Model, r.Usage, items),
		id:   r.ID,
	}, nil
}

// checkStatus fails for a response that did not complete: failed,
// cancelled, or still running.
func checkStatus(r *responses.Response) error {
	switch r.Status {
	case responses.ResponseStatusCompleted, responses.ResponseStatusIncomplete, "":
		return nil
	case responses.ResponseStatusFailed:
		af := &apiFailure{code: string(r.Error.Code), message: r.Error.Message}
		if af.message == "" {
			af.message = "the response failed without a message"
		}
		return af
	}
	return &apiFailure{code: string(r.Status), message: fmt.Sprintf("the response has status %q, not completed", r.Status)}
}

// errNoEnd is a stream that ended before its final event.
var errNoEnd = errors.New("the stream ended before the response completed")
