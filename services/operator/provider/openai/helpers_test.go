package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/secbear/neuron/services/operator/provider"
)

const testKey = "sk-test-0123456789abcdef"

// flavour builds one of the two providers against a base URL.
type flavour struct {
	name string
	make func(t *testing.T, baseURL string) *Provider
}

var flavours = []flavour{
	{Name, func(t *testing.T, baseURL string) *Provider {
		t.Helper()
		p, err := New(Config{APIKey: testKey, BaseURL: baseURL, DefaultModel: "gpt-4o"})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}},
	{CompatibleName, func(t *testing.T, baseURL string) *Provider {
		t.Helper()
		p, err := NewCompatible(Config{BaseURL: baseURL, DefaultModel: "gpt-4o"})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}},
}

// asProviderError asserts err is a *provider.Error.
func asProviderError(t *testing.T, err error) *provider.Error {
	t.Helper()
	var pe *provider.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *provider.Error", err, err)
	}
	return pe
}

func assertNoKey(t *testing.T, s string, keys ...string) {
	t.Helper()
	for _, k := range append(keys, testKey) {
		if strings.Contains(s, k) {
			t.Fatalf("%q contains the API key", s)
		}
	}
}

func text(s string) provider.Part { return provider.Part{Text: s} }

func userText(s string) provider.Message {
	return provider.Message{Role: provider.User, Parts: []provider.Part{text(s)}}
}
