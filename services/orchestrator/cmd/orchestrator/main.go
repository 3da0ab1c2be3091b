// Command orchestrator serves layer0.orchestrator.v1.OrchestratorService
// (dispatch, exactly-once effects, durable workflows in a bbolt journal,
// signals and queries) and layer0.lifecycle.v1.LifecycleService (budget,
// compaction and observability events). It parses its flags into a
// serve.Config and calls serve.Run, which holds the wiring. Every flag
// has an env fallback: --agents is NEURON_ORCHESTRATOR_AGENTS, and so on.
// Run with --help for the list.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/journal"
	"github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/orchestrator/temporal"
)

const envPrefix = "NEURON_ORCHESTRATOR"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "orchestrator: %v\n", err)
		os.Exit(1)
	}
}

// bindPeer registers the TLS and token flags for calls to one kind of
// agent service; addresses come from the agent registry.
func bindPeer(fs *flag.FlagSet, c *grpcclient.Config, name string) {
	fs.StringVar(&c.CAFile, name+"-ca", "", "CA bundle that signed the "+name+" services' certificates")
	fs.StringVar(&c.CertFile, name+"-cert", "", "client certificate for mTLS to "+name+" services")
	fs.StringVar(&c.KeyFile, name+"-key", "", "client key for mTLS to "+name+" services")
	fs.StringVar(&c.TokenFile, name+"-token-file", "", "file holding the bearer token for "+name+" services")
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg := serve.Config{Server: grpcserver.Config{Name: "orchestrator", Addr: "127.0.0.1:7070"}}
	fs := flag.NewFlagSet("orchestrator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.Server.BindFlags(fs)
	cfg.State.BindFlags(fs, "state")
	bindPeer(fs, &cfg.Operator, "operator")
	bindPeer(fs, &cfg.Environment, "environment")
	cfg.Middleware.Bind(fs)
	var (
		maxDepth  = fs.Uint("max-delegation-depth", orchestrator.DefaultMaxDepth, "deepest delegation chain allowed (the root agent is depth 0)")
		warn      = fs.String("budget-warn-fraction", orchestrator.DefaultWarnFraction, "fraction of a workflow budget at which a BudgetWarning is sent (and a downgrade_model takes over)")
		logLevel  = fs.String("log-level", "info", "debug, info, warn or error")
		logFormat = fs.String("log-format", "json", "json or text")
		tls       = &cfg.Temporal.TLS
	)
	fs.StringVar(&cfg.Agents, "agents", "", "YAML file of the agent registry (required): agent id -> operator or environment address and defaults")
	fs.Func("models", "comma-separated model names agent definitions may name beyond the operator's model catalog: those an OpenAI-compatible server (Ollama, vLLM) serves", func(v string) error {
		cfg.Models = append(cfg.Models, flagenv.SplitList(v)...)
		return nil
	})
	fs.StringVar(&cfg.DataDir, "data-dir", serve.DefaultDataDir, "directory of the workflow journal (journal.db)")
	fs.DurationVar(&cfg.LockTimeout, "lock-timeout", journal.DefaultLockTimeout, "how long to wait for another process to release journal.db")
	retention := fs.Duration("retention", serve.DefaultRetention, "delete a finished workflow (COMPLETED, FAILED, CANCELED) from the journal this long after it ended (at least "+journal.MinRetention.String()+"); 0: keep them for any age. RUNNING and SUSPENDED workflows are never deleted")
	retentionMax := fs.Int("retention-max-workflows", serve.DefaultRetentionMaxWorkflows, "most finished workflows the journal keeps; those that ended first are deleted beyond it (but none that ended less than "+journal.MinRetention.String()+" ago); 0: any number")
	fs.Uint64Var(&cfg.Engine.MaxSteps, "max-steps", orchestrator.DefaultMaxSteps, "most operator calls one workflow may make")
	fs.IntVar(&cfg.Engine.Workers, "workers", orchestrator.DefaultWorkers, "DispatchMany's concurrency when the request names none")
	fs.IntVar(&cfg.EventsBuffer, "events-buffer", serve.DefaultEventsBuffer, "lifecycle events kept for subscribers that reconnect with after_sequence")
	fs.IntVar(&cfg.SubscriberBuffer, lifecycle.FlagSubscriberBuffer, serve.DefaultSubscriberBuffer, "events buffered per lifecycle subscriber; a subscriber that falls further behind is ended (RESOURCE_EXHAUSTED, with the after_sequence to resume from) instead of slowing dispatch")
	fs.IntVar(&cfg.SubscriberBufferBytes, lifecycle.FlagSubscriberBufferBytes, serve.DefaultSubscriberBufferBytes, "bytes of events (encoded) buffered per lifecycle subscriber; a subscriber that falls further behind is ended like one over --"+lifecycle.FlagSubscriberBuffer)
	fs.DurationVar(&cfg.SubscriberSendTimeout, lifecycle.FlagSendTimeout, lifecycle.DefaultSendTimeout, "end a lifecycle subscriber whose client has not read an event for this long")
	fs.IntVar(&cfg.MaxStreams, lifecycle.FlagMaxStreams, lifecycle.DefaultMaxStreams, "most LifecycleService.Subscribe streams open at once; one more is refused (RESOURCE_EXHAUSTED)")
	fs.IntVar(&cfg.MaxStreamsPerClient, lifecycle.FlagMaxStreamsPerClient, lifecycle.DefaultMaxStreamsPerClient, "most Subscribe streams one client (its principal, else its IP address) may hold open; one more is refused (RESOURCE_EXHAUSTED)")
	fs.DurationVar(&cfg.ApprovalTimeout, "approval-timeout", 0, "decide a tool call left waiting this long for a person's approval by --approval-timeout-decision; 0: it waits until decided")
	fs.Func("approval-timeout-decision", "what --approval-timeout decides: reject (default) or approve", func(v string) error {
		switch v {
		case "reject":
			cfg.ApprovalTimeoutApprove = false
		case "approve":
			cfg.ApprovalTimeoutApprove = true
		default:
			return fmt.Errorf("%q: want reject or approve", v)
		}
		return nil
	})
	fs.Func("on-limit", "what a workflow does when it reaches its budget or --max-steps: fail (default) or ask (it suspends until UpdateWorkflowLimits raises the limit or refuses)", func(v string) error {
		switch v {
		case "fail":
			cfg.Engine.AskLimits = false
		case "ask":
			cfg.Engine.AskLimits = true
		default:
			return fmt.Errorf("%q: want fail or ask", v)
		}
		return nil
	})
	fs.DurationVar(&cfg.EventLogPoll, "event-log-poll", serve.DefaultEventLogPoll, "how often a subscriber of a workflow's event log (after_workflow_sequence) looks for events another replica recorded")
	fs.StringVar(&cfg.Backend, "backend", serve.BackendBolt, "workflow durability: bolt (a journal in --data-dir; one process) or temporal (workflows on a Temporal cluster; any number of orchestrators)")
	fs.StringVar(&cfg.Temporal.Address, "temporal-address", "", "Temporal frontend host:port for --backend temporal, e.g. 127.0.0.1:7233")
	fs.StringVar(&cfg.Temporal.Namespace, "temporal-namespace", serve.DefaultTemporalNS, "Temporal namespace of the workflows")
	fs.StringVar(&cfg.Temporal.TaskQueue, "temporal-task-queue", temporal.DefaultTaskQueue, "Temporal task queue the workers poll; every orchestrator of one deployment uses the same")
	fs.DurationVar(&cfg.Temporal.HeartbeatTimeout, "temporal-heartbeat-timeout", temporal.DefaultHeartbeatTimeout, "how soon an operator call whose worker died is tried again by another worker")
	fs.DurationVar(&cfg.PeerDownHorizon, "peer-down-horizon", orchestrator.DefaultPeerDownHorizon, "how long an operator or environment service may stay unreachable (restarting) before the calls waiting for it fail; a restart within it fails nothing")
	fs.DurationVar(&cfg.Engine.CallTimeout, "call-timeout", orchestrator.DefaultCallTimeout, "longest one operator call attempt may take (the Dispatch caller's deadline applies too)")
	fs.StringVar(&cfg.Temporal.APIKeyFile, "temporal-api-key-file", "", "file holding a Temporal API key (Temporal Cloud)")
	fs.StringVar(&tls.CAFile, "temporal-ca", "", "CA bundle that signed the Temporal frontend's certificate (empty: the system roots)")
	fs.StringVar(&tls.CertFile, "temporal-cert", "", "client certificate for mTLS to Temporal")
	fs.StringVar(&tls.KeyFile, "temporal-key", "", "client key for mTLS to Temporal")
	fs.StringVar(&tls.ServerName, "temporal-server-name", "", "name to verify in the Temporal frontend's certificate")
	fs.BoolVar(&tls.Plaintext, "temporal-plaintext", false, "reach Temporal without TLS outside --dev (behind a mesh)")
	fs.DurationVar(&cfg.Engine.CallTimeout, "temporal-call-timeout", orchestrator.DefaultCallTimeout, "deprecated spelling of --call-timeout")
	fs.Usage = flagenv.Usage(fs, envPrefix, "orchestrator: the layer0 OrchestratorService and LifecycleService (bbolt journal or Temporal)")
	if err := flagenv.Parse(fs, envPrefix, args, nil); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	// The rest of the range is Run's check; 0 is refused here, where it
	// is not the default.
	frac, err := decimal.NewFromString(*warn)
	if err != nil || frac.IsZero() {
		return fmt.Errorf("--budget-warn-fraction %q: want a number in (0, 1], e.g. 0.8", *warn)
	}
	cfg.Engine.WarnFraction = frac
	// 0 turns a retention bound off, which Config spells negative (its
	// zero is the default); the rest of the range is Run's check.
	if *retention < 0 {
		return fmt.Errorf("--retention %s: want 0 (keep finished workflows for any age) or at least %s", *retention, journal.MinRetention)
	}
	if *retentionMax < 0 {
		return fmt.Errorf("--retention-max-workflows %d: want 0 (keep any number of finished workflows) or more", *retentionMax)
	}
	cfg.Retention, cfg.RetentionMaxWorkflows = cmp.Or(*retention, -1), cmp.Or(*retentionMax, -1)
	cfg.Engine.MaxDepth = uint32(min(*maxDepth, 1<<16))
	log, err := logging.New(stderr, logging.Options{Level: *logLevel, Format: *logFormat, Service: "orchestrator"})
	if err != nil {
		return err
	}
	cfg.Log = log
	// Process-wide, so here rather than in Run: operator calls carry the
	// dispatch's trace context and baggage on.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return serve.Run(ctx, cfg)
}
