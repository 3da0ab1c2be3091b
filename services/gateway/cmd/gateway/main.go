// Command gateway serves the neuron gateway: the agents of an
// orchestrator over A2A (JSON-RPC and gRPC), MCP (streamable HTTP) and an
// AG-UI event stream for chat front ends, with one lane per session.
// Every flag has an env fallback: --orchestrator-addr is
// NEURON_GATEWAY_ORCHESTRATOR_ADDR, and so on. Run with --help for the
// list.
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
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/services/gateway"
)

const envPrefix = "NEURON_GATEWAY"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "gateway: %v\n", err)
		os.Exit(1)
	}
}

// run parses args (with the NEURON_GATEWAY_* env fallbacks) into a
// gateway.Config and serves it until ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg := gateway.Config{Server: grpcserver.Config{Name: "gateway", Addr: gateway.DefaultAddr}}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.Server.BindFlags(fs)
	cfg.Orchestrator.BindFlags(fs, "orchestrator")
	cfg.State.BindFlags(fs, "state")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", gateway.DefaultHTTPAddr, "HTTP listen address: A2A JSON-RPC and agent cards, MCP (/mcp), the chat event stream (/v1/chat)")
	fs.StringVar(&cfg.PublicURL, "public-url", "", "the HTTP base URL clients reach the gateway at, for agent cards (default: http://<--http-addr>)")
	fs.StringVar(&cfg.PublicGRPCAddr, "public-grpc-addr", "", "the gRPC address put in agent cards (default: --addr)")
	fs.StringVar(&cfg.Agents, "agents", gateway.AgentsFromOrchestrator, "where the agents come from: orchestrator (its AgentService) or a registry YAML file")
	fs.StringVar(&cfg.DefaultAgent, "default-agent", "", "the agent of A2A gRPC messages that name none, and of /.well-known/agent-card.json")
	cfg.Channels.BindFlags(fs)
	fs.IntVar(&cfg.LaneDepth, "lane-depth", gateway.DefaultLaneDepth, "messages that may wait per session behind the one running; one more is refused (RESOURCE_EXHAUSTED, HTTP 429)")
	fs.DurationVar(&cfg.LaneLease, "lane-lease", gateway.DefaultLaneLease, "how long a replica's hold on a durable lane lasts unless renewed: a live replica takes over the lanes of a dead one after that")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "json", "json or text")
	fs.Usage = flagenv.Usage(fs, envPrefix, "gateway: the neuron agents over A2A, MCP and server-sent events")
	if err := flagenv.Parse(fs, envPrefix, args, nil); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (flags only; see --help)", fs.Args())
	}
	log, err := logging.New(stderr, logging.Options{Level: *logLevel, Format: *logFormat, Service: "gateway"})
	if err != nil {
		return err
	}
	cfg.Log = log
	cfg.Orchestrator.Plaintext = cfg.Server.Plaintext
	cfg.State.Plaintext = cfg.Server.Plaintext
	return gateway.Run(ctx, cfg)
}
