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
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/middleware/audit"
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

func run(ctx context.Context, args []string, stderr io.Writer) error {
	srvCfg := grpcserver.Config{Name: "state", Addr: "127.0.0.1:7072"}
	fs := flag.NewFlagSet("state", flag.ContinueOnError)
	fs.SetOutput(stderr)
	srvCfg.BindFlags(fs)
	var mwFlags remote.Flags
	mwFlags.Bind(fs)
	var (
		dataDir         = fs.String("data-dir", ".data/state", "directory of the bbolt file (state.db) and its search index (state.db.bleve)")
		backend         = fs.String("backend", "bolt", "storage backend: bolt (durable), postgres (shared by replicas) or memory (tests only; lost on exit)")
		postgresDSN     = fs.String("postgres-dsn", "", "PostgreSQL DSN for --backend postgres (prefer --postgres-dsn-file when it holds a password)")
		postgresDSNFile = fs.String("postgres-dsn-file", "", "file holding the PostgreSQL DSN for --backend postgres (keeps the password out of argv and env)")
		maxKey          = fs.Int("max-key-bytes", state.DefaultLimits().MaxKeyBytes, "largest key accepted, in bytes")
		maxValue        = fs.Int("max-value-bytes", state.DefaultLimits().MaxValueBytes, "largest value accepted, in bytes of its JSON encoding")
		lockTimeout     = fs.Duration("lock-timeout", state.DefaultLockTimeout, "how long to wait for another process to release state.db")
		retention       = fs.Duration("idempotency-retention", state.DefaultIdempotencyRetention, "how long a write's idempotency key is remembered")
		logLevel        = fs.String("log-level", "info", "debug, info, warn or error")
		logFormat       = fs.String("log-format", "json", "json or text")
	)
	fs.Usage = flagenv.Usage(fs, envPrefix, "state: the layer0 StateService on bbolt")
	if err := flagenv.Parse(fs, envPrefix, args, nil); err != nil {
		return err
	}
	log, err := logging.New(stderr, logging.Options{Level: *logLevel, Format: *logFormat, Service: "state"})
	if err != nil {
		return err
	}
	// The policy middleware, when configured: unreachable and fail-closed,
	// start-up fails rather than serve without the policy.
	mwFlags.Client.Dev, mwFlags.Client.Plaintext = srvCfg.Dev, srvCfg.Plaintext
	mw, closeMW, err := remote.Dial(ctx, mwFlags, log)
	if err != nil {
		return err
	}
	defer closeMW()
	// Service interceptors, outermost first. The middleware is outside
	// the audit log so that the log records what was applied: a write the
	// middleware halts before is never applied (and not audited), a write
	// whose result it withholds after was applied (and is audited as such),
	// and a rewritten write is audited as it was stored. The middleware
	// logs each verdict it applies.
	var unary []grpc.UnaryServerInterceptor
	if mw != nil {
		unary = append(unary, mw.StoreServerInterceptor())
	}
	unary = append(unary, audit.UnaryServerInterceptor(audit.WithLogger(log)))
	// The server before any file is made: a bad security config fails first.
	// Its call log never quotes the caller's keys (state.CallLogHandler).
	srvLog := slog.New(state.CallLogHandler(log.Handler()))
	srv, err := grpcserver.New(srvCfg, srvLog, grpcserver.WithInterceptors(unary, nil))
	if err != nil {
		return err
	}
	opts := []state.Option{
		state.WithLimits(state.Limits{MaxKeyBytes: *maxKey, MaxValueBytes: *maxValue}),
		state.WithIdempotencyRetention(*retention),
		state.WithLockTimeout(*lockTimeout),
		state.WithLogger(log),
	}
	var store state.Backend
	switch *backend {
	case "bolt":
		if err := os.MkdirAll(*dataDir, 0o700); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		path := filepath.Join(*dataDir, "state.db")
		b, err := state.OpenBolt(path, opts...)
		if err != nil {
			return err
		}
		store = b
		log.Info("data", "file", path, "index", path+".bleve")
	case "postgres":
		dsn := *postgresDSN
		if *postgresDSNFile != "" {
			raw, err := os.ReadFile(*postgresDSNFile)
			if err != nil {
				return fmt.Errorf("--postgres-dsn-file: %w", err)
			}
			dsn = strings.TrimSpace(string(raw))
		}
		if dsn == "" {
			return errors.New("--backend postgres needs --postgres-dsn or --postgres-dsn-file")
		}
		p, err := state.OpenPostgres(ctx, dsn, opts...)
		if err != nil {
			return err
		}
		store = p
		log.Info("data", "backend", "postgres")
	case "memory":
		store = state.NewMemory(opts...)
		log.Warn("IN-MEMORY BACKEND: nothing is durable; data is lost on exit")
	default:
		return fmt.Errorf("--backend %q: want bolt, postgres or memory", *backend)
	}
	defer store.Close()

	statev1.RegisterStateServiceServer(srv, state.NewServer(store))
	lis, err := srv.Listen()
	if err != nil {
		return err
	}
	start := time.Now()
	err = srv.Serve(ctx, lis)
	log.Info("exit", "uptime", time.Since(start).Round(time.Millisecond).String())
	return err
}
