package journal

import "log/slog"

// OpenOption configures Open.
type OpenOption func(*openOptions)

type openOptions struct {
	log *slog.Logger
}

// WithLogger sets the logger on which Open reports its check of the file
// (pkg/boltcheck): one INFO line with the file's size and the check's
// time; a WARN when the file was cut short in free pages only; and,
// when one meta page was invalid and the journal opened at the other's
// transaction, an ERROR naming both transactions. Without it, Open logs
// only the WARN and the ERROR, on slog.Default(), so that they are never
// dropped.
func WithLogger(log *slog.Logger) OpenOption {
	return func(o *openOptions) {
		if log != nil {
			o.log = log
		}
	}
}
