package embed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/genai"

	"github.com/secbear/neuron/pkg/errs"
)

// Gemini embeds with the Gemini API (models/{model}:batchEmbedContents)
// through the official genai SDK, with task type RETRIEVAL_DOCUMENT for
// documents and RETRIEVAL_QUERY for queries.
type Gemini struct {
	models     *genai.Models
	model      string
	dimensions int
	key        string
	name       string
}

// NewGemini returns a Gemini embedder for cfg (APIKey required).
func NewGemini(cfg Config) (*Gemini, error) {
	if cfg.APIKey == "" {
		return nil, fmt.Errorf("--embedder gemini needs an API key: set --embedder-api-key-file or GEMINI_API_KEY: %w", errs.FailedPrecondition)
	}
	model := cfg.Model
	if model == "" {
		model = DefaultGeminiModel
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	one := int32(1)
	timeout := cfg.timeout()
	client, err := genai.NewClient(context.Background(), &genai.ClientConfig{
		APIKey:     cfg.APIKey,
		Backend:    genai.BackendGeminiAPI,
		HTTPClient: hc,
		HTTPOptions: genai.HTTPOptions{
			BaseURL:      cfg.BaseURL,
			Timeout:      &timeout,
			RetryOptions: &genai.HTTPRetryOptions{Attempts: &one},
		},
	})
	if err != nil {
		// The SDK's message may print its config, key included.
		return nil, fmt.Errorf("cannot create the Gemini client: %s: %w", strings.ReplaceAll(err.Error(), cfg.APIKey, "[key]"), errs.FailedPrecondition)
	}
	return &Gemini{models: client.Models, model: model, dimensions: cfg.Dimensions, key: cfg.APIKey, name: ProviderGemini + ":" + model}, nil
}

// Name implements Embedder.
func (g *Gemini) Name() string { return g.name }

// Embed implements Embedder.
func (g *Gemini) Embed(ctx context.Context, texts []string, p Purpose) ([][]float32, error) {
	if err := checkTexts(texts); err != nil {
		return nil, err
	}
	contents := make([]*genai.Content, len(texts))
	for i, t := range texts {
		contents[i] = genai.NewContentFromText(t, genai.RoleUser)
	}
	cfg := &genai.EmbedContentConfig{TaskType: "RETRIEVAL_DOCUMENT"}
	if p == Query {
		cfg.TaskType = "RETRIEVAL_QUERY"
	}
	if g.dimensions > 0 {
		d := int32(g.dimensions)
		cfg.OutputDimensionality = &d
	}
	resp, err := g.models.EmbedContent(ctx, g.model, contents, cfg)
	if err != nil {
		return nil, g.classify(ctx, err)
	}
	vecs := make([][]float32, len(resp.Embeddings))
	for i, e := range resp.Embeddings {
		if e != nil {
			vecs[i] = e.Values
		}
	}
	if err := checkVectors(g.name, vecs, len(texts)); err != nil {
		return nil, err
	}
	return vecs, nil
}

func (g *Gemini) classify(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var apiErr genai.APIError
	if errors.As(err, &apiErr) {
		return fmt.Errorf("%s: HTTP %d: %s: %w", g.name, apiErr.Code, clip(g.redact(apiErr.Message)), httpKind(apiErr.Code))
	}
	var apiPtr *genai.APIError
	if errors.As(err, &apiPtr) {
		return fmt.Errorf("%s: HTTP %d: %s: %w", g.name, apiPtr.Code, clip(g.redact(apiPtr.Message)), httpKind(apiPtr.Code))
	}
	return fmt.Errorf("%s cannot be reached: %s: %w", g.name, clip(g.redact(err.Error())), errs.Unavailable)
}

// redact removes the key from a message (the key travels in a URL
// parameter or header, which some errors quote).
func (g *Gemini) redact(s string) string { return strings.ReplaceAll(s, g.key, "[key]") }
