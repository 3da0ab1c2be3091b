package scrub

import (
	"log/slog"

	"github.com/secbear/neuron/pkg/logging"
)

// NewHandler wraps next so that every string of a record is scrubbed by
// s before it reaches next: the message, attribute keys and string
// values at any depth of groups, group names, attributes added with
// WithAttrs, errors and Stringers (as their text) and values of other
// kinds whose printed text holds something to replace (see
// logging.RedactWith, the one redaction step of every service's log
// pipeline, which this uses with s.String). Use it for every logger of
// an invocation into which credentials were injected:
//
//	log := slog.New(scrub.NewHandler(inv.Log.Handler(), s))
//
// A nil s scrubs nothing.
func NewHandler(next slog.Handler, s *Scrubber) slog.Handler {
	if s == nil {
		return next
	}
	return logging.RedactWith(next, s.String)
}
