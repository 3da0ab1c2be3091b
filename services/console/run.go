package console

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
)

// Defaults.
const (
	// DefaultAddr is where the console serves (neuron up's address).
	DefaultAddr = "127.0.0.1:7080"
	// DefaultSessionTTL is how long a login lasts.
	DefaultSessionTTL = 12 * time.Hour
	// DefaultShutdownTimeout bounds the graceful stop.
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultMaxSessions bounds the sessions kept at once.
	DefaultMaxSessions = 10000
)

// Config is everything Run needs. The binary fills it from flags.
type Config struct {
	// Addr is the HTTP listen address, host:port.
	Addr string
	// Listener, when set, is served instead of listening on Addr (tests).
	// Run closes it.
	Listener net.Listener
	// Dev serves without a login: every request acts with the token of
	// Orchestrator.TokenFile and State.TokenFile (none in neuron up's dev
	// mode, whose services do not authenticate). Only loopback Host
	// headers are answered (a DNS-rebinding page cannot reach it), and
	// state-changing requests still need the CSRF token.
	Dev bool
	// TLSCert and TLSKey serve HTTPS. Without them the console serves
	// plain HTTP: on loopback (browsers treat it as a secure context, so
	// its Secure cookies work) or behind a proxy that terminates TLS.
	TLSCert, TLSKey string
	// Orchestrator reaches the orchestrator, which serves the
	// OrchestratorService and the AgentService.
	Orchestrator grpcclient.Config
	// State reaches the State service.
	State grpcclient.Config
	// SessionTTL is how long a login lasts (0: DefaultSessionTTL).
	SessionTTL time.Duration
	// MaxSessions bounds the sessions kept at once; a login beyond it
	// drops the session closest to its end (0: DefaultMaxSessions).
	MaxSessions int
	// ShutdownTimeout bounds the graceful stop (0: DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// TracesURL is the trace store's query API the trace viewer reads
	// workflows' traces from: Jaeger's (v1 or v2), e.g.
	// http://127.0.0.1:16686. Empty: the viewer says none is configured.
	TracesURL string
	// TracesService is the orchestrator's service name in the traces
	// (empty: DefaultTracesService).
	TracesService string
	// Log receives the console's logs; nil discards them.
	Log *slog.Logger
}

// validate refuses a configuration that would hand out authority the
// console must not have.
func (c *Config) validate() error {
	if c.Orchestrator.Target == "" || c.State.Target == "" {
		return errors.New("--orchestrator-addr and --state-addr are required")
	}
	if !c.Dev && (c.Orchestrator.TokenFile != "" || c.State.TokenFile != "") {
		// Outside dev every call carries the logged-in person's token;
		// a token of the console's own would be sent beside it and act
		// for everyone.
		return errors.New("--orchestrator-token-file and --state-token-file are for --dev only: outside dev the console calls with each person's own token from the login page")
	}
	if c.TracesURL != "" {
		u, err := url.Parse(c.TracesURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
			return fmt.Errorf("--traces-url %q: want the trace store's query API as http://host:port or https://host:port (Jaeger's, e.g. http://127.0.0.1:16686)", c.TracesURL)
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	return nil
}

// Run serves the console until ctx ends, then stops gracefully.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	occ, err := grpcclient.Dial(cfg.Orchestrator)
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	defer occ.Close()
	scc, err := grpcclient.Dial(cfg.State)
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	defer scc.Close()
	srv := New(Options{
		Dev: cfg.Dev, Log: log, SessionTTL: cfg.SessionTTL, MaxSessions: cfg.MaxSessions,
		PlaintextTokens: cfg.Orchestrator.Dev || cfg.Orchestrator.Plaintext,
		TracesURL:       cfg.TracesURL, TracesService: cfg.TracesService,
	}, orchestratorv1.NewOrchestratorServiceClient(occ), agentv1.NewAgentServiceClient(occ), statev1.NewStateServiceClient(scc))

	lis := cfg.Listener
	if lis == nil {
		addr := cfg.Addr
		if addr == "" {
			addr = DefaultAddr
		}
		if lis, err = net.Listen("tcp", addr); err != nil {
			return err
		}
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	scheme := "http"
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			lis.Close()
			return fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		hs.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		lis = tls.NewListener(lis, hs.TLSConfig)
		scheme = "https"
	}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(lis) }()
	log.Info("SERVING", "addr", lis.Addr().String(), "url", scheme+"://"+lis.Addr().String()+"/", "dev", cfg.Dev,
		"orchestrator", cfg.Orchestrator.Target, "state", cfg.State.Target, "traces", cfg.TracesURL)
	select {
	case err := <-done:
		srv.Close()
		return err
	case <-ctx.Done():
	}
	timeout := cfg.ShutdownTimeout
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	srv.Close() // ends the live streams, which Shutdown would wait for
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("stopped")
	return nil
}
