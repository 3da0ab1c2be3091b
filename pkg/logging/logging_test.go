package logging

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
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
