// Command orchestrator serves layer0.orchestrator.v1.OrchestratorService
// (dispatch, exactly-once effects, durable workflows in a bbolt journal,
// signals and queries) and layer0.lifecycle.v1.LifecycleService (budget,
// compaction and observability events). Every flag has an env fallback:
// --agents is NEURON_ORCHESTRATOR_AGENTS, and so on. Run with --help for
// the list.
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

	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"google.golang.org/grpc"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/journal"
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
	srvCfg := grpcserver.Config{Name: "orchestrator", Addr: "127.0.0.1:7070"}
	fs := flag.NewFlagSet("orchestrator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	srvCfg.BindFlags(fs)
	var (
		stateCfg, opCfg, envCfg grpcclient.Config
		mw                      remote.Flags
	)
	stateCfg.BindFlags(fs, "state")
	bindPeer(fs, &opCfg, "operator")
	bindPeer(fs, &envCfg, "environment")
	mw.Bind(fs)
	var (
		agents      = fs.String("agents", "", "YAML file of the agent registry (required): agent id -> operator or environment address and defaults")
		dataDir     = fs.String("data-dir", ".data/orchestrator", "directory of the workflow journal (journal.db)")
		lockTimeout = fs.Duration("lock-timeout", journal.DefaultLockTimeout, "how long to wait for another process to release journal.db")
		maxDepth    = fs.Uint("max-delegation-depth", orchestrator.DefaultMaxDepth, "deepest delegation chain allowed (the root agent is depth 0)")
		maxSteps    = fs.Uint64("max-steps", orchestrator.DefaultMaxSteps, "most operator calls one workflow may make")
		workers     = fs.Int("workers", orchestrator.DefaultWorkers, "DispatchMany's concurrency when the request names none")
		warn        = fs.String("budget-warn-fraction", orchestrator.DefaultWarnFraction, "fraction of a workflow budget at which a BudgetWarning is sent (and a downgrade_model takes over)")
		ring        = fs.Int("events-buffer", 4096, "lifecycle events kept for subscribers that reconnect with after_sequence")
		subBuf      = fs.Int("subscriber-buffer", 256, "events buffered per subscriber; a slower subscriber misses events (reported as dropped) instead of slowing dispatch")
		logPoll     = fs.Duration("event-log-poll", time.Second, "how often a subscriber of a workflow's event log (after_workflow_sequence) looks for events another replica recorded")
		logLevel    = fs.String("log-level", "info", "debug, info, warn or error")
		logFormat   = fs.String("log-format", "json", "json or text")
		backend     = fs.String("backend", "bolt", "workflow durability: bolt (a journal in --data-dir; one process) or temporal (workflows on a Temporal cluster; any number of orchestrators)")
		tAddr       = fs.String("temporal-address", "", "Temporal frontend host:port for --backend temporal, e.g. 127.0.0.1:7233")
		tNamespace  = fs.String("temporal-namespace", "default", "Temporal namespace of the workflows")
		tQueue      = fs.String("temporal-task-queue", temporal.DefaultTaskQueue, "Temporal task queue the workers poll; every orchestrator of one deployment uses the same")
		tHeartbeat  = fs.Duration("temporal-heartbeat-timeout", temporal.DefaultHeartbeatTimeout, "how soon an operator call whose worker died is tried again by another worker")
		callTimeout = fs.Duration("call-timeout", orchestrator.DefaultCallTimeout, "longest one operator call attempt may take (the Dispatch caller's deadline applies too)")
		tAPIKeyFile = fs.String("temporal-api-key-file", "", "file holding a Temporal API key (Temporal Cloud)")
		temporalTLS grpcclient.Config
	)
	fs.StringVar(&temporalTLS.CAFile, "temporal-ca", "", "CA bundle that signed the Temporal frontend's certificate (empty: the system roots)")
	fs.StringVar(&temporalTLS.CertFile, "temporal-cert", "", "client certificate for mTLS to Temporal")
	fs.StringVar(&temporalTLS.KeyFile, "temporal-key", "", "client key for mTLS to Temporal")
	fs.StringVar(&temporalTLS.ServerName, "temporal-server-name", "", "name to verify in the Temporal frontend's certificate")
	fs.BoolVar(&temporalTLS.Plaintext, "temporal-plaintext", false, "reach Temporal without TLS outside --dev (behind a mesh)")
	fs.DurationVar(callTimeout, "temporal-call-timeout", orchestrator.DefaultCallTimeout, "deprecated spelling of --call-timeout")
	fs.Usage = flagenv.Usage(fs, envPrefix, "orchestrator: the layer0 OrchestratorService and LifecycleService (bbolt journal or Temporal)")
	if err := flagenv.Parse(fs, envPrefix, args, nil); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *agents == "" {
		return errors.New("--agents is required: a YAML file naming each agent's operator or environment address (see services/orchestrator/testdata/agents.yaml)")
	}
	if stateCfg.Target == "" {
		return errors.New("--state-addr is required: memory effects are applied through the State service")
	}
	switch *backend {
	case "bolt":
	case "temporal":
		if *tAddr == "" {
			return errors.New("--backend temporal needs --temporal-address, the Temporal frontend's host:port (e.g. 127.0.0.1:7233)")
		}
	default:
		return fmt.Errorf("--backend %q: want bolt or temporal", *backend)
	}
	frac, err := decimal.NewFromString(*warn)
	if err != nil || !frac.IsPositive() || frac.GreaterThan(decimal.NewFromInt(1)) {
		return fmt.Errorf("--budget-warn-fraction %q: want a number in (0, 1], e.g. 0.8", *warn)
	}
	for _, c := range []*grpcclient.Config{&stateCfg, &opCfg, &envCfg, &mw.Client} {
		c.Dev, c.Plaintext = srvCfg.Dev, srvCfg.Plaintext
	}
	log, err := logging.New(stderr, logging.Options{Level: *logLevel, Format: *logFormat, Service: "orchestrator"})
	if err != nil {
		return err
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	reg, err := orchestrator.LoadRegistry(*agents)
	if err != nil {
		return err
	}
	srv, err := grpcserver.New(srvCfg, log)
	if err != nil {
		return err
	}
	chain := []grpc.UnaryClientInterceptor{orchestrator.AuditInterceptor(log), orchestrator.BudgetInterceptor()}
	m, closeMW, err := remote.Dial(ctx, mw, log)
	if err != nil {
		return err
	}
	defer closeMW()
	if m != nil {
		chain = append(chain, m.DispatchClientInterceptor())
		log.Info("dispatch middleware", "name", m.Name(), "addr", mw.Client.Target, "fail_open", mw.FailOpen)
	}
	caller := orchestrator.NewGRPCCaller(opCfg, envCfg, chain...)
	defer caller.Close()

	stateConn, err := grpcclient.Dial(stateCfg)
	if err != nil {
		return fmt.Errorf("--state-addr: %w", err)
	}
	defer stateConn.Close()

	opts := orchestrator.Options{
		MaxDepth: uint32(min(*maxDepth, 1<<16)), MaxSteps: *maxSteps, Workers: *workers, WarnFraction: frac,
		CallTimeout: *callTimeout, Log: log,
	}
	deps := orchestrator.Deps{Registry: reg, Caller: caller, State: statev1.NewStateServiceClient(stateConn)}
	var (
		engine     orchestrator.Engine
		stopEngine func()
		bus        *lifecycle.Bus
	)
	if *backend == "temporal" {
		tls := temporalTLS
		tls.Dev = srvCfg.Dev
		tc, err := dialTemporal(*tAddr, *tNamespace, tls, *tAPIKeyFile, log)
		if err != nil {
			return err
		}
		defer tc.Close()
		bus = lifecycle.NewBus(lifecycle.Options{BufferSize: *ring, SubscriberBuffer: *subBuf, StartSequence: uint64(time.Now().UnixMilli()) * 1_000_000})
		deps.Bus = bus
		t := temporal.New(tc, deps, temporal.Options{TaskQueue: *tQueue, HeartbeatTimeout: *tHeartbeat, Engine: opts})
		if err := t.StartWorker(); err != nil {
			bus.Close()
			return err
		}
		engine, stopEngine = t, t.Stop
		log.Info("temporal", "address", *tAddr, "namespace", *tNamespace, "task_queue", *tQueue, "agents", len(reg.Agents()))
	} else {
		if err := os.MkdirAll(*dataDir, 0o700); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		path := filepath.Join(*dataDir, "journal.db")
		j, err := journal.Open(path, *lockTimeout)
		if err != nil {
			return err
		}
		defer j.Close()
		log.Info("journal", "file", path, "agents", len(reg.Agents()))
		bus = lifecycle.NewBus(lifecycle.Options{BufferSize: *ring, SubscriberBuffer: *subBuf, StartSequence: j.Epoch() * 1_000_000_000})
		deps.Bus = bus
		eng := journal.New(j, deps, opts)
		n, err := eng.Resume()
		if err != nil {
			eng.Close()
			bus.Close()
			return fmt.Errorf("resume workflows from %s: %w", path, err)
		}
		if n > 0 {
			log.Info("resumed unfinished workflows", "count", n)
		}
		engine, stopEngine = eng, eng.Close
	}
	defer bus.Close()
	orchestratorv1.RegisterOrchestratorServiceServer(srv, orchestrator.NewServer(engine, opts.Workers))
	lifecyclev1.RegisterLifecycleServiceServer(srv, lifecycle.NewServer(bus, lifecycle.WithLogger(log), lifecycle.WithShutdown(ctx),
		lifecycle.WithWorkflowLog(engine, *logPoll)))
	lis, err := srv.Listen()
	if err != nil {
		stopEngine()
		return err
	}
	// On shutdown, workflows pause first (they stay RUNNING in the journal
	// and resume at the next start; under Temporal, another worker takes
	// them), so Dispatch callers get UNAVAILABLE instead of holding the
	// graceful stop open.
	paused := make(chan struct{})
	served, stopped := context.WithCancel(ctx)
	go func() {
		<-served.Done()
		stopEngine()
		close(paused)
	}()
	err = srv.Serve(ctx, lis)
	stopped()
	<-paused
	return err
}

// dialTemporal connects to the Temporal frontend: TLS unless --dev or
// --temporal-plaintext, an API key when one is given.
func dialTemporal(addr, namespace string, cfg grpcclient.Config, apiKeyFile string, log *slog.Logger) (client.Client, error) {
	opts := client.Options{HostPort: addr, Namespace: namespace, Logger: tlog.NewStructuredLogger(log)}
	if !cfg.Dev && !cfg.Plaintext {
		tc, err := grpcclient.TLSConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("--temporal-ca/--temporal-cert/--temporal-key: %w", err)
		}
		opts.ConnectionOptions.TLS = tc
	}
	if apiKeyFile != "" {
		b, err := os.ReadFile(apiKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--temporal-api-key-file: %w", err)
		}
		key := strings.TrimSpace(string(b))
		if key == "" {
			return nil, fmt.Errorf("--temporal-api-key-file %s is empty", apiKeyFile)
		}
		opts.Credentials = client.NewAPIKeyStaticCredentials(key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.DialContext(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("--temporal-address %s (namespace %q): %w", addr, namespace, err)
	}
	return c, nil
}
