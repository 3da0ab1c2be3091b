package logging

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRedaction(t *testing.T) {
	tests := []struct {
		name   string
		log    func(l *slog.Logger)
		secret string
	}{
		{"secret key name", func(l *slog.Logger) { l.Info("x", "api_key", "plainvalue123") }, "plainvalue123"},
		{"authorization header", func(l *slog.Logger) { l.Info("x", "Authorization", "whatever-value") }, "whatever-value"},
		{"openai key in value", func(l *slog.Logger) { l.Info("x", "note", "used sk-abcdefghijklmnop1234 today") }, "sk-abcdefghijklmnop1234"},
		{"bearer in message", func(l *slog.Logger) { l.Info("sent Bearer abcdefgh12345678") }, "abcdefgh12345678"},
		{"aws key in error", func(l *slog.Logger) { l.Error("x", "err", errors.New("bad AKIAABCDEFGHIJKLMNOP")) }, "AKIAABCDEFGHIJKLMNOP"},
		{"nested group", func(l *slog.Logger) { l.Info("x", slog.Group("req", "password", "hunter2")) }, "hunter2"},
		{"with attrs", func(l *slog.Logger) { l.With("token", "t0ps3cr3t").Info("x") }, "t0ps3cr3t"},
		{"key=value text", func(l *slog.Logger) { l.Info("x", "line", "password=hunter22 ok") }, "hunter22"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			l, err := New(&buf, Options{Format: "json"})
			if err != nil {
				t.Fatal(err)
			}
			tt.log(l)
			if strings.Contains(buf.String(), tt.secret) {
				t.Fatalf("secret %q leaked: %s", tt.secret, buf.String())
			}
			if !strings.Contains(buf.String(), Redacted) {
				t.Fatalf("no redaction marker in %s", buf.String())
			}
		})
	}
}

func TestOrdinaryValuesKept(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(&buf, Options{Format: "text", Service: "state"})
	if err != nil {
		t.Fatal(err)
	}
	l.Info("write", "scope", "session/abc", "key", "history", "revision", 7)
	for _, want := range []string{"service=state", "scope=session/abc", "key=history", "revision=7"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("missing %q in %s", want, buf.String())
		}
	}
	if strings.Contains(buf.String(), Redacted) {
		t.Errorf("ordinary values redacted: %s", buf.String())
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := New(&bytes.Buffer{}, Options{Level: "loud"}); err == nil {
		t.Error("unknown level accepted")
	}
	if _, err := New(&bytes.Buffer{}, Options{Format: "xml"}); err == nil {
		t.Error("unknown format accepted")
	}
}

type credentials struct {
	User  string
	Token string
}

type stringer struct{ s string }

func (s stringer) String() string { return s.s }

type valuer struct{ s string }

func (v valuer) LogValue() slog.Value { return slog.StringValue(v.s) }

// RedactWith passes every string of a record through its function: the
// message, keys and values at any depth, group names, WithAttrs, errors,
// Stringers, LogValuers and other values by their text.
func TestRedactWith(t *testing.T) {
	const secret = "Zx9-credential-Value-0042"
	redact := func(s string) string { return strings.ReplaceAll(s, secret, Redacted) }
	tests := []struct {
		name string
		log  func(l *slog.Logger)
	}{
		{"message", func(l *slog.Logger) { l.Info("got " + secret) }},
		{"string value", func(l *slog.Logger) { l.Info("x", "v", "a "+secret) }},
		{"key", func(l *slog.Logger) { l.Info("x", secret, 1) }},
		{"nested group", func(l *slog.Logger) {
			l.Info("x", slog.Group("a", slog.Group("b", "c", secret)))
		}},
		{"group key", func(l *slog.Logger) { l.Info("x", slog.Group(secret, "c", 1)) }},
		{"with group", func(l *slog.Logger) { l.WithGroup(secret).Info("x", "c", 1) }},
		{"with attrs", func(l *slog.Logger) { l.With("v", secret).Info("x") }},
		{"with attrs in a group", func(l *slog.Logger) { l.WithGroup("g").With(slog.Group("h", "v", secret)).Info("x") }},
		{"error", func(l *slog.Logger) { l.Error("x", "err", errors.New("bad "+secret)) }},
		{"wrapped error", func(l *slog.Logger) { l.Error("x", "err", fmt.Errorf("op: %w", errors.New(secret))) }},
		{"stringer", func(l *slog.Logger) { l.Info("x", "v", stringer{secret}) }},
		{"log valuer", func(l *slog.Logger) { l.Info("x", "v", valuer{secret}) }},
		{"struct", func(l *slog.Logger) { l.Info("x", "v", credentials{"bob", secret}) }},
		{"pointer to struct", func(l *slog.Logger) { l.Info("x", "v", &credentials{"bob", secret}) }},
		{"map", func(l *slog.Logger) { l.Info("x", "v", map[string]string{"k": secret}) }},
		{"slice", func(l *slog.Logger) { l.Info("x", "v", []string{"a", secret}) }},
		{"bytes", func(l *slog.Logger) { l.Info("x", "v", []byte(secret)) }},
	}
	for _, tt := range tests {
		for _, format := range []string{"json", "text"} {
			t.Run(tt.name+"/"+format, func(t *testing.T) {
				var buf bytes.Buffer
				var h slog.Handler = slog.NewJSONHandler(&buf, nil)
				if format == "text" {
					h = slog.NewTextHandler(&buf, nil)
				}
				tt.log(slog.New(RedactWith(h, redact)))
				if strings.Contains(buf.String(), secret) {
					t.Fatalf("secret leaked: %s", buf.String())
				}
				if !strings.Contains(buf.String(), Redacted) {
					t.Fatalf("no redaction marker in %s", buf.String())
				}
			})
		}
	}
}

// Values with nothing to redact reach the handler as they were, so the
// JSON handler prints structs as objects and bytes as base64.
func TestRedactWithKeepsValues(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(RedactWith(slog.NewJSONHandler(&buf, nil), RedactString))
	l.Info("x", "v", struct{ Name, Kind string }{"bob", "user"}, "b", []byte("hi"), "n", 3, "d", 2*time.Second)
	for _, want := range []string{`"v":{"Name":"bob","Kind":"user"}`, `"b":"aGk="`, `"n":3`, `"d":2000000000`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("missing %s in %s", want, buf.String())
		}
	}
}
