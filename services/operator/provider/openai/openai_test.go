package openai

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func TestNames(t *testing.T) {
	for _, fl := range flavours {
		if got := fl.make(t, "http://127.0.0.1:1/v1").Name(); got != fl.name {
			t.Fatalf("Name() = %q, want %q", got, fl.name)
		}
	}
}

func TestConstructorErrors(t *testing.T) {
	// The environment is never read: a key there does not count.
	t.Setenv("OPENAI_API_KEY", "sk-env-key-1234")
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
	for _, tc := range []struct {
		name    string
		make    func() (*Provider, error)
		prov    string
		message string
	}{
		{"openai without a key", func() (*Provider, error) { return New(Config{BaseURL: "http://x/v1"}) },
			Name, "no API key: set Config.APIKey"},
		{"openai with a bad base URL", func() (*Provider, error) { return New(Config{APIKey: testKey, BaseURL: "localhost:8080"}) },
			Name, "base URL is not an absolute http(s) URL"},
		{"openai with a relative base URL", func() (*Provider, error) { return New(Config{APIKey: testKey, BaseURL: "/v1"}) },
			Name, "base URL is not an absolute http(s) URL"},
		{"openai with negative max tokens", func() (*Provider, error) { return New(Config{APIKey: testKey, MaxTokens: -1}) },
			Name, "max tokens -1 is negative"},
		{"compatible without a base URL", func() (*Provider, error) { return NewCompatible(Config{APIKey: testKey}) },
			CompatibleName, "no base URL: set Config.BaseURL to the server's API root, e.g. http://localhost:11434/v1"},
		{"compatible with a bad base URL", func() (*Provider, error) {
			return NewCompatible(Config{APIKey: testKey, BaseURL: "ftp://" + testKey + "@host/v1"})
		}, CompatibleName, "base URL is not an absolute http(s) URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.make()
			if p != nil {
				t.Fatal("got a provider")
			}
			pe := asProviderError(t, err)
			if pe.Kind != errs.InvalidArgument || !errors.Is(err, errs.InvalidArgument) || pe.Provider != tc.prov || pe.Message != tc.message {
				t.Fatalf("error %+v", pe)
			}
			assertNoKey(t, err.Error())
		})
	}
}

// Neither flavour reads the environment: not OPENAI_API_KEY nor
// OPENAI_BASE_URL (the operator's wiring reads them), nor the ambient
// settings the SDK would otherwise pick up.
func TestEnvironmentIgnored(t *testing.T) {
	other := httpfake.New(t, httpfake.JSON(500, openAIError("wrong server", "server_error", "")))
	t.Setenv("OPENAI_API_KEY", "sk-env-key-1234")
	t.Setenv("OPENAI_BASE_URL", other.URL()+"/v1")
	t.Setenv("OPENAI_ORG_ID", "org-ambient")
	t.Setenv("OPENAI_PROJECT_ID", "proj-ambient")
	t.Setenv("OPENAI_CUSTOM_HEADERS", "X-Leak: yes")
	req := &provider.Request{Model: "gpt-4o", Messages: []provider.Message{userText("hi")}}

	g := httpfake.New(t, httpfake.JSON(200, okBody))
	p, err := New(Config{APIKey: testKey, BaseURL: g.URL() + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Complete(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	got := g.Only(t)
	if a := got.Header.Get("Authorization"); a != "Bearer "+testKey {
		t.Fatalf("Authorization %q, want the configured key", a)
	}
	for _, h := range []string{"OpenAI-Organization", "OpenAI-Project", "X-Leak"} {
		if v := got.Header.Get(h); v != "" {
			t.Fatalf("ambient header %s: %q sent", h, v)
		}
	}

	// A compatible server never gets OPENAI_API_KEY.
	h := httpfake.New(t, httpfake.JSON(200, okBody))
	p, err = NewCompatible(Config{BaseURL: h.URL() + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Complete(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	got = h.Only(t)
	for _, name := range []string{"Authorization", "OpenAI-Organization", "OpenAI-Project", "X-Leak"} {
		if v := got.Header.Get(name); v != "" {
			t.Fatalf("compatible server got %s: %q", name, v)
		}
	}
	if n := len(other.Requests()); n != 0 {
		t.Errorf("the OPENAI_BASE_URL server got %d requests, want 0", n)
	}
}

// A refused key is named by its source when the Config gives one.
func TestKeySourceRefused(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(401, openAIError("Incorrect API key provided: sk-env-***1234.", "invalid_request_error", "invalid_api_key")))
	p, err := New(Config{APIKey: "sk-env-key-1234", KeySource: "$OPENAI_API_KEY", BaseURL: f.URL() + "/v1", DefaultModel: "gpt-4o"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}})
	pe := asProviderError(t, err)
	const want = "the API key from $OPENAI_API_KEY was refused: Incorrect API key provided: sk-[redacted]."
	if pe.Message != want || pe.Kind != errs.NonRetryable || pe.HTTPStatus != 401 {
		t.Fatalf("error %+v", pe)
	}
	assertNoKey(t, err.Error(), "sk-env-key-1234", "1234")
}

func TestDefaultBaseURL(t *testing.T) {
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
	var url string
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		url = r.URL.String()
		return &http.Response{
			StatusCode: 200,
			Header:     http.Header{"Content-Type": {"application/json"}},
			Body:       io.NopCloser(strings.NewReader(okBody)),
			Request:    r,
		}, nil
	})}
	p, err := New(Config{APIKey: testKey, HTTPClient: hc, DefaultModel: "gpt-4o"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}}); err != nil {
		t.Fatal(err)
	}
	if url != "https://api.openai.com/v1/chat/completions" {
		t.Fatalf("URL %q", url)
	}
}

func TestCustomHTTPClientIsUsed(t *testing.T) {
	f := httpfake.New(t, httpfake.JSON(200, okBody))
	var used bool
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		used = true
		return http.DefaultTransport.RoundTrip(r)
	})}
	p, err := NewCompatible(Config{BaseURL: f.URL() + "/v1", HTTPClient: hc, DefaultModel: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{userText("hi")}}); err != nil {
		t.Fatal(err)
	}
	if !used {
		t.Fatal("Config.HTTPClient was not used")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
