// Package serve starts the orchestrator: Config is what the binary's
// flags set, and Run serves OrchestratorService and LifecycleService
// with it until its context ends. cmd/orchestrator parses flags into a
// Config and calls Run; the tests and the benchmarks call Run too
// (through internal/harness), so what they start is what production
// starts: the same agent registry loading, dispatch-boundary chain,
// State client, engine, lifecycle bus and shutdown order.
//
// Run lives here, not in package orchestrator with the other services'
// Run, because it chooses an engine: the journal and temporal packages
// import package orchestrator (the workflow, the port, the Server), so
// the code that builds either engine has to sit above all three. The
// alternative, an engine factory in the Config, would have left the
// choice of engine, the journal's recovery and the Temporal dial in every
// caller, which is the wiring this package exists to hold once.
package serve

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

	"github.com/shopspring/decimal"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"google.golang.org/grpc"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/pkg/middleware/dispatch"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/agents"
	"github.com/secbear/neuron/services/orchestrator/journal"
	"github.com/secbear/neuron/services/orchestrator/temporal"
)

// Backends.
const (
	// BackendBolt keeps workflows in a bbolt journal in DataDir; one
	// process.
	BackendBolt = "bolt"
	// BackendTemporal runs workflows on a Temporal cluster; any number of
	// orchestrators.
	BackendTemporal = "temporal"
)

// Defaults of Config.
const (
	DefaultDataDir          = ".data/orchestrator"
	DefaultEventsBuffer     = 4096
	DefaultSubscriberBuffer = 256
	// DefaultSubscriberBufferBytes is lifecycle's: 256 KiB.
	DefaultSubscriberBufferBytes = lifecycle.DefaultSubscriberBufferBytes
	DefaultEventLogPoll          = time.Second
	DefaultTemporalNS            = "default"
	// DefaultRetention and DefaultRetentionMaxWorkflows bound the
	// finished workflows the journal keeps: a week, and 100000 (about
	// 470 MiB of trivial workflows; see the README's "Retention").
	DefaultRetention             = 7 * 24 * time.Hour
	DefaultRetentionMaxWorkflows = 100_000
)

// Config is everything Run needs to serve the orchestrator: what its
// binary's flags set. Zero values take the defaults noted on each field.
//
// The peers (State, Operator, Environment, Middleware.Client) are dialled
// without TLS when Server.Dev is set, and without TLS but with their
// tokens when Server.Plaintext is: --dev and --plaintext cover every peer.
//
// Run sets no process-wide state: the binary installs the W3C trace
// context and baggage as OpenTelemetry's propagator, which the clients to
// agents use to carry a dispatch's trace on.
type Config struct {
	// Server is the listen address, TLS, auth, limits and shutdown
	// (pkg/grpcserver).
	Server grpcserver.Config
	// Log receives the service's logs; nil discards them.
	Log *slog.Logger
	// Listener, when set, is served instead of listening on Server.Addr
	// (tests, embedding). Run closes it.
	Listener net.Listener

	// Agents is the YAML file of the agent registry (--agents, required):
	// agent id -> operator or environment address and defaults.
	Agents string
	// Models are model names agent definitions may name beyond the
	// operator's catalog (--models): those an OpenAI-compatible server
	// such as Ollama or vLLM serves, which no catalog can list.
	Models []string
	// State says how to reach the State service, which applies memory
	// effects and, on Temporal, keeps operator outputs (--state-addr,
	// required; --state-ca, ...).
	State grpcclient.Config
	// Operator and Environment are the TLS and token settings of calls to
	// agents' operator and environment services (--operator-ca, ...,
	// --environment-token-file); the addresses come from the registry.
	Operator, Environment grpcclient.Config
	// PeerDownHorizon is how long an operator or environment service may
	// stay unreachable before the calls waiting for it fail
	// (--peer-down-horizon); until then they wait for it to come back.
	// Zero: orchestrator.DefaultPeerDownHorizon.
	PeerDownHorizon time.Duration
	// Middleware is the remote MiddlewareService at the dispatch boundary
	// (--middleware-addr, ...); no address: none.
	Middleware remote.Flags
	// DispatchInterceptors are added to the dispatch-boundary chain of
	// every operator and environment call, after the audit and budget
	// interceptors (pkg/middleware/dispatch) and before the remote
	// Middleware: policies and observers of an embedding program (the
	// binary has none).
	DispatchInterceptors []grpc.UnaryClientInterceptor

	// Engine is what every workflow runs with: MaxDepth
	// (--max-delegation-depth, default orchestrator.DefaultMaxDepth),
	// MaxSteps (--max-steps), Workers (--workers, DispatchMany's default
	// concurrency), WarnFraction (--budget-warn-fraction, in (0, 1]),
	// CallTimeout (--call-timeout), and, for embedding programs only, the
	// budget Policy and the Handlers of custom effects. Zero fields take
	// the defaults of orchestrator.Options; Engine.Log defaults to Log.
	Engine orchestrator.Options
	// Backend is where workflows are kept: BackendBolt (the default) or
	// BackendTemporal (--backend).
	Backend string
	// DataDir holds the bolt backend's journal, journal.db (--data-dir,
	// default DefaultDataDir; created if missing).
	DataDir string
	// LockTimeout is how long the bolt backend waits for another process
	// to release journal.db (--lock-timeout, default
	// journal.DefaultLockTimeout).
	LockTimeout time.Duration
	// JournalOptions are added to journal.Open's. No flag sets them:
	// benchmarks use journal.WithoutSync, which is not a production mode.
	JournalOptions []journal.OpenOption
	// Retention deletes a finished workflow (COMPLETED, FAILED,
	// CANCELED) from the bolt backend's journal once it ended this long
	// ago (--retention, default DefaultRetention; at least
	// journal.MinRetention). Negative: any age (the flag's 0). RUNNING
	// and SUSPENDED workflows are never deleted. Pruning runs at start
	// and then every minute, in small transactions (journal.Retain).
	Retention time.Duration
	// RetentionMaxWorkflows deletes the finished workflows that ended
	// first beyond this many (--retention-max-workflows, default
	// DefaultRetentionMaxWorkflows). Negative: any number (the flag's 0).
	RetentionMaxWorkflows int
	// Temporal configures the temporal backend.
	Temporal Temporal

	// EventsBuffer is how many lifecycle events are kept for subscribers
	// that reconnect with after_sequence (--events-buffer, default
	// DefaultEventsBuffer).
	EventsBuffer int
	// SubscriberBuffer and SubscriberBufferBytes bound what is buffered
	// for each subscriber: events, and their encoded size. A subscriber
	// whose buffer overflows is ended with RESOURCE_EXHAUSTED naming the
	// after_sequence to resume from, instead of slowing dispatch
	// (--subscriber-buffer, default DefaultSubscriberBuffer;
	// --subscriber-buffer-bytes, default DefaultSubscriberBufferBytes).
	SubscriberBuffer      int
	SubscriberBufferBytes int
	// SubscriberSendTimeout ends a subscriber whose client has not read
	// an event for that long (--subscriber-send-timeout, default
	// lifecycle.DefaultSendTimeout).
	SubscriberSendTimeout time.Duration
	// MaxStreams and MaxStreamsPerClient cap the open Subscribe streams,
	// in all and per client (its principal, else its IP address); one
	// more is refused with RESOURCE_EXHAUSTED (--lifecycle-max-streams,
	// default lifecycle.DefaultMaxStreams;
	// --lifecycle-max-streams-per-client, default
	// lifecycle.DefaultMaxStreamsPerClient). See the README's "Slow
	// subscribers" for what they cost.
	MaxStreams, MaxStreamsPerClient int
	// EventLogPoll is how often a subscriber of a workflow's event log
	// looks for events another replica recorded (--event-log-poll,
	// default DefaultEventLogPoll).
	EventLogPoll time.Duration
	// ApprovalTimeout decides tool calls left waiting for a person's
	// approval this long (--approval-timeout; 0: they wait until
	// decided), approving them when ApprovalTimeoutApprove
	// (--approval-timeout-decision approve) and rejecting them otherwise.
	ApprovalTimeout        time.Duration
	ApprovalTimeoutApprove bool
}

// Temporal is how the temporal backend reaches its cluster.
type Temporal struct {
	// Address is the frontend's host:port (--temporal-address, required
	// with BackendTemporal).
	Address string
	// Namespace of the workflows (--temporal-namespace, default
	// DefaultTemporalNS).
	Namespace string
	// TaskQueue the workers poll; every orchestrator of one deployment
	// uses the same (--temporal-task-queue, default
	// temporal.DefaultTaskQueue).
	TaskQueue string
	// HeartbeatTimeout is how soon an operator call whose worker died is
	// made again by another worker (--temporal-heartbeat-timeout, default
	// temporal.DefaultHeartbeatTimeout).
	HeartbeatTimeout time.Duration
	// TLS verifies the frontend and authenticates to it: CAFile (empty:
	// the system roots), CertFile and KeyFile (mTLS), ServerName,
	// Plaintext (--temporal-ca, --temporal-cert, --temporal-key,
	// --temporal-server-name, --temporal-plaintext). No TLS when Dev or
	// Server.Dev is set; its Target is unused (Address is).
	TLS grpcclient.Config
	// APIKeyFile holds a Temporal API key, Temporal Cloud
	// (--temporal-api-key-file).
	APIKeyFile string
}

// withDefaults fills zero fields with the defaults and checks values; an
// error names the flag to fix.
func (c Config) withDefaults() (Config, error) {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Agents == "" {
		return c, errors.New("--agents is required: a YAML file naming each agent's operator or environment address (see services/orchestrator/testdata/agents.yaml)")
	}
	if c.State.Target == "" {
		return c, errors.New("--state-addr is required: memory effects are applied through the State service")
	}
	switch c.Backend {
	case "":
		c.Backend = BackendBolt
	case BackendBolt:
	case BackendTemporal:
		if c.Temporal.Address == "" {
			return c, errors.New("--backend temporal needs --temporal-address, the Temporal frontend's host:port (e.g. 127.0.0.1:7233)")
		}
	default:
		return c, fmt.Errorf("--backend %q: want bolt or temporal", c.Backend)
	}
	if f := c.Engine.WarnFraction; f.IsNegative() || f.GreaterThan(decimal.NewFromInt(1)) {
		return c, fmt.Errorf("--budget-warn-fraction %q: want a number in (0, 1], e.g. 0.8", f.String())
	}
	// From here on, 0 is no bound (journal.Retention's zero).
	switch {
	case c.Retention == 0:
		c.Retention = DefaultRetention
	case c.Retention < 0:
		c.Retention = 0
	case c.Retention < journal.MinRetention:
		return c, fmt.Errorf("--retention %s: want 0 (keep finished workflows for any age) or at least %s: a workflow is read just after it ends", c.Retention, journal.MinRetention)
	}
	switch {
	case c.RetentionMaxWorkflows == 0:
		c.RetentionMaxWorkflows = DefaultRetentionMaxWorkflows
	case c.RetentionMaxWorkflows < 0:
		c.RetentionMaxWorkflows = 0
	}
	for _, p := range []*grpcclient.Config{&c.State, &c.Operator, &c.Environment, &c.Middleware.Client} {
		p.Dev = p.Dev || c.Server.Dev
		p.Plaintext = p.Plaintext || c.Server.Plaintext
		// --otel: spans of the calls this service makes, not only of those
		// it serves.
		p.Telemetry = p.Telemetry || c.Server.Telemetry || c.Server.OTel.Enabled()
	}
	c.Temporal.TLS.Dev = c.Temporal.TLS.Dev || c.Server.Dev
	if c.Engine.Log == nil {
		c.Engine.Log = c.Log
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.EventsBuffer <= 0 {
		c.EventsBuffer = DefaultEventsBuffer
	}
	if c.SubscriberBuffer <= 0 {
		c.SubscriberBuffer = DefaultSubscriberBuffer
	}
	if c.SubscriberBufferBytes <= 0 {
		c.SubscriberBufferBytes = DefaultSubscriberBufferBytes
	}
	if c.SubscriberSendTimeout <= 0 {
		c.SubscriberSendTimeout = lifecycle.DefaultSendTimeout
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = lifecycle.DefaultMaxStreams
	}
	if c.MaxStreamsPerClient <= 0 {
		c.MaxStreamsPerClient = lifecycle.DefaultMaxStreamsPerClient
	}
	if c.EventLogPoll <= 0 {
		c.EventLogPoll = DefaultEventLogPoll
	}
	if c.Temporal.Namespace == "" {
		c.Temporal.Namespace = DefaultTemporalNS
	}
	return c, nil
}

// Run serves the orchestrator until ctx ends, then stops gracefully and
// returns nil: workflows pause first (they stay RUNNING in the journal
// and resume at the next start; under Temporal another worker takes
// them), so Dispatch callers get UNAVAILABLE instead of holding the stop
// open; then health turns NOT_SERVING and in-flight calls get
// Server.ShutdownTimeout. A bad Config or a failed start-up (the registry,
// the journal, resuming its unfinished workflows, the Temporal dial or
// worker) is an error naming the setting, and its flag, before anything
// is served.
func Run(ctx context.Context, cfg Config) (err error) {
	if cfg.Listener != nil {
		defer cfg.Listener.Close()
	}
	cfg, err = cfg.withDefaults()
	if err != nil {
		return err
	}
	log := cfg.Log

	reg, err := orchestrator.LoadRegistry(cfg.Agents)
	if err != nil {
		return err
	}
	srv, err := grpcserver.New(cfg.Server, log)
	if err != nil {
		return err
	}
	// The dispatch boundary (pkg/middleware/dispatch), outermost first:
	// audit, budget, the embedder's, the remote middleware. The caller
	// runs it around every dispatch, streamed or unary alike.
	chain := []grpc.UnaryClientInterceptor{dispatch.AuditInterceptor(log), dispatch.BudgetInterceptor()}
	chain = append(chain, cfg.DispatchInterceptors...)
	m, closeMW, err := remote.Dial(ctx, cfg.Middleware, log)
	if err != nil {
		return err
	}
	defer closeMW()
	if m != nil {
		chain = append(chain, m.DispatchClientInterceptor())
		log.Info("dispatch middleware", "name", m.Name(), "addr", cfg.Middleware.Client.Target, "fail_open", cfg.Middleware.FailOpen)
	}
	caller := orchestrator.NewGRPCCaller(cfg.Operator, cfg.Environment, chain...)
	caller.PeerDownHorizon = cfg.PeerDownHorizon
	defer caller.Close()

	// A State service that restarts is waited for within each call's
	// deadline: effects and kept outputs go on once it is back.
	cfg.State.WaitForReady = true
	stateConn, err := grpcclient.Dial(cfg.State)
	if err != nil {
		return fmt.Errorf("--state-addr: %w", err)
	}
	defer stateConn.Close()

	// Agents are dispatched from their definitions in the State service
	// (services/orchestrator/agents); the --agents file seeds those not
	// defined yet.
	seedCtx, stopSeeding := context.WithCancel(ctx)
	seeded := make(chan struct{})
	defer func() { stopSeeding(); <-seeded }()
	store, agentSrv, err := serveAgents(seedCtx, reg, cfg.Models, statev1.NewStateServiceClient(stateConn), log, seeded)
	if err != nil {
		return err
	}
	reg = orchestrator.SourceRegistry(store, reg)
	agentv1.RegisterAgentServiceServer(srv, agentSrv)
	// Every operator call's transcript is kept in State, and its live
	// progress goes to WatchWorkflow's streams.
	hub := orchestrator.NewHub()
	recorder := &orchestrator.Recorder{Next: orchestrator.Traced(caller), State: statev1.NewStateServiceClient(stateConn), Hub: hub, Log: log}
	deps := orchestrator.Deps{Registry: reg, Caller: recorder, State: statev1.NewStateServiceClient(stateConn)}
	busOpts := lifecycle.Options{BufferSize: cfg.EventsBuffer, SubscriberBuffer: cfg.SubscriberBuffer, SubscriberBufferBytes: cfg.SubscriberBufferBytes}
	var (
		engine     orchestrator.Engine
		stopEngine func()
		bus        *lifecycle.Bus
	)
	if cfg.Backend == BackendTemporal {
		tc, err := dialTemporal(ctx, cfg.Temporal, log)
		if err != nil {
			return err
		}
		defer tc.Close()
		busOpts.StartSequence = uint64(time.Now().UnixMilli()) * 1_000_000
		bus = lifecycle.NewBus(busOpts)
		deps.Bus = bus
		t := temporal.New(tc, deps, temporal.Options{TaskQueue: cfg.Temporal.TaskQueue, HeartbeatTimeout: cfg.Temporal.HeartbeatTimeout, Engine: cfg.Engine})
		if err := t.StartWorker(); err != nil {
			bus.Close()
			return err
		}
		engine, stopEngine = t, t.Stop
		log.Info("temporal", "address", cfg.Temporal.Address, "namespace", cfg.Temporal.Namespace,
			"task_queue", taskQueue(cfg.Temporal.TaskQueue), "agents", len(reg.Agents()))
	} else {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		path := filepath.Join(cfg.DataDir, "journal.db")
		j, err := journal.Open(path, cfg.LockTimeout, append([]journal.OpenOption{journal.WithLogger(log)}, cfg.JournalOptions...)...)
		if err != nil {
			return err
		}
		defer j.Close()
		log.Info("journal", "file", path, "agents", len(reg.Agents()),
			"retention", cfg.Retention.String(), "retention_max_workflows", cfg.RetentionMaxWorkflows)
		// Each start begins at the next billion: sequences keep
		// increasing across restarts.
		busOpts.StartSequence = j.Epoch() * 1_000_000_000
		bus = lifecycle.NewBus(busOpts)
		deps.Bus = bus
		eng := journal.New(j, deps, cfg.Engine)
		n, err := eng.Resume()
		if err != nil {
			eng.Close()
			bus.Close()
			return fmt.Errorf("resume workflows from %s: %w", path, err)
		}
		if n > 0 {
			log.Info("resumed unfinished workflows", "count", n)
		}
		// Finished workflows beyond the bounds are deleted now and every
		// minute, in the background; Close stops it.
		j.Retain(journal.Retention{MaxAge: cfg.Retention, MaxWorkflows: cfg.RetentionMaxWorkflows}, log)
		engine, stopEngine = eng, eng.Close
	}
	defer bus.Close()
	if cfg.Server.OTel.Enabled() { // workflows by status, approvals waiting (tracing.go)
		_ = orchestrator.ObserveWorkflows(ctx, bus)
	}
	orchSrv := orchestrator.NewServer(engine, cfg.Engine.Workers, orchestrator.WithWatch(bus, cfg.EventLogPoll, hub),
		orchestrator.WithTranscripts(deps.State), orchestrator.WithApprovalTimeout(cfg.ApprovalTimeout, cfg.ApprovalTimeoutApprove),
		orchestrator.WithServerLog(log), orchestrator.WithAgents(reg.Lookup))
	orchestratorv1.RegisterOrchestratorServiceServer(srv, orchSrv)
	timeoutsCtx, stopTimeouts := context.WithCancel(ctx)
	defer stopTimeouts()
	go orchSrv.RunApprovalTimeouts(timeoutsCtx)
	lifecyclev1.RegisterLifecycleServiceServer(srv, lifecycle.NewServer(bus, lifecycle.WithLogger(log), lifecycle.WithShutdown(ctx),
		lifecycle.WithWorkflowLog(engine, cfg.EventLogPoll),
		lifecycle.WithStreamLimits(cfg.MaxStreams, cfg.MaxStreamsPerClient), lifecycle.WithSendTimeout(cfg.SubscriberSendTimeout)))
	lis := cfg.Listener
	if lis == nil {
		if lis, err = srv.Listen(); err != nil {
			stopEngine()
			return err
		}
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

// serveAgents checks the --agents file's definitions, starts seeding
// those not in the State service yet in the background (the file answers
// for them meanwhile: the State service need not be up for the
// orchestrator to start), and returns the Store dispatch reads them from
// and the AgentService over it. seeded is closed once seeding has
// stopped (ctx's end stops it).
func serveAgents(ctx context.Context, reg *orchestrator.Registry, extraModels []string, state statev1.StateServiceClient, log *slog.Logger, seeded chan<- struct{}) (*agents.Store, *agents.Server, error) {
	models, err := agents.DefaultModels()
	if err == nil {
		models = agents.WithModels(models, extraModels...)
		err = agents.Check(ctx, reg)
	}
	if err != nil {
		close(seeded)
		return nil, nil, fmt.Errorf("--agents: %w", err)
	}
	store := agents.NewStore(state, 0)
	store.SetFile(reg)
	go func() {
		defer close(seeded)
		agents.SeedInBackground(ctx, store, reg, log)
	}()
	return store, agents.NewServer(store, models), nil
}

// taskQueue is the task queue the temporal engine uses for q.
func taskQueue(q string) string {
	if q == "" {
		return temporal.DefaultTaskQueue
	}
	return q
}

// dialTemporal connects to the Temporal frontend within 30 seconds: TLS
// unless Dev or Plaintext, an API key when one is given.
func dialTemporal(ctx context.Context, c Temporal, log *slog.Logger) (client.Client, error) {
	opts := client.Options{HostPort: c.Address, Namespace: c.Namespace, Logger: tlog.NewStructuredLogger(log)}
	if !c.TLS.Dev && !c.TLS.Plaintext {
		tc, err := grpcclient.TLSConfig(c.TLS)
		if err != nil {
			return nil, fmt.Errorf("--temporal-ca/--temporal-cert/--temporal-key: %w", err)
		}
		opts.ConnectionOptions.TLS = tc
	}
	if c.APIKeyFile != "" {
		b, err := os.ReadFile(c.APIKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--temporal-api-key-file: %w", err)
		}
		key := strings.TrimSpace(string(b))
		if key == "" {
			return nil, fmt.Errorf("--temporal-api-key-file %s is empty", c.APIKeyFile)
		}
		opts.Credentials = client.NewAPIKeyStaticCredentials(key)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tc, err := client.DialContext(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("--temporal-address %s (namespace %q): %w", c.Address, c.Namespace, err)
	}
	return tc, nil
}
