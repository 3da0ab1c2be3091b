package journal

import "log/slog"

// OpenOption configures Open.
type OpenOption func(*openOptions)

type openOptions struct {
	log *slog.Logger
	// noSync: see WithoutSync.
	noSync bool
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

// WithoutSync opens the journal without fsyncs (bbolt's NoSync): a
// commit is in the page cache only, and a crash of the machine may lose
// or tear it. NOT a production mode, and no flag sets it: benchmarks use
// it to show what a dispatch costs without the disk's fsyncs.
func WithoutSync() OpenOption { return func(o *openOptions) { o.noSync = true } }
