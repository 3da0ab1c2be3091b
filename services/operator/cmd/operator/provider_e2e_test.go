package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/operator/catalog"
	"github.com/secbear/neuron/services/operator/provider"
)

// TestOpenAIThroughBinary runs the real binary against a local server
// speaking OpenAI's Chat Completions wire format: the key comes from a
// file, the base URL from a flag, the first attempt gets a 429 that the
// provider layer retries, and the cost is the catalog's price for the
// reported usage.
func TestOpenAIThroughBinary(t *testing.T) {
	bin := buildOperator(t)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer sk-test-key" {
			http.Error(w, `{"error":{"message":"bad path or key"}}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":{"message":"slow down","type":"rate_limit_exceeded"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4.1-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hello from the mock"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1200,"completion_tokens":300,"total_tokens":1500,"prompt_tokens_details":{"cached_tokens":200}}}`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	cmd := exec.Command(bin, "--one-shot", "--dev", "--tools", "", "--log-level", "error",
		"--model", "gpt-4.1-mini", "--openai-key-file", writeFile(t, dir, "key", "sk-test-key\n"),
		"--openai-base-url", srv.URL+"/v1")
	cmd.Env = []string{"PATH=/usr/bin:/bin"} // no keys from the test's environment
	cmd.Stdin = strings.NewReader(`{"message":{"blocks":[{"text":{"text":"hi"}}]}}`)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	out := &operatorv1.OperatorOutput{}
	if err := protojson.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatal(err)
	}
	if content.TextOf(out.GetMessage()) != "hello from the mock" || out.GetMetadata().GetProvider() != "openai" || calls.Load() != 2 {
		t.Fatalf("output %v after %d calls", out, calls.Load())
	}
	cat, err := catalog.Load("")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := cat.Lookup("gpt-4.1-mini")
	want := m.Cost(provider.Usage{InputTokens: 1000, OutputTokens: 300, CacheReadTokens: 200})
	if got := out.GetMetadata().GetCost().GetAmount(); got != want.String() || want.IsZero() {
		t.Fatalf("cost %s, want %s", got, want)
	}
	if out.GetMetadata().GetTokensIn() != 1000 || out.GetMetadata().GetCacheReadTokens() != 200 {
		t.Fatalf("usage %v", out.GetMetadata())
	}
}
