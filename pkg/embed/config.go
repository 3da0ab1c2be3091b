package embed

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/secbear/neuron/pkg/errs"
)

// Config selects and configures an embedder.
type Config struct {
	// Provider is openai, openai-compatible, gemini or test; empty: no
	// embedder (New returns nil).
	Provider string
	// Model is the provider's model; empty: DefaultOpenAIModel or
	// DefaultGeminiModel (openai-compatible needs one).
	Model string
	// BaseURL overrides the provider's API address (openai-compatible
	// needs one, such as http://localhost:11434/v1 for Ollama).
	BaseURL string
	// APIKey is the provider's key; empty: read from APIKeyFile, else
	// from OPENAI_API_KEY (openai) or GEMINI_API_KEY / GOOGLE_API_KEY
	// (gemini).
	APIKey string
	// APIKeyFile holds the key (keeps it out of argv and env).
	APIKeyFile string
	// Dimensions asks the model for this many dimensions (OpenAI's
	// text-embedding-3 models, Gemini's output_dimensionality); 0: the
	// model's default. The test embedder has TestDimensions.
	Dimensions int
	// Timeout bounds one Embed call; 0: DefaultTimeout.
	Timeout time.Duration
	// HTTPClient, when set, carries the provider's requests (tests).
	HTTPClient *http.Client
}

func (c Config) timeout() time.Duration {
	if c.Timeout <= 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

// BindFlags binds the --embedder flags to c.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Provider, "embedder", "", "embedding provider for vector and hybrid search: openai, openai-compatible (Ollama, vLLM), gemini, or test (a fixed word table, for tests only); empty: none, and vector search answers FAILED_PRECONDITION")
	fs.StringVar(&c.Model, "embedder-model", "", "embedding model (default text-embedding-3-small for openai, gemini-embedding-001 for gemini; required for openai-compatible)")
	fs.StringVar(&c.BaseURL, "embedder-base-url", "", "embedding API base URL (required for openai-compatible, such as http://localhost:11434/v1)")
	fs.StringVar(&c.APIKeyFile, "embedder-api-key-file", "", "file holding the embedding provider's API key (default: OPENAI_API_KEY, or GEMINI_API_KEY / GOOGLE_API_KEY)")
	fs.IntVar(&c.Dimensions, "embedder-dimensions", 0, "ask the model for this many dimensions (0: the model's default)")
	fs.DurationVar(&c.Timeout, "embedder-timeout", DefaultTimeout, "deadline of one embedding call")
}

// New returns the embedder cfg describes, or nil when cfg.Provider is
// empty.
func New(cfg Config) (Embedder, error) {
	if cfg.Dimensions < 0 || cfg.Dimensions > MaxDimensions {
		return nil, fmt.Errorf("--embedder-dimensions %d: must be 0 to %d: %w", cfg.Dimensions, MaxDimensions, errs.FailedPrecondition)
	}
	if cfg.APIKey == "" && cfg.APIKeyFile != "" {
		b, err := os.ReadFile(cfg.APIKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--embedder-api-key-file: %v: %w", err, errs.FailedPrecondition)
		}
		cfg.APIKey = strings.TrimSpace(string(b))
	}
	switch cfg.Provider {
	case "":
		return nil, nil
	case ProviderTest:
		return Test{}, nil
	case ProviderOpenAI, ProviderOpenAICompatible:
		if cfg.APIKey == "" && cfg.Provider == ProviderOpenAI {
			cfg.APIKey = os.Getenv("OPENAI_API_KEY")
		}
		return NewOpenAI(cfg)
	case ProviderGemini:
		if cfg.APIKey == "" {
			cfg.APIKey = os.Getenv("GEMINI_API_KEY")
		}
		if cfg.APIKey == "" {
			cfg.APIKey = os.Getenv("GOOGLE_API_KEY")
		}
		return NewGemini(cfg)
	}
	return nil, fmt.Errorf("--embedder %q: unknown provider; use openai, openai-compatible, gemini or test: %w", cfg.Provider, errs.FailedPrecondition)
}
