package embed

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/secbear/neuron/pkg/errs"
)

// openAIServer answers POST /v1/embeddings like OpenAI (and Ollama's and
// vLLM's OpenAI-compatible endpoints): one embedding per input, each the
// input's length and its first byte, listed in reverse order (the SDK's
// caller must use index, not position). It records the request.
func openAIServer(t *testing.T, status int, got *map[string]any) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/embeddings" {
			t.Errorf("request %s %s; want POST /v1/embeddings", r.Method, r.URL.Path)
		}
		if auth := r.Header.Get("Authorization"); !strings.HasPrefix(auth, "Bearer ") {
			t.Errorf("Authorization %q; want a bearer key", auth)
		}
		body, _ := io.ReadAll(r.Body)
		var req map[string]any
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("request body %s: %v", body, err)
		}
		if got != nil {
			*got = req
		}
		w.Header().Set("Content-Type", "application/json")
		if status != http.StatusOK {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, `{"error":{"message":"no such model","type":"invalid_request_error","code":"model_not_found"}}`)
			return
		}
		inputs, _ := req["input"].([]any)
		type datum struct {
			Object    string    `json:"object"`
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		}
		var data []datum
		for i := len(inputs) - 1; i >= 0; i-- {
			s, _ := inputs[i].(string)
			data = append(data, datum{"embedding", i, []float64{float64(len(s)), float64(s[0]), 0.5}})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data, "model": req["model"],
			"usage": map[string]int{"prompt_tokens": 3, "total_tokens": 3}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestOpenAI(t *testing.T) {
	var req map[string]any
	srv := openAIServer(t, http.StatusOK, &req)
	e, err := New(Config{Provider: ProviderOpenAI, APIKey: "sk-test", BaseURL: srv.URL + "/v1", Dimensions: 3})
	if err != nil {
		t.Fatal(err)
	}
	if e.Name() != "openai:text-embedding-3-small" {
		t.Errorf("Name %q", e.Name())
	}
	vecs, err := e.Embed(context.Background(), []string{"ab", "xyz"}, Document)
	if err != nil {
		t.Fatal(err)
	}
	if len(vecs) != 2 || vecs[0][0] != 2 || vecs[0][1] != 'a' || vecs[1][0] != 3 || vecs[1][1] != 'x' {
		t.Errorf("vectors %v; want [2 'a' .5] [3 'x' .5] in input order", vecs)
	}
	if req["model"] != "text-embedding-3-small" || req["dimensions"] != float64(3) || req["encoding_format"] != "float" {
		t.Errorf("request %v", req)
	}
}

// TestOpenAICompatible: an Ollama or vLLM server at a base URL, with the
// model named and no key needed.
func TestOpenAICompatible(t *testing.T) {
	var req map[string]any
	srv := openAIServer(t, http.StatusOK, &req)
	if _, err := New(Config{Provider: ProviderOpenAICompatible, Model: "nomic-embed-text"}); !errors.Is(err, errs.FailedPrecondition) || !strings.Contains(err.Error(), "--embedder-base-url") {
		t.Errorf("no base URL: %v; want FAILED_PRECONDITION naming --embedder-base-url", err)
	}
	if _, err := New(Config{Provider: ProviderOpenAICompatible, BaseURL: srv.URL + "/v1"}); !errors.Is(err, errs.FailedPrecondition) || !strings.Contains(err.Error(), "--embedder-model") {
		t.Errorf("no model: %v; want FAILED_PRECONDITION naming --embedder-model", err)
	}
	e, err := New(Config{Provider: ProviderOpenAICompatible, BaseURL: srv.URL + "/v1", Model: "nomic-embed-text"})
	if err != nil {
		t.Fatal(err)
	}
	vecs, err := e.Embed(context.Background(), []string{"hello"}, Query)
	if err != nil || len(vecs) != 1 || vecs[0][0] != 5 {
		t.Fatalf("Embed: %v %v", vecs, err)
	}
	if req["model"] != "nomic-embed-text" {
		t.Errorf("model %v", req["model"])
	}
	if _, ok := req["dimensions"]; ok {
		t.Errorf("dimensions sent without being configured: %v", req)
	}
}

func TestOpenAIErrors(t *testing.T) {
	for _, c := range []struct {
		status int
		kind   *errs.Kind
	}{
		{http.StatusNotFound, errs.FailedPrecondition},
		{http.StatusUnauthorized, errs.FailedPrecondition},
		{http.StatusBadRequest, errs.InvalidArgument},
		{http.StatusServiceUnavailable, errs.Unavailable},
	} {
		srv := openAIServer(t, c.status, nil)
		e, err := New(Config{Provider: ProviderOpenAI, APIKey: "sk-test", BaseURL: srv.URL + "/v1"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Embed(context.Background(), []string{"x"}, Document)
		if !errors.Is(err, c.kind) {
			t.Errorf("HTTP %d: %v; want %s", c.status, err, c.kind)
		}
		if c.status == http.StatusNotFound && !strings.Contains(err.Error(), "no such model") {
			t.Errorf("HTTP 404: %v; want the provider's message", err)
		}
	}
	// Nothing listening.
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	e, _ := New(Config{Provider: ProviderOpenAI, APIKey: "sk-test", BaseURL: url + "/v1"})
	if _, err := e.Embed(context.Background(), []string{"x"}, Document); !errors.Is(err, errs.Unavailable) {
		t.Errorf("unreachable: %v; want UNAVAILABLE", err)
	}
}

// TestGemini: models/{model}:batchEmbedContents with a task type per
// purpose and the key in a header, never in the URL.
func TestGemini(t *testing.T) {
	var path, key string
	var body map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, key = r.URL.Path, r.Header.Get("x-goog-api-key")
		if strings.Contains(r.URL.RawQuery, "gm-test") {
			t.Errorf("key in the URL: %s", r.URL)
		}
		raw, _ := io.ReadAll(r.Body)
		body = nil
		_ = json.Unmarshal(raw, &body)
		reqs, _ := body["requests"].([]any)
		if strings.Contains(string(raw), "fail") {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":{"code":429,"message":"quota exceeded","status":"RESOURCE_EXHAUSTED"}}`)
			return
		}
		var embs []map[string]any
		for i := range reqs {
			embs = append(embs, map[string]any{"values": []float32{float32(i), 1}})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"embeddings": embs})
	}))
	defer srv.Close()
	if _, err := New(Config{Provider: ProviderGemini, APIKey: "", BaseURL: srv.URL}); err == nil {
		t.Log("GEMINI_API_KEY or GOOGLE_API_KEY is set in the environment")
	} else if !errors.Is(err, errs.FailedPrecondition) {
		t.Errorf("no key: %v; want FAILED_PRECONDITION", err)
	}
	e, err := New(Config{Provider: ProviderGemini, APIKey: "gm-test", BaseURL: srv.URL, Dimensions: 2})
	if err != nil {
		t.Fatal(err)
	}
	vecs, err := e.Embed(context.Background(), []string{"a", "b"}, Query)
	if err != nil {
		t.Fatal(err)
	}
	if len(vecs) != 2 || vecs[1][0] != 1 {
		t.Errorf("vectors %v", vecs)
	}
	if !strings.HasSuffix(path, "models/gemini-embedding-001:batchEmbedContents") || key != "gm-test" {
		t.Errorf("path %q key %q", path, key)
	}
	first, _ := body["requests"].([]any)[0].(map[string]any)
	if first["taskType"] != "RETRIEVAL_QUERY" || first["outputDimensionality"] != float64(2) {
		t.Errorf("request %v; want taskType RETRIEVAL_QUERY and outputDimensionality 2", first)
	}
	if _, err := e.Embed(context.Background(), []string{"fail"}, Document); !errors.Is(err, errs.Unavailable) || !strings.Contains(err.Error(), "quota exceeded") || strings.Contains(err.Error(), "gm-test") {
		t.Errorf("HTTP 429: %v; want UNAVAILABLE with the message and no key", err)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := (Test{}).Embed(context.Background(), nil, Document); !errors.Is(err, errs.InvalidArgument) {
		t.Errorf("no texts: %v", err)
	}
	if _, err := (Test{}).Embed(context.Background(), []string{""}, Document); !errors.Is(err, errs.InvalidArgument) {
		t.Errorf("empty text: %v", err)
	}
	if _, err := New(Config{Provider: "word2vec"}); !errors.Is(err, errs.FailedPrecondition) {
		t.Errorf("unknown provider: %v", err)
	}
	if e, err := New(Config{}); e != nil || err != nil {
		t.Errorf("no provider: %v %v; want nil, nil", e, err)
	}
}

// TestTestEmbedder: words of the same meaning land together, unrelated
// texts apart.
func TestTestEmbedder(t *testing.T) {
	sim := func(a, b string) float32 { return Dot(TestVector(a), TestVector(b)) }
	if s := sim("My car is blue", "the automobile is azure"); s < 0.99 {
		t.Errorf("synonyms: similarity %.3f; want ~1", s)
	}
	if s := sim("The user's favourite drink is espresso", "what coffee does the user prefer?"); s < 0.6 {
		t.Errorf("paraphrase: similarity %.3f; want > 0.6", s)
	}
	if s := sim("my dog is called Rex", "the deadline of the project"); s > 0.2 {
		t.Errorf("unrelated: similarity %.3f; want < 0.2", s)
	}
	if s := sim("the", "the"); s < 0.99 {
		t.Errorf("stop words only: similarity %.3f; want a non-zero vector", s)
	}
}
