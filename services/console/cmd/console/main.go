// Command console serves neuron's web console: workflows, approvals,
// agents and state in a browser, over the orchestrator's and the State
// service's gRPC APIs. Every flag has an env fallback: --addr is
// NEURON_CONSOLE_ADDR, and so on. Run with --help for the list.
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

	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/services/console"
)

const envPrefix = "NEURON_CONSOLE"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "console: %v\n", err)
		os.Exit(1)
	}
}

// run is the flag layer: it parses args (with the NEURON_CONSOLE_* env
// fallbacks) into a console.Config and calls console.Run.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg := console.Config{}
	cfg.Orchestrator.Target = "127.0.0.1:7070"
	cfg.State.Target = "127.0.0.1:7072"
	fs := flag.NewFlagSet("console", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Addr, "addr", console.DefaultAddr, "HTTP listen address (host:port)")
	fs.BoolVar(&cfg.Dev, "dev", false, "development mode: no login, plaintext to the services, only loopback Host names answered (never in production)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "serve HTTPS with this certificate PEM file (else plain HTTP: loopback, or behind a proxy that terminates TLS)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "private key PEM file of --tls-cert")
	cfg.Orchestrator.BindFlags(fs, "orchestrator")
	cfg.State.BindFlags(fs, "state")
	fs.StringVar(&cfg.TracesURL, "traces-url", "", "the trace store's query API the trace viewer reads workflows' traces from: Jaeger's, e.g. http://127.0.0.1:16686 (empty: no trace viewer)")
	fs.StringVar(&cfg.TracesService, "traces-service", console.DefaultTracesService, "the orchestrator's service name in the traces (its OTEL_SERVICE_NAME)")
	plaintext := fs.Bool("plaintext", false, "dial the services without TLS outside dev mode (only behind a mesh that encrypts); tokens are still sent")
	fs.DurationVar(&cfg.SessionTTL, "session-ttl", console.DefaultSessionTTL, "how long a login lasts")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", console.DefaultMaxSessions, "sessions kept at once; a login beyond it ends the oldest")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", console.DefaultShutdownTimeout, "graceful stop limit")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "json", "json or text")
	fs.Usage = flagenv.Usage(fs, envPrefix, "console: neuron's web console (workflows, approvals, agents, state)")
	if err := flagenv.Parse(fs, envPrefix, args, nil); err != nil {
		return err
	}
	for _, c := range []*struct{ dev, plain *bool }{{&cfg.Orchestrator.Dev, &cfg.Orchestrator.Plaintext}, {&cfg.State.Dev, &cfg.State.Plaintext}} {
		*c.dev, *c.plain = cfg.Dev, *plaintext
	}
	log, err := logging.New(stderr, logging.Options{Level: *logLevel, Format: *logFormat, Service: "console"})
	if err != nil {
		return err
	}
	cfg.Log = log
	return console.Run(ctx, cfg)
}
