package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/secbear/neuron/services/operator/provider"
)

const testKey = "sk-test-0123456789abcdef"

// recorded is one request the fake server received.
type recorded struct {
	method string
	path   string
	header http.Header
	body   []byte
}

// fake is an httptest server speaking the Chat Completions wire format;
// it records every request and answers with handler.
type fake struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []recorded
}

func newFake(t *testing.T, handler http.HandlerFunc) *fake {
	t.Helper()
	f := &fake{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, recorded{method: r.Method, path: r.URL.Path, header: r.Header.Clone(), body: b})
		f.mu.Unlock()
		handler(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) baseURL() string { return f.srv.URL + "/v1" }

// only returns the single request received.
func (f *fake) only(t *testing.T) recorded {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) != 1 {
		t.Fatalf("server got %d requests, want 1", len(f.reqs))
	}
	return f.reqs[0]
}

func (f *fake) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

// jsonBody answers with a JSON body and status.
func jsonBody(status int, body string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// sse answers with a text/event-stream of the given data lines, each
// followed by a blank line, as OpenAI sends them.
func sse(events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		fl := w.(http.Flusher)
		for _, e := range events {
			_, _ = io.WriteString(w, "data: "+e+"\n\n")
			fl.Flush()
		}
	}
}

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

// assertJSON compares two JSON documents semantically.
func assertJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got invalid JSON %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want invalid JSON %s: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		var gi, wi bytes.Buffer
		_ = json.Indent(&gi, got, "", "  ")
		_ = json.Indent(&wi, []byte(want), "", "  ")
		t.Fatalf("JSON mismatch\n got: %s\nwant: %s", gi.String(), wi.String())
	}
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
