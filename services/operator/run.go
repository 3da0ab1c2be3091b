package operator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/pkg/telemetry"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/hook"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/provider/reliable"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/mcp"
)

// Defaults of Config that are not zero values: Run's for empty fields,
// and the binary's flags'.
const (
	// DefaultAddr is the listen address when Config.Server.Addr is empty
	// (--addr).
	DefaultAddr = "127.0.0.1:7071"
	// DefaultWorkspace is the built-in tools' directory when
	// Config.Workspace is empty (--workspace).
	DefaultWorkspace = ".data/operator/workspace"
	// DefaultContextReserve is the binary's --context-reserve.
	DefaultContextReserve = 8192
)

// DefaultTools are the built-in tools the binary enables (--tools).
var DefaultTools = []string{"read", "write", "edit", "bash"}

// DefaultModelRetries is the binary's --model-retries: the retries of
// reliable.DefaultPolicy.
var DefaultModelRetries = reliable.DefaultPolicy().MaxAttempts - 1

// Config is everything Run needs to serve the operator: what its binary's
// flags set. Zero values take the defaults noted on each field. Where the
// binary's default is not the zero value (the built-in and effect tools,
// the system prompt, the circuit breaker, history entries, sliding-window
// compaction, model retries), DefaultConfig holds it: start from
// DefaultConfig to get what `operator` without flags serves.
//
// New reads only the invocation defaults, SystemPrompt to
// HistoryEntries; the other fields are Run's.
type Config struct {
	// Server is the listen address, TLS, auth, limits and shutdown
	// (pkg/grpcserver). Name defaults to "operator", Addr to DefaultAddr.
	Server grpcserver.Config
	// Log receives the service's logs; nil discards them.
	Log *slog.Logger
	// Listener, when set, is served instead of listening on Server.Addr
	// (tests, embedding). Run owns it: it is closed when Run returns,
	// whether Run served or failed to start.
	Listener net.Listener

	// The defaults of each invocation, which an input's config overrides.

	// SystemPrompt is the agent's identity (--system-prompt); an input's
	// system_addendum is appended to it, never substituted. Empty: no
	// system prompt (the binary's default is DefaultSystemPrompt).
	SystemPrompt string
	// SystemPromptFile, when set, is read (and trimmed) for the system
	// prompt instead of SystemPrompt (--system-prompt-file). Run only.
	SystemPromptFile string
	// Model is the default model, a catalog name (--model). Empty: the
	// default model of the first provider with credentials, in the order
	// of providers.All (anthropic, openai, gemini), else the scripted
	// model. Run refuses one that does not route (unknown, or its
	// provider has no credentials).
	Model string
	// MaxTurns bounds the model calls of an invocation (--max-turns).
	// Zero: DefaultMaxTurns (New refuses zero).
	MaxTurns uint32
	// MaxDuration bounds an invocation's wall-clock time
	// (--max-duration). Zero: DefaultMaxDuration (New refuses zero);
	// negative is refused.
	MaxDuration time.Duration
	// MaxCost bounds an invocation's cost in USD (--max-cost). Zero:
	// unbounded; negative is refused.
	MaxCost decimal.Decimal
	// MaxTokens caps each model response (--max-tokens). Zero: the
	// provider's default.
	MaxTokens int
	// CircuitBreaker ends the loop after this many consecutive failed
	// tool calls (--circuit-breaker). Zero: never (the binary's default
	// is DefaultCircuitBreaker).
	CircuitBreaker int
	// HistoryEntries bounds how many past invocations of a session are
	// read back as context, the oldest left out first
	// (--history-entries). Zero: all (the binary's default is
	// DefaultHistoryEntries).
	HistoryEntries int

	// Models says which model providers Run builds and how: credentials,
	// base URLs, the catalog, retries, fallbacks and the context
	// strategy.
	Models Models
	// Router, when set, routes every model instead of the providers Run
	// builds from Models (whose credentials, base URLs, egress proxy,
	// local models and script are then unused; the catalog still gives
	// each model's context window to the context strategy, and
	// FallbackModels still apply). For an embedder's own model provider;
	// tests use a scripted one.
	Router provider.Router

	// Workspace is the directory the file tools and bash are confined to,
	// created if missing (--workspace). Empty: DefaultWorkspace. Unused
	// when Tools is empty.
	Workspace string
	// Tools are the built-in tools to offer: read, write, edit, bash
	// (--tools). Empty: none (the binary's default is DefaultTools).
	// bash needs Landlock unless SandboxUnconfined.
	Tools []string
	// EffectTools offers the effect tools: write_memory, delete_memory,
	// delegate, handoff, signal (--effect-tools). The binary's default
	// is true.
	EffectTools bool
	// ExtraTools are Go tools offered beside the built-in, effect and MCP
	// ones, validated by the same registry (an embedder's own tools).
	ExtraTools []tool.Tool
	// MCPConfig is a JSON file of MCP servers whose tools to offer
	// (--mcp-config). Empty: none.
	MCPConfig string
	// MCPStdioAllow are the commands an invocation's own stdio MCP
	// servers may run (OperatorConfig.mcp_servers), compared verbatim
	// (--mcp-stdio-allow). Empty: none, since such a server is a process
	// started on the operator host. Any arguments are allowed: list MCP
	// server programs, never shells or interpreters.
	MCPStdioAllow []string
	// MCPHTTPAllow are the hosts ("host" or "host:port") an invocation's
	// own streamable HTTP MCP servers may be reached at (--mcp-http-allow).
	// Empty: none.
	MCPHTTPAllow []string
	// MCPCredentials is a JSON file of the credentials invocations'
	// MCP servers may name by credential_ref (--mcp-credentials; see
	// ParseCredentials). Empty: none.
	MCPCredentials string
	// MCPPoolSize bounds the invocation MCP servers kept connected
	// (--mcp-pool-size). Zero: mcp.DefaultPoolSize.
	MCPPoolSize int
	// MCPIdleTimeout closes an invocation MCP server no invocation used
	// for this long (--mcp-idle-timeout). Zero: mcp.DefaultIdleTimeout.
	MCPIdleTimeout time.Duration
	// MCPConnectTimeout bounds starting an invocation MCP server and
	// listing its tools (--mcp-connect-timeout). Zero:
	// mcp.DefaultConnectTimeout.
	MCPConnectTimeout time.Duration
	// ToolTimeout is the timeout of one tool call that sets none itself
	// (--tool-timeout). Zero: tool.DefaultTimeout.
	ToolTimeout time.Duration
	// ToolMaxOutput truncates a tool's output beyond this many bytes,
	// with a notice (--tool-max-output). Zero: tool.DefaultMaxOutputBytes.
	ToolMaxOutput int
	// ToolEnv names variables of this process's environment that bash
	// commands get too; their environment is otherwise minimal
	// (--tool-env).
	ToolEnv []string
	// ToolReadOnly are extra files or directories bash commands may read
	// (--tool-read-only).
	ToolReadOnly []string
	// SandboxUnconfined runs bash without Landlock when the kernel lacks
	// it; only with Server.Dev (--sandbox-unconfined).
	SandboxUnconfined bool

	// State is the State service that session history is read from
	// (--state-addr and the other --state-* flags); its Dev and Plaintext
	// follow Server's. Empty Target: inputs that name a session are
	// refused, unless History is set.
	State grpcclient.Config
	// History, when set, is where session history is read from instead of
	// the State service (an embedder's own store).
	History History
	// Hooks are the remote HookService servers, Hooks.Target a
	// comma-separated list of addresses, each dialled with the rest of
	// Hooks (--hook-addr and the other --hook-* flags); Dev and Plaintext
	// follow Server's. A hook that cannot be reached at start-up fails
	// it: starting without it would silently drop the policy.
	Hooks grpcclient.Config
	// HookTimeout is the deadline of each hook call; a slow hook is
	// skipped, not fatal (--hook-call-timeout). Zero: hook.DefaultTimeout.
	HookTimeout time.Duration
	// LocalHooks are Go hooks, run before the remote ones (an embedder's
	// in-process policy).
	LocalHooks []hook.Hook
	// Lifecycle is the LifecycleService that lifecycle events (context
	// compaction) are published to (--lifecycle-addr and the other
	// --lifecycle-* flags); Dev and Plaintext follow Server's. Empty
	// Target: they are logged, unless Publisher is set.
	Lifecycle grpcclient.Config
	// Publisher, when set, receives the lifecycle events instead of the
	// Lifecycle service (an embedder's own bus).
	Publisher Publisher
	// ResumeKey signs the resume tokens of suspended invocations (tool
	// calls waiting for approval), at least MinResumeKey bytes
	// (--resume-key in hex, --resume-key-file, $NEURON_RESUME_KEY). Nil:
	// ResumeKeyFile, else a random key of this process, whose tokens only
	// this process accepts; replicas, and one-shot operators (a process
	// per invocation), must share one key.
	ResumeKey []byte
	// ResumeKeyFile is a file holding the resume key in hex
	// (--resume-key-file), read when ResumeKey is nil.
	ResumeKeyFile string

	// Middleware, when Middleware.Client.Target is set, is the remote
	// policy middleware (layer0.middleware.v1) applied to every
	// OperatorService call (--middleware-addr and the other
	// --middleware-* flags); its client's Dev and Plaintext follow
	// Server's. It is dialled at start-up and, unless FailOpen, start-up
	// fails when it cannot be reached. Serving only: RunOneShot refuses
	// it.
	Middleware remote.Flags
}

// Models configures the model providers Run builds: each one whose
// credentials are found, wrapped with retries and the catalog's prices.
type Models struct {
	// KeyFiles maps a provider's name (one of providers.All) to the
	// file holding its API key (its --<flag>-key-file). A provider with
	// no file takes its key from the first of its key variables that is
	// set (Descriptor.KeyEnv, e.g. $GEMINI_API_KEY, then
	// $GOOGLE_API_KEY). A provider with no key variables (the
	// OpenAI-compatible server) has a key only from its file, if it
	// needs one.
	KeyFiles map[string]string
	// BaseURLs maps a provider's name to its API's base URL (its
	// --<flag>-base-url). A provider with none takes its base URL
	// variable (Descriptor.BaseURLEnv), else its public API. A provider
	// with no key variables is enabled by its base URL alone, and takes
	// the variable only when no provider sharing it has a key
	// ($OPENAI_BASE_URL is the OpenAI API's when an OpenAI key is set,
	// else the OpenAI-compatible server's).
	BaseURLs map[string]string
	// OpenAIAPI is the API of OpenAI models: "chat" (Chat Completions) or
	// "responses" (Responses, chained per session) (--openai-api). Empty:
	// chat.
	OpenAIAPI string
	// EgressProxy sends all model traffic through this HTTP proxy:
	// http://HOST:PORT, or unix:///PATH for a proxy on a Unix socket
	// (--egress-proxy). Empty: $HTTPS_PROXY and the other proxy variables.
	EgressProxy string
	// Catalog is a model catalog file adding to or replacing entries of
	// the built-in one (--catalog). Empty: the built-in catalog.
	Catalog string
	// LocalModels are model names the OpenAI-compatible server serves,
	// added to the catalog, free (--local-models).
	LocalModels []string
	// FallbackModels are tried in order when the default model keeps
	// failing with retryable errors (--fallback-models).
	FallbackModels []string
	// Retries are the retries of a model call after a transient error
	// (429, 5xx, reset), with backoff and Retry-After (--model-retries).
	// Zero (or negative): none (the binary's default is
	// DefaultModelRetries).
	Retries int
	// Compaction is the context strategy: none, sliding or summarize
	// (--compaction). Empty: none (the binary's default is sliding).
	Compaction string
	// ContextReserve is the tokens of a model's context window kept free
	// for the response when compacting (--context-reserve). Zero: none
	// (the binary's default is DefaultContextReserve).
	ContextReserve int
	// ContextPressure is the fill of a model's context budget, in
	// percent, at which a ContextPressure lifecycle event is published
	// (--context-pressure). Zero: never (the binary's default is
	// DefaultContextPressure).
	ContextPressure float64
	// Script is a JSON script file of the scripted model (--script).
	// Empty: its echo rules.
	Script string
}

// DefaultConfig returns the binary's defaults: every flag's default.
func DefaultConfig() Config {
	return Config{
		Server:         grpcserver.Config{Name: "operator", Addr: DefaultAddr},
		SystemPrompt:   DefaultSystemPrompt,
		MaxTurns:       DefaultMaxTurns,
		MaxDuration:    DefaultMaxDuration,
		CircuitBreaker: DefaultCircuitBreaker,
		HistoryEntries: DefaultHistoryEntries,
		Models: Models{
			OpenAIAPI:      "chat",
			Retries:        DefaultModelRetries,
			Compaction:     compaction.NameSliding,
			ContextReserve: DefaultContextReserve,

			ContextPressure: DefaultContextPressure,
		},
		Workspace:     DefaultWorkspace,
		Tools:         append([]string(nil), DefaultTools...),
		EffectTools:   true,
		ToolTimeout:   tool.DefaultTimeout,
		ToolMaxOutput: tool.DefaultMaxOutputBytes,
		HookTimeout:   hook.DefaultTimeout,
	}
}

// ErrServe marks the errors Run returns once everything was set up: the
// listener failed, or serving did. Any other error from Run is a bad
// Config or a failed start-up (the binary exits 2 on those and 1 on
// these). The error's text is unchanged by the mark.
var ErrServe = errors.New("serving failed")

type serveErr struct{ err error }

func (e serveErr) Error() string        { return e.err.Error() }
func (e serveErr) Unwrap() error        { return e.err }
func (e serveErr) Is(target error) bool { return target == ErrServe }

// Run serves the operator until ctx ends, then stops gracefully (health
// turns NOT_SERVING, in-flight calls get Server.ShutdownTimeout) and
// returns nil. A bad Config or a failed start-up is an error naming the
// setting (and its flag, e.g. `--tools: unknown tool "fly"; ...`) before
// anything is served; an error after that wraps ErrServe.
//
// The order of start-up: the Config's values are checked; the policy
// middleware, when configured, is dialled; the server is built (a bad
// security config fails here, before anything else is set up); then the
// operator: the model providers and catalog, the tools (the workspace is
// created), the MCP servers, the lifecycle publisher, the State client
// and the hooks (each remote hook is asked to Describe itself); then it
// serves. The OperatorService's interceptors, outermost first: the
// standard chain of pkg/grpcserver (call log, error mapping, recovery,
// auth, protovalidate), then the middleware.
func Run(ctx context.Context, cfg Config) error {
	served := false
	if cfg.Listener != nil {
		defer func() {
			if !served {
				cfg.Listener.Close()
			}
		}()
	}
	cfg = cfg.withDefaults()
	if err := cfg.check(); err != nil {
		return err
	}
	log := cfg.Log
	// The server first, with the policy middleware when one is
	// configured: a bad security config, or a fail-closed middleware that
	// cannot be reached, fails before anything else is set up.
	mw, closeMW, err := remote.Dial(ctx, cfg.Middleware, log)
	if err != nil {
		return err
	}
	defer closeMW()
	var opts []grpcserver.Option
	if mw != nil {
		u, s := mw.ExecServerInterceptors()
		opts = append(opts, grpcserver.WithInterceptors([]grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{s}))
	}
	srv, err := grpcserver.New(cfg.Server, log, opts...)
	if err != nil {
		return err
	}
	op, cleanup, err := build(ctx, cfg, false)
	if err != nil {
		return err
	}
	defer cleanup()
	operatorv1.RegisterOperatorServiceServer(srv, NewServer(op))
	lis := cfg.Listener
	if lis == nil {
		if lis, err = srv.Listen(); err != nil {
			return serveErr{err}
		}
	}
	served = true
	if err := srv.Serve(ctx, lis); err != nil {
		return serveErr{err}
	}
	return nil
}

// RunOneShot runs one invocation on the operator cfg describes, without
// serving: an OperatorInput as protojson on stdin, the OperatorOutput (or
// the google.rpc.Status of a failure) on stdout, one line for a person on
// stderr; see (*Operator).OneShot for the exit codes it returns. This is
// how the environment service runs an operator inside isolation (the
// binary's --one-shot). Server's address, TLS and auth, Listener and
// Middleware do not apply (Server.Dev still allows SandboxUnconfined and
// turns the clients' TLS off); bash commands run under the namespaces of
// the sandbox around the process, with their own Landlock ruleset,
// filter and limits, instead of getting namespaces of their own. A bad
// Config or a failed start-up is an error, before stdin is read.
func RunOneShot(ctx context.Context, cfg Config, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if cfg.Middleware.Client.Target != "" {
		// One-shot runs under the environment service, whose own exec
		// middleware applies; ignoring the setting here would silently
		// drop the policy.
		return 0, errors.New("--middleware-addr applies in serving mode only; in --one-shot mode the caller (the environment service) applies middleware")
	}
	cfg = cfg.withDefaults()
	if err := cfg.check(); err != nil {
		return 0, err
	}
	op, cleanup, err := build(ctx, cfg, true)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	// No network in the sandbox: spans are kept in memory and handed
	// back on stderr (spanRecorder).
	rec := telemetry.NewRecorder("operator")
	otel.SetTracerProvider(rec.TracerProvider())
	spanRecorder.Store(rec)
	defer spanRecorder.Store(nil)
	return op.OneShot(ctx, stdin, stdout, stderr), nil
}

// mcpPolicy is the policy for invocations' MCP servers from cfg.
func mcpPolicy(cfg Config) (MCPPolicy, error) {
	var p MCPPolicy
	for _, c := range cfg.MCPStdioAllow {
		if c = strings.TrimSpace(c); c != "" {
			p.StdioCommands = append(p.StdioCommands, c)
		}
	}
	for _, h := range cfg.MCPHTTPAllow {
		if h = strings.TrimSpace(h); h == "" {
			continue
		} else if strings.Contains(h, "/") {
			return p, fmt.Errorf("--mcp-http-allow: %q is not a host; give \"host\" or \"host:port\", without a scheme or path", h)
		} else {
			p.HTTPHosts = append(p.HTTPHosts, h)
		}
	}
	if cfg.MCPCredentials != "" {
		data, err := os.ReadFile(cfg.MCPCredentials)
		if err != nil {
			return p, fmt.Errorf("--mcp-credentials: %w", err)
		}
		if p.Credentials, err = ParseCredentials(data); err != nil {
			return p, fmt.Errorf("--mcp-credentials %s: %w", cfg.MCPCredentials, err)
		}
	}
	if cfg.MCPPoolSize < 0 || cfg.MCPIdleTimeout < 0 || cfg.MCPConnectTimeout < 0 {
		return p, errors.New("--mcp-pool-size, --mcp-idle-timeout and --mcp-connect-timeout must not be negative")
	}
	return p, nil
}

// withDefaults fills the zero values that stand for a default, and makes
// the clients dial as the server serves.
func (c Config) withDefaults() Config {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Server.Name == "" {
		c.Server.Name = "operator"
	}
	if c.Server.Addr == "" {
		c.Server.Addr = DefaultAddr
	}
	if c.MaxTurns == 0 {
		c.MaxTurns = DefaultMaxTurns
	}
	if c.MaxDuration == 0 {
		c.MaxDuration = DefaultMaxDuration
	}
	if c.Workspace == "" {
		c.Workspace = DefaultWorkspace
	}
	for _, cc := range []*grpcclient.Config{&c.State, &c.Hooks, &c.Lifecycle, &c.Middleware.Client} {
		cc.Dev, cc.Plaintext = c.Server.Dev, c.Server.Plaintext
		// --otel: spans of the calls this service makes, not only of those
		// it serves.
		cc.Telemetry = cc.Telemetry || c.Server.Telemetry || c.Server.OTel.Enabled()
	}
	return c
}

// check reports the settings that are wrong whatever else happens, before
// anything is dialled or opened.
func (c Config) check() error {
	if c.SandboxUnconfined && !c.Server.Dev {
		return errors.New("--sandbox-unconfined is only allowed with --dev")
	}
	return nil
}

// build constructs the operator and its dependencies from cfg (with its
// defaults filled). oneShot says bash runs inside an environment
// backend's sandbox.
func build(ctx context.Context, cfg Config, oneShot bool) (*Operator, func(), error) {
	log := cfg.Log
	var closers []func()
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(err error) (*Operator, func(), error) {
		cleanup()
		return nil, func() {}, err
	}

	if cfg.SystemPromptFile != "" {
		b, err := os.ReadFile(cfg.SystemPromptFile)
		if err != nil {
			return fail(fmt.Errorf("--system-prompt-file: %w", err))
		}
		cfg.SystemPrompt = strings.TrimSpace(string(b))
	}
	router, cat, strategy, err := models(cfg, log)
	if err != nil {
		return fail(err)
	}
	tools, closeTools, err := toolRegistry(cfg, oneShot, log)
	if err != nil {
		return fail(err)
	}
	closers = append(closers, closeTools)
	if cfg.MCPConfig != "" {
		closeMCP, err := mcpTools(ctx, cfg, tools, log)
		if err != nil {
			return fail(err)
		}
		closers = append(closers, closeMCP)
	}
	opts := []Option{
		WithTools(tools),
		WithCompaction(strategy, budgetFor(cat, cfg.Models.ContextReserve)),
	}
	switch {
	case cfg.ResumeKey != nil:
		if len(cfg.ResumeKey) < MinResumeKey {
			return fail(fmt.Errorf("--resume-key: %d bytes is too short; give at least %d random bytes in hex, e.g. from `openssl rand -hex 32`", len(cfg.ResumeKey), MinResumeKey))
		}
		opts = append(opts, WithResumeKey(cfg.ResumeKey))
	case cfg.ResumeKeyFile != "":
		key, err := ReadResumeKey(cfg.ResumeKeyFile)
		if err != nil {
			return fail(fmt.Errorf("--resume-key-file: %w", err))
		}
		opts = append(opts, WithResumeKey(key))
	case !oneShot:
		log.Info("no --resume-key: resume tokens of suspended invocations are signed with a random key of this process; " +
			"a resume must reach this process, and replicas must share a --resume-key")
	}
	policy, err := mcpPolicy(cfg)
	if err != nil {
		return fail(err)
	}
	if policy.allowsAny() {
		pool := mcp.NewPool(mcp.PoolConfig{
			MaxServers: cfg.MCPPoolSize, IdleTimeout: cfg.MCPIdleTimeout, ConnectTimeout: cfg.MCPConnectTimeout, Log: log,
			Registry: []tool.Option{tool.WithDefaultTimeout(cfg.ToolTimeout), tool.WithMaxOutputBytes(cfg.ToolMaxOutput)},
		})
		closers = append(closers, pool.Close)
		opts = append(opts, WithMCP(pool, policy))
		log.Info("invocation MCP servers allowed", "stdio_commands", strings.Join(policy.StdioCommands, ","),
			"http_hosts", strings.Join(policy.HTTPHosts, ","), "credentials", len(policy.Credentials))
	}
	switch {
	case cfg.Publisher != nil:
		opts = append(opts, WithPublisher(cfg.Publisher))
	case cfg.Lifecycle.Target != "":
		conn, err := grpcclient.Dial(cfg.Lifecycle)
		if err != nil {
			return fail(fmt.Errorf("--lifecycle-addr: %w", err))
		}
		pub := NewLifecyclePublisher(lifecyclev1.NewLifecycleServiceClient(conn), log, 0)
		closers = append(closers, func() { pub.Close(); conn.Close() })
		opts = append(opts, WithPublisher(pub))
	}

	switch {
	case cfg.History != nil:
		opts = append(opts, WithHistory(cfg.History))
	case cfg.State.Target != "":
		// A State service that restarts is waited for within the
		// invocation's deadline, not a failed history read.
		sc := cfg.State
		sc.WaitForReady = true
		conn, err := grpcclient.Dial(sc)
		if err != nil {
			return fail(fmt.Errorf("--state-addr: %w", err))
		}
		closers = append(closers, func() { conn.Close() })
		opts = append(opts, WithHistory(NewStateHistory(statev1.NewStateServiceClient(conn), log)))
		log.Info("session history from the state service", "addr", cfg.State.Target)
	default:
		log.Warn("no --state-addr: inputs that name a session will be refused")
	}

	if len(cfg.LocalHooks) > 0 || cfg.Hooks.Target != "" {
		reg := hook.NewRegistry(log, hook.WithTimeout(cfg.HookTimeout))
		for _, h := range cfg.LocalHooks {
			reg.Add(h)
		}
		for _, addr := range strings.Split(cfg.Hooks.Target, ",") {
			addr = strings.TrimSpace(addr)
			if addr == "" {
				continue
			}
			c := cfg.Hooks
			c.Target = addr
			conn, err := grpcclient.Dial(c)
			if err != nil {
				return fail(fmt.Errorf("--hook-addr %s: %w", addr, err))
			}
			closers = append(closers, func() { conn.Close() })
			// A configured policy hook that cannot be reached at start-up
			// is a configuration error: starting without it would
			// silently drop the policy.
			remote, err := hook.DialRemote(ctx, conn, cfg.HookTimeout)
			if err != nil {
				return fail(err)
			}
			reg.Add(remote)
			log.Info("remote hook", "name", remote.Name(), "addr", addr, "points", fmt.Sprint(remote.Points()))
		}
		opts = append(opts, WithHooks(reg))
	}

	op, err := New(cfg, router, log, opts...)
	if err != nil {
		return fail(err)
	}
	return op, cleanup, nil
}
