package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/store"
)

// Defaults of Config (and of the binary's flags).
const (
	// DefaultAddr is the listen address when Config.Server.Addr is empty
	// (--addr).
	DefaultAddr = "127.0.0.1:7072"
	// DefaultDataDir is the bbolt backend's directory when Config.DataDir
	// is empty (--data-dir).
	DefaultDataDir = ".data/state"
)

// The storage backends Config.Backend names (--backend).
const (
	// BackendBolt is a bbolt file and its bleve index in Config.DataDir:
	// durable, one process. The default.
	BackendBolt = "bolt"
	// BackendPostgres is a PostgreSQL database that several replicas
	// share (Config.PostgresDSN or Config.PostgresDSNFile).
	BackendPostgres = "postgres"
	// BackendMemory keeps everything in memory: for tests; lost on exit.
	BackendMemory = "memory"
)

// StoreMiddleware is a policy middleware in front of the StateService, at
// the Middleware protocol's store boundary: *remote.Middleware of
// pkg/middleware/remote. Run takes it dialled: the binary dials it from
// its --middleware-* flags (remote.Dial), and the store boundary's tests
// (pkg/middleware/store) pass the one they start.
type StoreMiddleware interface {
	// StoreServerInterceptor is applied to every call of the service.
	StoreServerInterceptor() grpc.UnaryServerInterceptor
}

// Config is everything Run needs to serve state: what its binary's flags
// set. Zero values take the defaults noted on each field.
type Config struct {
	// Server is the listen address, TLS, auth, limits and shutdown
	// (pkg/grpcserver). Name defaults to "state", Addr to DefaultAddr.
	Server grpcserver.Config
	// Log receives the service's logs; nil discards them. The server's
	// call log goes through CallLogHandler, so it never quotes the
	// caller's keys.
	Log *slog.Logger
	// Listener, when set, is served instead of listening on Server.Addr
	// (tests, embedding). Run owns it: it is closed when Run returns,
	// whether Run served or failed to start.
	Listener net.Listener

	// Middleware, when set, is the policy middleware applied to every
	// StateService call, outside the audit log: the *remote.Middleware
	// that the binary dials from its --middleware-* flags (remote.Dial in
	// pkg/middleware/remote; the caller closes its connection after Run
	// returns). Nil: no middleware.
	Middleware StoreMiddleware

	// Backend is the storage: BackendBolt (the default), BackendPostgres
	// or BackendMemory (--backend).
	Backend string
	// DataDir is the bbolt backend's directory, created if missing; it
	// holds state.db and its search index state.db.bleve (--data-dir).
	// Default DefaultDataDir.
	DataDir string
	// PostgresDSN is the PostgreSQL database of BackendPostgres
	// (--postgres-dsn).
	PostgresDSN string
	// PostgresDSNFile is a file holding the DSN, which keeps a password
	// out of argv and env (--postgres-dsn-file); it wins over PostgresDSN.
	// Its content is trimmed of surrounding white space.
	PostgresDSNFile string
	// Store, when set, is served instead of a backend Run opens: Backend,
	// DataDir, PostgresDSN(File), Limits, LockTimeout and
	// IdempotencyRetention are then unused (the store was opened with its
	// own options), and the caller closes it after Run returns. For
	// embedding state on a store the program opened itself. Set it or
	// Backend, not both.
	Store Backend

	// Limits are the largest key and value accepted (--max-key-bytes,
	// --max-value-bytes); zero or negative fields take DefaultLimits, and
	// MaxKeyBytes is capped at MaxKeyBytesCeiling.
	Limits Limits
	// LockTimeout is how long the bbolt backend waits for another process
	// to release state.db before start-up fails (--lock-timeout). Default
	// DefaultLockTimeout.
	LockTimeout time.Duration
	// IdempotencyRetention is how long a write's idempotency key is
	// remembered (--idempotency-retention). Default
	// DefaultIdempotencyRetention.
	IdempotencyRetention time.Duration

	// EmbedderConfig selects the embedder of vector and hybrid search
	// (--embedder and the --embedder-* flags); Provider empty: none.
	EmbedderConfig embed.Config
	// Embedder, when set, is used instead of one built from
	// EmbedderConfig (an embedder's own, tests).
	Embedder embed.Embedder
	// NoEmbedWrites stops the embedder from embedding every indexed
	// Write that neither carries an embedding nor says embed NEVER
	// (--embed-writes=false); Writes with embed ALWAYS still are.
	NoEmbedWrites bool

	// Retention is the retention policy the service enforces with a
	// background sweeper (--retention, --retention-file; retention.go),
	// on the bolt and memory backends; none: nothing is ever deleted.
	Retention []RetentionRule
	// RetentionInterval is the time between sweeps
	// (--retention-interval); zero: DefaultRetentionInterval.
	RetentionInterval time.Duration
	// RetentionNow is the sweeper's clock (tests); nil: time.Now.
	RetentionNow func() time.Time
}

// Run serves state until ctx ends, then stops gracefully (health turns
// NOT_SERVING, in-flight calls get Server.ShutdownTimeout) and returns
// nil. A bad Config or a failed start-up is an error naming the setting
// (and its flag, e.g. `--backend "pg": want bolt, postgres or memory`)
// before anything is served.
//
// The order of start-up: the Config's values are checked; the server is
// built (a bad
// security config fails here, before any file is made); the backend is
// opened (the bbolt file is created, or the PostgreSQL schema migrated);
// then it serves. The interceptors of the StateService, outermost first:
// the standard chain of pkg/grpcserver (call log through CallLogHandler,
// error mapping, recovery, auth, protovalidate), then the middleware,
// then the audit log of writes and deletes. The middleware is outside the
// audit log so that the log records what was applied: a write the
// middleware halts before is never applied (and not audited), a write
// whose result it withholds after was applied (and is audited as such),
// and a rewritten write is audited as it was stored.
func Run(ctx context.Context, cfg Config) error {
	served := false
	if cfg.Listener != nil {
		defer func() {
			if !served {
				cfg.Listener.Close()
			}
		}()
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Server.Name == "" {
		cfg.Server.Name = "state"
	}
	if cfg.Server.Addr == "" {
		cfg.Server.Addr = DefaultAddr
	}
	if cfg.DataDir == "" {
		cfg.DataDir = DefaultDataDir
	}
	if err := cfg.check(); err != nil {
		return err
	}

	// Service interceptors, outermost first: the middleware (which logs
	// each verdict it applies), then the audit log.
	var unary []grpc.UnaryServerInterceptor
	if cfg.Middleware != nil {
		unary = append(unary, cfg.Middleware.StoreServerInterceptor())
	}
	unary = append(unary, store.AuditInterceptor(log))
	// The server before any file is made: a bad security config fails first.
	// Its call log never quotes the caller's keys (CallLogHandler).
	srvLog := slog.New(CallLogHandler(log.Handler()))
	opts := []grpcserver.Option{grpcserver.WithInterceptors(unary, nil)}
	if cfg.Middleware == nil {
		// A Write stores the bytes its value arrived in (codec.go); not
		// behind a middleware, which may change the value it was
		// decoded into.
		opts = append(opts, grpcserver.WithServerOptions(grpc.ForceServerCodecV2(receivingCodec{})))
	}
	srv, err := grpcserver.New(cfg.Server, srvLog, opts...)
	if err != nil {
		return err
	}
	embedder := cfg.Embedder
	if embedder == nil {
		if embedder, err = embed.New(cfg.EmbedderConfig); err != nil {
			return err
		}
	}
	backend := cfg.Store
	if backend == nil {
		backend, err = cfg.open(ctx, log)
		if err != nil {
			return err
		}
		defer backend.Close()
	}

	if len(cfg.Retention) > 0 {
		sw, err := NewSweeper(backend, cfg.Retention, cfg.RetentionNow, log)
		if err != nil {
			return err
		}
		sctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); sw.Run(sctx, cfg.RetentionInterval) }()
		defer func() { stop(); <-done }() // before the backend closes
		for _, r := range cfg.Retention {
			log.Info("retention rule", "rule", r.String())
		}
	}
	handler := NewServer(backend, WithEmbedder(embedder, !cfg.NoEmbedWrites), WithServerLogger(log))
	_, vectors := backend.(VectorBackend)
	switch {
	case embedder != nil && vectors:
		log.Info("vector search", "embedder", embedder.Name(), "embed_writes", !cfg.NoEmbedWrites, "index", "in memory per replica: exact below 4096 vectors of a scope, HNSW from there")
	case embedder != nil:
		log.Warn("an embedder is configured but this backend has no vector index; vector and hybrid search answer UNIMPLEMENTED", "embedder", embedder.Name())
	case vectors:
		log.Info("vector search without an embedder: only writes and searches that carry embeddings; set --embedder to embed text")
	}
	// A store middleware sees the values read on Read only (store.CallOf):
	// List then returns no values, and callers read each key.
	handler.valuesByRead = cfg.Middleware != nil
	statev1.RegisterStateServiceServer(srv, handler)
	lis := cfg.Listener
	if lis == nil {
		if lis, err = srv.Listen(); err != nil {
			return err
		}
	}
	served = true
	start := time.Now()
	err = srv.Serve(ctx, lis)
	log.Info("exit", "uptime", time.Since(start).Round(time.Millisecond).String())
	return err
}

// check reports the settings that are wrong whatever else happens, before
// anything is dialled or opened.
func (c *Config) check() error {
	if c.Store != nil {
		if c.Backend != "" {
			return fmt.Errorf("Config.Store and Config.Backend (--backend %q) are exclusive: set one", c.Backend)
		}
		return nil
	}
	switch c.Backend {
	case "", BackendBolt, BackendMemory:
	case BackendPostgres:
		if c.PostgresDSN == "" && c.PostgresDSNFile == "" {
			return errors.New("--backend postgres needs --postgres-dsn or --postgres-dsn-file")
		}
	default:
		return fmt.Errorf("--backend %q: want bolt, postgres or memory", c.Backend)
	}
	return nil
}

// open opens the configured backend.
func (c *Config) open(ctx context.Context, log *slog.Logger) (Backend, error) {
	opts := []Option{
		WithLimits(c.Limits),
		WithIdempotencyRetention(c.IdempotencyRetention),
		WithLockTimeout(c.LockTimeout),
		WithLogger(log),
	}
	switch c.Backend {
	case "", BackendBolt:
		if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("--data-dir: %w", err)
		}
		path := filepath.Join(c.DataDir, "state.db")
		b, err := OpenBolt(path, opts...)
		if err != nil {
			return nil, err
		}
		log.Info("data", "file", path, "index", path+".bleve")
		return b, nil
	case BackendPostgres:
		dsn := c.PostgresDSN
		if c.PostgresDSNFile != "" {
			raw, err := os.ReadFile(c.PostgresDSNFile)
			if err != nil {
				return nil, fmt.Errorf("--postgres-dsn-file: %w", err)
			}
			dsn = strings.TrimSpace(string(raw))
		}
		if dsn == "" {
			return nil, errors.New("--backend postgres needs --postgres-dsn or --postgres-dsn-file")
		}
		p, err := OpenPostgres(ctx, dsn, opts...)
		if err != nil {
			return nil, err
		}
		log.Info("data", "backend", "postgres")
		return p, nil
	case BackendMemory:
		m := NewMemory(opts...)
		log.Warn("IN-MEMORY BACKEND: nothing is durable; data is lost on exit")
		return m, nil
	}
	return nil, fmt.Errorf("--backend %q: want bolt, postgres or memory", c.Backend)
}
