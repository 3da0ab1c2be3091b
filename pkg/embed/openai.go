package embed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/secbear/neuron/pkg/errs"
)

// Provider names (Config.Provider, --embedder).
const (
	ProviderOpenAI           = "openai"
	ProviderOpenAICompatible = "openai-compatible"
	ProviderGemini           = "gemini"
	ProviderTest             = "test"
)

// Default models.
const (
	DefaultOpenAIModel = "text-embedding-3-small"
	DefaultGeminiModel = "gemini-embedding-001"
	// DefaultTimeout bounds one Embed call.
	DefaultTimeout = 30 * time.Second
)

// OpenAI embeds with OpenAI's embeddings API (POST /v1/embeddings), or an
// OpenAI-compatible server's (Ollama at http://localhost:11434/v1, vLLM).
type OpenAI struct {
	client     openai.Client
	model      string
	dimensions int
	name       string
}

// NewOpenAI returns an OpenAI embedder for cfg (Provider openai or
// openai-compatible; the latter needs BaseURL and Model, and no API key).
func NewOpenAI(cfg Config) (*OpenAI, error) {
	model := cfg.Model
	if model == "" {
		if cfg.Provider == ProviderOpenAICompatible {
			return nil, fmt.Errorf("--embedder openai-compatible needs --embedder-model (the server's model name, such as nomic-embed-text for Ollama): %w", errs.FailedPrecondition)
		}
		model = DefaultOpenAIModel
	}
	opts := []option.RequestOption{option.WithMaxRetries(1), option.WithRequestTimeout(cfg.timeout())}
	key := cfg.APIKey
	switch {
	case cfg.Provider == ProviderOpenAICompatible:
		if cfg.BaseURL == "" {
			return nil, fmt.Errorf("--embedder openai-compatible needs --embedder-base-url (such as http://localhost:11434/v1 for Ollama): %w", errs.FailedPrecondition)
		}
		if key == "" {
			key = "unused" // local servers take any key
		}
	case key == "":
		return nil, fmt.Errorf("--embedder openai needs an API key: set --embedder-api-key-file or OPENAI_API_KEY: %w", errs.FailedPrecondition)
	}
	opts = append(opts, option.WithAPIKey(key))
	if cfg.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(cfg.BaseURL))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(cfg.HTTPClient))
	}
	return &OpenAI{
		client:     openai.NewClient(opts...),
		model:      model,
		dimensions: cfg.Dimensions,
		name:       cfg.Provider + ":" + model,
	}, nil
}

// Name implements Embedder.
func (o *OpenAI) Name() string { return o.name }

// Embed implements Embedder. OpenAI's API embeds queries and documents
// alike.
func (o *OpenAI) Embed(ctx context.Context, texts []string, _ Purpose) ([][]float32, error) {
	if err := checkTexts(texts); err != nil {
		return nil, err
	}
	params := openai.EmbeddingNewParams{
		Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts},
		Model:          openai.EmbeddingModel(o.model),
		EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat,
	}
	if o.dimensions > 0 {
		params.Dimensions = openai.Int(int64(o.dimensions))
	}
	resp, err := o.client.Embeddings.New(ctx, params)
	if err != nil {
		return nil, o.classify(ctx, err)
	}
	vecs := make([][]float32, len(texts))
	for _, d := range resp.Data {
		if d.Index < 0 || int(d.Index) >= len(texts) || vecs[d.Index] != nil {
			return nil, fmt.Errorf("%s answered an embedding with index %d for %d texts: %w", o.name, d.Index, len(texts), errs.Unavailable)
		}
		v := make([]float32, len(d.Embedding))
		for i, x := range d.Embedding {
			v[i] = float32(x)
		}
		vecs[d.Index] = v
	}
	if len(resp.Data) != len(texts) {
		return nil, fmt.Errorf("%s answered %d embeddings for %d texts: %w", o.name, len(resp.Data), len(texts), errs.Unavailable)
	}
	if err := checkVectors(o.name, vecs, len(texts)); err != nil {
		return nil, err
	}
	return vecs, nil
}

// classify maps an SDK error to an errs kind, keeping the provider's
// message (never the key: the SDK does not echo it).
func (o *OpenAI) classify(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		msg := strings.TrimSpace(apiErr.Message)
		if msg == "" {
			msg = http.StatusText(apiErr.StatusCode)
		}
		return fmt.Errorf("%s: HTTP %d: %s: %w", o.name, apiErr.StatusCode, clip(msg), httpKind(apiErr.StatusCode))
	}
	return fmt.Errorf("%s cannot be reached: %v: %w", o.name, err, errs.Unavailable)
}

// httpKind is the errs kind of an HTTP error status of a provider.
func httpKind(code int) *errs.Kind {
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden || code == http.StatusNotFound:
		return errs.FailedPrecondition // credentials or model: configuration
	case code == http.StatusTooManyRequests || code >= 500:
		return errs.Unavailable
	case code >= 400:
		return errs.InvalidArgument
	}
	return errs.Unavailable
}

// clip shortens a provider's message for an error.
func clip(s string) string {
	const limit = 300
	if len(s) <= limit {
		return s
	}
	return strings.ToValidUTF8(s[:limit], "") + "..."
}
