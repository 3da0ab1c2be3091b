package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Options configure New.
type Options struct {
	// Level is the minimum level logged: debug, info, warn or error.
	Level string
	// Format is "json" (the default) or "text".
	Format string
	// Service is added to every line as service=<name>.
	Service string
}

// New returns a logger writing to w, with redaction of secret-looking
// values. It fails on an unknown level or format, so a typo in config is
// caught at start-up.
func New(w io.Writer, o Options) (*slog.Logger, error) {
	var lvl slog.Level
	if o.Level != "" {
		if err := lvl.UnmarshalText([]byte(o.Level)); err != nil {
			return nil, fmt.Errorf("log level %q: want debug, info, warn or error", o.Level)
		}
	}
	ho := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch strings.ToLower(o.Format) {
	case "", "json":
		h = slog.NewJSONHandler(w, ho)
	case "text":
		h = slog.NewTextHandler(w, ho)
	default:
		return nil, fmt.Errorf("log format %q: want json or text", o.Format)
	}
	l := slog.New(Redact(h))
	if o.Service != "" {
		l = l.With("service", o.Service)
	}
	return l, nil
}

// Redact wraps h so that secrets never reach it.
func Redact(h slog.Handler) slog.Handler { return redactHandler{h} }

type redactHandler struct{ next slog.Handler }

func (r redactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return r.next.Enabled(ctx, l)
}

func (r redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, RedactString(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(a))
		return true
	})
	return r.next.Handle(ctx, out)
}

func (r redactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = redactAttr(a)
	}
	return redactHandler{r.next.WithAttrs(red)}
}

func (r redactHandler) WithGroup(name string) slog.Handler {
	return redactHandler{r.next.WithGroup(name)}
}

// Redacted is what a secret is replaced with.
const Redacted = "[REDACTED]"

func redactAttr(a slog.Attr) slog.Attr {
	if SecretKey(a.Key) {
		return slog.String(a.Key, Redacted)
	}
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, RedactString(v.String()))
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, ga := range g {
			red[i] = redactAttr(ga)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, RedactString(err.Error()))
		}
		if s, ok := v.Any().(fmt.Stringer); ok {
			return slog.String(a.Key, RedactString(s.String()))
		}
		return slog.Attr{Key: a.Key, Value: v}
	default:
		return slog.Attr{Key: a.Key, Value: v}
	}
}
