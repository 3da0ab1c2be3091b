package scrub

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

type config struct {
	Name string
	Key  string
}

// Every string of a record logged through NewHandler is scrubbed, the
// secret's transforms included, whatever the path it takes into the
// record.
func TestHandler(t *testing.T) {
	secret := transformSecret
	upper := strings.ToUpper(secret)
	s := New([]string{secret}, WithoutPatterns())
	tests := []struct {
		name string
		log  func(l *slog.Logger)
	}{
		{"message", func(l *slog.Logger) { l.Info("key is " + secret) }},
		{"message, transformed", func(l *slog.Logger) { l.Info("key is " + joinChars(secret, " ")) }},
		{"string attribute", func(l *slog.Logger) { l.Info("x", "stderr", "echo "+upper+"\n") }},
		{"attribute key", func(l *slog.Logger) { l.Info("x", secret, true) }},
		{"nested groups", func(l *slog.Logger) {
			l.Info("x", slog.Group("req", slog.Group("headers", "x-api-key", percentSome(secret))))
		}},
		{"group name", func(l *slog.Logger) { l.WithGroup(secret).Info("x", "n", 1) }},
		{"with attrs", func(l *slog.Logger) { l.With("env", "KEY="+secret).Info("x") }},
		{"with attrs in a group", func(l *slog.Logger) { l.WithGroup("a").With(slog.Group("b", "c", secret)).Info("x") }},
		{"error", func(l *slog.Logger) { l.Warn("x", "error", errors.New("auth failed for "+secret)) }},
		{"wrapped error", func(l *slog.Logger) { l.Warn("x", "error", fmt.Errorf("run: %w", errors.New(upper))) }},
		{"struct", func(l *slog.Logger) { l.Info("x", "config", config{"bot", secret}) }},
		{"bytes", func(l *slog.Logger) { l.Info("x", "raw", []byte(secret)) }},
		{"strings", func(l *slog.Logger) { l.Info("x", "argv", []string{"--key", secret}) }},
	}
	for _, tt := range tests {
		for _, format := range []string{"json", "text"} {
			t.Run(tt.name+"/"+format, func(t *testing.T) {
				var buf bytes.Buffer
				var h slog.Handler = slog.NewJSONHandler(&buf, nil)
				if format == "text" {
					h = slog.NewTextHandler(&buf, nil)
				}
				tt.log(slog.New(NewHandler(h, s)))
				out := buf.String()
				if l := leftover(out, secret); l != "" || strings.Contains(out, secret) {
					t.Fatalf("secret leaked (%q): %s", l, out)
				}
				if !strings.Contains(out, Redacted) {
					t.Fatalf("no %s in %s", Redacted, out)
				}
			})
		}
	}
}

// Records without secrets pass unchanged, and a nil Scrubber is no
// wrapper at all.
func TestHandlerKeepsOrdinaryRecords(t *testing.T) {
	var buf bytes.Buffer
	h := slog.NewJSONHandler(&buf, nil)
	slog.New(NewHandler(h, New([]string{transformSecret}))).Info("run complete", "backend", "process", "exit", 0)
	if got := buf.String(); !strings.Contains(got, `"msg":"run complete","backend":"process","exit":0`) {
		t.Errorf("got %s", got)
	}
	if NewHandler(h, nil) != slog.Handler(h) {
		t.Error("NewHandler(h, nil) wraps h")
	}
}
