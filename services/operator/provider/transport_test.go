package provider

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// recordingTransport keeps the request it was given.
type recordingTransport struct{ got *http.Request }

func (t *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.got = r
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
}

// wrappedBody is an in-memory body hidden behind a reader of its own, as
// the SDKs send it; it notes Close.
type wrappedBody struct {
	io.Reader
	closed bool
}

func (b *wrappedBody) Close() error { b.closed = true; return nil }

func TestInMemoryBodies(t *testing.T) {
	const payload = `{"model":"m"}`
	t.Run("a re-readable body is sent as an in-memory copy", func(t *testing.T) {
		rec := &recordingTransport{}
		orig := &wrappedBody{Reader: strings.NewReader(payload)}
		req, _ := http.NewRequest("POST", "http://example.invalid/v1/chat/completions", orig)
		req.ContentLength = int64(len(payload))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader([]byte(payload))), nil }

		if _, err := InMemoryBodies(rec).RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		if rec.got == req {
			t.Fatal("the caller's request was passed on (and so changed), want a copy")
		}
		if req.Body != orig {
			t.Fatal("the caller's request was modified")
		}
		if !orig.closed {
			t.Fatal("the body the transport was given was not closed")
		}
		// net/http writes headers and body in one write only for these
		// types (in io.NopCloser); anything else gets a separate write.
		if _, ok := rec.got.Body.(interface {
			WriteTo(io.Writer) (int64, error)
		}); !ok {
			t.Fatalf("sent body is %T, want io.NopCloser of a *bytes.Reader", rec.got.Body)
		}
		b, _ := io.ReadAll(rec.got.Body)
		if string(b) != payload || rec.got.ContentLength != int64(len(payload)) || rec.got.GetBody == nil {
			t.Fatalf("sent body %q (length %d)", b, rec.got.ContentLength)
		}
	})
	t.Run("other requests pass unchanged", func(t *testing.T) {
		for name, body := range map[string]io.ReadCloser{"no body": nil, "no GetBody": io.NopCloser(strings.NewReader(payload))} {
			rec := &recordingTransport{}
			req, _ := http.NewRequest("POST", "http://example.invalid/", body)
			req.GetBody = nil
			if _, err := InMemoryBodies(rec).RoundTrip(req); err != nil {
				t.Fatal(err)
			}
			if rec.got != req {
				t.Fatalf("%s: request replaced", name)
			}
		}
	})
	t.Run("a failing GetBody sends the original body", func(t *testing.T) {
		rec := &recordingTransport{}
		orig := &wrappedBody{Reader: strings.NewReader(payload)}
		req, _ := http.NewRequest("POST", "http://example.invalid/", orig)
		req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("gone") }
		if _, err := InMemoryBodies(rec).RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		if rec.got != req || orig.closed {
			t.Fatal("want the original request and body passed on")
		}
	})
	t.Run("the client keeps its settings", func(t *testing.T) {
		base := &http.Client{Timeout: 7, Transport: &recordingTransport{}}
		c := WithInMemoryBodies(base)
		if c == base || c.Timeout != 7 || base.Transport == c.Transport {
			t.Fatalf("client %+v", c)
		}
		if WithInMemoryBodies(nil).Transport == nil {
			t.Fatal("nil client: no transport wrapper")
		}
	})
}
