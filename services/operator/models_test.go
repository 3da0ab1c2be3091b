package operator

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/provider/providers"
)

// providerSettings reads each provider's variables as the operator always
// has: a key file before the key variables, the key variables in order
// (GEMINI_API_KEY before GOOGLE_API_KEY), a --<flag>-base-url before the
// base URL variable, and OPENAI_BASE_URL for the OpenAI-compatible server
// only without an OpenAI key.
func TestProviderSettings(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	anthropicFile := file("anthropic", "  sk-ant-file\n")
	compatFile := file("compat", "local-key\n")
	emptyFile := file("empty", " \n")

	tests := []struct {
		name    string
		env     map[string]string
		m       Models
		want    map[string]settings
		wantErr string
	}{
		{name: "nothing set", want: map[string]settings{}},
		{name: "anthropic from the environment",
			env:  map[string]string{"ANTHROPIC_API_KEY": " sk-ant-env "},
			want: map[string]settings{"anthropic": {"sk-ant-env", "$ANTHROPIC_API_KEY", "https://api.anthropic.com"}}},
		{name: "a blank key is no key",
			env:  map[string]string{"ANTHROPIC_API_KEY": "  "},
			want: map[string]settings{}},
		{name: "key file before the environment",
			env:  map[string]string{"ANTHROPIC_API_KEY": "sk-ant-env"},
			m:    Models{KeyFiles: map[string]string{"anthropic": anthropicFile}},
			want: map[string]settings{"anthropic": {"sk-ant-file", "--anthropic-key-file", "https://api.anthropic.com"}}},
		{name: "base URL variable",
			env:  map[string]string{"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": "http://proxy/anthropic"},
			want: map[string]settings{"anthropic": {"k", "$ANTHROPIC_API_KEY", "http://proxy/anthropic"}}},
		{name: "base URL flag before the variable",
			env:  map[string]string{"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": "http://proxy/anthropic"},
			m:    Models{BaseURLs: map[string]string{"anthropic": "http://flag"}},
			want: map[string]settings{"anthropic": {"k", "$ANTHROPIC_API_KEY", "http://flag"}}},
		{name: "GEMINI_API_KEY before GOOGLE_API_KEY",
			env:  map[string]string{"GEMINI_API_KEY": "gemini-key", "GOOGLE_API_KEY": "google-key"},
			want: map[string]settings{"gemini": {"gemini-key", "$GEMINI_API_KEY", "https://generativelanguage.googleapis.com"}}},
		{name: "GOOGLE_API_KEY alone",
			env:  map[string]string{"GOOGLE_API_KEY": "google-key", "GOOGLE_GEMINI_BASE_URL": "http://gemini"},
			want: map[string]settings{"gemini": {"google-key", "$GOOGLE_API_KEY", "http://gemini"}}},
		{name: "OPENAI_BASE_URL alone is the compatible server",
			env:  map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"},
			want: map[string]settings{"openai-compatible": {"", "", "http://127.0.0.1:11434/v1"}}},
		{name: "OPENAI_BASE_URL with an OpenAI key is OpenAI's",
			env:  map[string]string{"OPENAI_API_KEY": "sk-oa", "OPENAI_BASE_URL": "http://gateway/v1"},
			want: map[string]settings{"openai": {"sk-oa", "$OPENAI_API_KEY", "http://gateway/v1"}}},
		{name: "OpenAI and a compatible server by flag",
			env: map[string]string{"OPENAI_API_KEY": "sk-oa"},
			m: Models{BaseURLs: map[string]string{"openai-compatible": "http://127.0.0.1:8000/v1"},
				KeyFiles: map[string]string{"openai-compatible": compatFile}},
			want: map[string]settings{
				"openai":            {"sk-oa", "$OPENAI_API_KEY", "https://api.openai.com/v1"},
				"openai-compatible": {"local-key", "--compatible-key-file", "http://127.0.0.1:8000/v1"},
			}},
		{name: "a compatible key file alone enables nothing",
			m:    Models{KeyFiles: map[string]string{"openai-compatible": compatFile}},
			want: map[string]settings{}},
		{name: "empty key file",
			env:     map[string]string{"GEMINI_API_KEY": "gemini-key"},
			m:       Models{KeyFiles: map[string]string{"gemini": emptyFile}},
			wantErr: "--gemini-key-file: " + emptyFile + " is empty"},
		{name: "missing key file",
			m:       Models{KeyFiles: map[string]string{"openai": filepath.Join(dir, "absent")}},
			wantErr: "--openai-key-file: open " + filepath.Join(dir, "absent") + ": no such file or directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := providerSettings(tc.m, func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("settings\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// Every provider of the list has a constructor, and builds the provider
// of its name.
func TestEveryProviderConstructs(t *testing.T) {
	for _, d := range providers.All() {
		p, err := newProvider(d, settings{key: "k", baseURL: "http://127.0.0.1:1/v1"}, Models{}, nil, 0)
		if err != nil {
			t.Errorf("provider %q: %v", d.Name, err)
			continue
		}
		if p.Name() != d.Name {
			t.Errorf("provider %q builds a provider named %q", d.Name, p.Name())
		}
	}
	d := providers.All()[0]
	d.Name = "unknown"
	if _, err := newProvider(d, settings{key: "k"}, Models{}, nil, 0); err == nil || !strings.Contains(err.Error(), "no constructor") {
		t.Errorf("unknown provider: %v", err)
	}
}

// The operator still takes a provider's key and base URL from the
// environment: a Gemini key from GEMINI_API_KEY (not GOOGLE_API_KEY,
// also set) reaches the server GOOGLE_GEMINI_BASE_URL names.
func TestModelsFromEnvironment(t *testing.T) {
	for _, v := range providers.ModelVars() {
		t.Setenv(v, "")
	}
	f := httpfake.New(t, httpfake.JSON(200, `{"candidates":[{"content":{"parts":[{"text":"hi"}],"role":"model"},"finishReason":"STOP"}],
		"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":1},"modelVersion":"gemini-2.5-flash"}`))
	t.Setenv("GEMINI_API_KEY", "gemini-env-key")
	t.Setenv("GOOGLE_API_KEY", "google-env-key")
	t.Setenv("GOOGLE_GEMINI_BASE_URL", f.URL())

	cfg := DefaultConfig()
	router, _, _, err := models(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	p, model, err := router.Route("")
	if err != nil || model != "gemini-2.5-flash" {
		t.Fatalf("Route(\"\") = %q, %v; want gemini-2.5-flash", model, err)
	}
	resp, err := p.Complete(context.Background(), &provider.Request{Model: model, Messages: []provider.Message{{Role: provider.User, Parts: []provider.Part{{Text: "hi"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Parts) != 1 || resp.Parts[0].Text != "hi" {
		t.Errorf("response %+v", resp)
	}
	if got := f.Only(t).Header.Get("X-Goog-Api-Key"); got != "gemini-env-key" {
		t.Errorf("key sent %q, want GEMINI_API_KEY's", got)
	}

	// A model whose provider has no key says what to set.
	if _, _, err := router.Route("claude-sonnet-4-5"); err == nil || !strings.Contains(err.Error(), "set ANTHROPIC_API_KEY or --anthropic-key-file") {
		t.Errorf("Route(claude-sonnet-4-5) = %v, want the credential to set", err)
	}
}
