// Command state serves layer0.state.v1.StateService: scoped JSON values
// with revisions and full-text search, stored in bbolt (or in memory, for
// tests). Every flag has an env fallback: --data-dir is
// NEURON_STATE_DATA_DIR, and so on. Run with --help for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/services/state"
)

const envPrefix = "NEURON_STATE"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "state: %v\n", err)
		os.Exit(1)
	}
}

// run is the flag layer: it parses args (with the NEURON_STATE_* env
// fallbacks) into a state.Config, builds the logger, dials the policy
// middleware when --middleware-addr is set, and calls state.Run.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg := state.Config{Server: grpcserver.Config{Name: "state", Addr: state.DefaultAddr}}
	fs := flag.NewFlagSet("state", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.Server.BindFlags(fs)
	var mwFlags remote.Flags
	mwFlags.Bind(fs)
	fs.StringVar(&cfg.DataDir, "data-dir", state.DefaultDataDir, "directory of the bbolt file (state.db) and its search index (state.db.bleve)")
	fs.StringVar(&cfg.Backend, "backend", state.BackendBolt, "storage backend: bolt (durable), postgres (shared by replicas) or memory (tests only; lost on exit)")
	fs.StringVar(&cfg.PostgresDSN, "postgres-dsn", "", "PostgreSQL DSN for --backend postgres (prefer --postgres-dsn-file when it holds a password)")
	fs.StringVar(&cfg.PostgresDSNFile, "postgres-dsn-file", "", "file holding the PostgreSQL DSN for --backend postgres (keeps the password out of argv and env)")
	fs.IntVar(&cfg.Limits.MaxKeyBytes, "max-key-bytes", state.DefaultLimits().MaxKeyBytes, "largest key accepted, in bytes")
	fs.IntVar(&cfg.Limits.MaxValueBytes, "max-value-bytes", state.DefaultLimits().MaxValueBytes, "largest value accepted, in bytes of its JSON encoding")
	fs.DurationVar(&cfg.LockTimeout, "lock-timeout", state.DefaultLockTimeout, "how long to wait for another process to release state.db")
	fs.DurationVar(&cfg.IdempotencyRetention, "idempotency-retention", state.DefaultIdempotencyRetention, "how long a write's idempotency key is remembered")
	cfg.EmbedderConfig.BindFlags(fs)
	embedWrites := fs.Bool("embed-writes", true, "with --embedder: embed every indexed write that carries no embedding (false: only writes that ask, embed ALWAYS)")
	retention := fs.String("retention", "", `retention rules, ";"-separated, each scope=(*|a kind|one scope),prefix=P,max-age=DURATION,max-entries=N, e.g. scope=session,prefix=conversation/,max-age=720h,max-entries=1000 (default: keep everything)`)
	retentionFile := fs.String("retention-file", "", `JSON file of retention rules, added to --retention: {"rules":[{"scope":"session","prefix":"conversation/","max_age":"720h","max_entries":1000}]}`)
	fs.DurationVar(&cfg.RetentionInterval, "retention-interval", state.DefaultRetentionInterval, "time between retention sweeps")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "json", "json or text")
	fs.Usage = flagenv.Usage(fs, envPrefix, "state: the layer0 StateService on bbolt")
	if err := flagenv.Parse(fs, envPrefix, args, nil); err != nil {
		return err
	}
	log, err := logging.New(stderr, logging.Options{Level: *logLevel, Format: *logFormat, Service: "state"})
	if err != nil {
		return err
	}
	cfg.Log = log
	cfg.NoEmbedWrites = !*embedWrites
	if cfg.Retention, err = state.ParseRetention(*retention); err != nil {
		return fmt.Errorf("--retention: %w", err)
	}
	if *retentionFile != "" {
		rules, err := state.ReadRetentionFile(*retentionFile)
		if err != nil {
			return fmt.Errorf("--retention-file: %w", err)
		}
		cfg.Retention = append(cfg.Retention, rules...)
	}
	if cfg.EmbedderConfig.Provider == embed.ProviderTest {
		log.Warn("TEST EMBEDDER: a fixed word table, not a model; for tests only")
	}
	// The policy middleware, when configured: unreachable and fail-closed,
	// start-up fails rather than serve without the policy. It is dialled
	// here and closed after state.Run returns (Config.Middleware takes it
	// dialled); state.Run puts it outside the audit log.
	mwFlags.Client.Dev, mwFlags.Client.Plaintext = cfg.Server.Dev, cfg.Server.Plaintext
	mw, closeMW, err := remote.Dial(ctx, mwFlags, log)
	if err != nil {
		return err
	}
	defer closeMW()
	if mw != nil { // a nil *remote.Middleware is not a nil StoreMiddleware
		cfg.Middleware = mw
	}
	return state.Run(ctx, cfg)
}
