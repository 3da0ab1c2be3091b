package logging

import (
	"context"
	"encoding/json"
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
	l := slog.New(WithTrace(Redact(h)))
	if o.Service != "" {
		l = l.With("service", o.Service)
	}
	return l, nil
}

// Redact wraps h so that secrets never reach it: attributes whose key
// names a secret (SecretKey) are replaced whole, and every string of a
// record goes through RedactString (see RedactWith for which strings).
func Redact(h slog.Handler) slog.Handler {
	return redactHandler{next: h, redact: RedactString, keys: true}
}

// RedactWith wraps h so that every string of a record reaches it through
// redact: the message; every attribute's key and string value, at any
// depth of groups; group names given to WithGroup; attributes given to
// WithAttrs (redacted once, when given); errors and fmt.Stringers, as
// their text; and values of any other kind (structs, maps, byte slices)
// whose text, as fmt's %+v or as JSON, redact changes, which are then
// replaced by that text redacted. LogValuers are resolved first. Numbers,
// booleans, times and durations pass as they are.
//
// It is the one redaction step of every log pipeline: Redact is it with
// RedactString, and the environment service's per-invocation loggers use
// it with the injected credentials' scrubber (scrub.NewHandler).
func RedactWith(h slog.Handler, redact func(string) string) slog.Handler {
	return redactHandler{next: h, redact: redact}
}

type redactHandler struct {
	next   slog.Handler
	redact func(string) string
	// keys replaces attributes whose key names a secret.
	keys bool
}

func (r redactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return r.next.Enabled(ctx, l)
}

// Handle passes rec on as it is when redaction changes none of its
// strings (the usual case: nothing is copied), and otherwise a copy with
// every string redacted.
func (r redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	msg := r.redact(rec.Message)
	changed := msg != rec.Message
	if !changed {
		rec.Attrs(func(a slog.Attr) bool {
			_, changed = r.attr(a)
			return !changed
		})
		if !changed {
			return r.next.Handle(ctx, rec)
		}
	}
	out := slog.NewRecord(rec.Time, rec.Level, msg, rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		red, _ := r.attr(a)
		out.AddAttrs(red)
		return true
	})
	return r.next.Handle(ctx, out)
}

func (r redactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i], _ = r.attr(a)
	}
	return redactHandler{r.next.WithAttrs(red), r.redact, r.keys}
}

func (r redactHandler) WithGroup(name string) slog.Handler {
	return redactHandler{r.next.WithGroup(r.redact(name)), r.redact, r.keys}
}

// Redacted is what a secret is replaced with.
const Redacted = "[REDACTED]"

// attr is a redacted, and whether it differs from a: a value that a
// handler would print otherwise (an error or fmt.Stringer turned into its
// text, a LogValuer resolved) counts as changed.
func (r redactHandler) attr(a slog.Attr) (slog.Attr, bool) {
	key := r.redact(a.Key)
	if r.keys && SecretKey(a.Key) && !countValue(a.Value) {
		return slog.String(key, Redacted), true
	}
	changed := key != a.Key
	if a.Value.Kind() == slog.KindLogValuer {
		changed = true
	}
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		s := v.String()
		red := r.redact(s)
		return slog.String(key, red), changed || red != s
	case slog.KindGroup:
		g := v.Group()
		red := make([]slog.Attr, len(g))
		for i, ga := range g {
			var c bool
			red[i], c = r.attr(ga)
			changed = changed || c
		}
		return slog.Attr{Key: key, Value: slog.GroupValue(red...)}, changed
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(key, r.redact(x.Error())), true
		case fmt.Stringer:
			return slog.String(key, r.redact(x.String())), true
		case []byte:
			if red := r.redact(string(x)); red != string(x) {
				return slog.String(key, red), true
			}
		}
		red, c := r.anyValue(v)
		return slog.Attr{Key: key, Value: red}, changed || c
	default:
		return slog.Attr{Key: key, Value: v}, changed
	}
}

// countValue says whether v is a number or a boolean: a count, size or
// flag (tokens_in, credential_count), never a secret, whatever its key.
// Secrets are strings, and are redacted under a secret key.
func countValue(v slog.Value) bool {
	switch v.Kind() {
	case slog.KindInt64, slog.KindUint64, slog.KindFloat64, slog.KindBool, slog.KindDuration:
		return true
	}
	return false
}

// anyValue returns v, a value of kind Any, unchanged unless its text as
// a text handler (%+v) or a JSON handler would print it holds something
// to redact; then that text, redacted (and true).
func (r redactHandler) anyValue(v slog.Value) (slog.Value, bool) {
	x := v.Any()
	if x == nil {
		return v, false
	}
	text := fmt.Sprintf("%+v", x)
	if red := r.redact(text); red != text {
		return slog.StringValue(red), true
	}
	if js, err := json.Marshal(x); err == nil {
		if red := r.redact(string(js)); red != string(js) {
			return slog.StringValue(red), true
		}
	}
	return v, false
}
