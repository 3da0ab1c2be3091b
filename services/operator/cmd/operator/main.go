// Command operator serves layer0.operator.v1.OperatorService: the ReAct
// loop with tools, effect tools and hooks. With --one-shot it runs a
// single invocation instead of serving: an OperatorInput as protojson on
// stdin, the OperatorOutput on stdout (the environment service runs it so
// inside isolation). Every flag has an env fallback: --workspace is
// NEURON_OPERATOR_WORKSPACE, and so on. Run with --help for the list.
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
	"google.golang.org/grpc"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/hook"
	"github.com/secbear/neuron/services/operator/provider/scripted"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/builtin"
	"github.com/secbear/neuron/services/operator/tool/effect"
	"github.com/secbear/neuron/services/operator/tool/mcp"
)

const envPrefix = "NEURON_OPERATOR"

// exitConfig is the exit code for bad flags or configuration.
const exitConfig = 2

func main() {
	sandbox.Main() // a sandboxed child of this binary never returns from here
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// flags is the parsed command line.
type flags struct {
	srv         grpcserver.Config
	state       grpcclient.Config
	hooks       grpcclient.Config
	lifecycle   grpcclient.Config
	middleware  remote.Flags
	models      modelFlags
	scriptOpts  []scripted.Option
	mcpConfig   string
	oneShot     bool
	inputFile   string
	model       string
	script      string
	system      string
	systemFile  string
	maxTurns    uint
	maxDuration time.Duration
	maxCost     string
	maxTokens   int
	breaker     int
	history     int
	workspace   string
	tools       string
	effectTools bool
	toolTimeout time.Duration
	toolEnv     string
	toolRead    string
	toolOutput  int
	unconfined  bool
	hookTimeout time.Duration
	logLevel    string
	logFormat   string
}

func parse(args []string, stderr io.Writer) (*flags, error) {
	f := &flags{srv: grpcserver.Config{Name: "operator", Addr: "127.0.0.1:7071"}}
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.srv.BindFlags(fs)
	f.state.BindFlags(fs, "state")
	f.hooks.BindFlags(fs, "hook")
	f.lifecycle.BindFlags(fs, "lifecycle")
	f.middleware.Bind(fs)
	f.models.bind(fs)
	def := operator.DefaultConfig()
	fs.BoolVar(&f.oneShot, "one-shot", false, "run one invocation: OperatorInput (protojson) on stdin, OperatorOutput on stdout; exit 0 complete, 3 other exit, 10+gRPC code on error")
	fs.StringVar(&f.inputFile, "one-shot-input", "", "with --one-shot, read the OperatorInput from this file instead of stdin (e.g. a mounted Kubernetes Secret)")
	fs.StringVar(&f.model, "model", "", "default model, a catalog name (default: the first provider with credentials: anthropic, openai, gemini; else the scripted model)")
	fs.StringVar(&f.mcpConfig, "mcp-config", "", `JSON file of MCP servers whose tools to offer: {"servers":[{"name":"fs","command":["..."]},{"name":"web","url":"http://..."}]}`)
	fs.StringVar(&f.script, "script", "", "JSON script for the scripted model (default: its echo rules)")
	fs.StringVar(&f.system, "system-prompt", def.SystemPrompt, "the agent's system prompt")
	fs.StringVar(&f.systemFile, "system-prompt-file", "", "read the system prompt from this file (overrides --system-prompt)")
	fs.UintVar(&f.maxTurns, "max-turns", uint(def.MaxTurns), "default maximum loop iterations per invocation")
	fs.DurationVar(&f.maxDuration, "max-duration", def.MaxDuration, "default maximum wall-clock time per invocation")
	fs.StringVar(&f.maxCost, "max-cost", "", "default maximum cost per invocation in USD, e.g. 0.50 (empty: unbounded)")
	fs.IntVar(&f.maxTokens, "max-tokens", 0, "cap on each model response's tokens (0: the provider's default)")
	fs.IntVar(&f.breaker, "circuit-breaker", def.CircuitBreaker, "end the loop after this many consecutive failed tool calls (0: never)")
	fs.IntVar(&f.history, "history-entries", def.HistoryEntries, "read at most this many past invocations of a session as context (0: all)")
	fs.StringVar(&f.workspace, "workspace", ".data/operator/workspace", "directory the file tools and bash are confined to (created if missing)")
	fs.StringVar(&f.tools, "tools", "read,write,edit,bash", "comma-separated built-in tools to enable (empty: none)")
	fs.BoolVar(&f.effectTools, "effect-tools", true, "offer the effect tools (write_memory, delete_memory, delegate, handoff, signal)")
	fs.StringVar(&f.toolEnv, "tool-env", "", "comma-separated names of this process's environment variables that bash commands get too (their environment is otherwise minimal), e.g. GITHUB_TOKEN")
	fs.StringVar(&f.toolRead, "tool-read-only", "", "comma-separated extra files or directories bash commands may read (e.g. credential files)")
	fs.DurationVar(&f.toolTimeout, "tool-timeout", 2*time.Minute, "default timeout of one tool call")
	fs.IntVar(&f.toolOutput, "tool-max-output", 64<<10, "tool output beyond this many bytes is truncated, with a notice")
	fs.BoolVar(&f.unconfined, "sandbox-unconfined", false, "run bash without Landlock when the kernel lacks it (only with --dev)")
	fs.DurationVar(&f.hookTimeout, "hook-call-timeout", hook.DefaultTimeout, "deadline of each hook call; a slow hook is skipped, not fatal")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "json", "json or text")
	fs.Usage = flagenv.Usage(fs, envPrefix, "operator: the layer0 OperatorService (ReAct loop, tools, hooks); --hook-addr takes a comma-separated list")
	if err := flagenv.Parse(fs, envPrefix, args, nil); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.unconfined && !f.srv.Dev {
		return nil, errors.New("--sandbox-unconfined is only allowed with --dev")
	}
	if f.inputFile != "" && !f.oneShot {
		return nil, errors.New("--one-shot-input needs --one-shot")
	}
	if f.oneShot && f.middleware.Client.Target != "" {
		// One-shot runs under the environment service, whose own exec
		// middleware applies; ignoring the flag here would silently drop
		// the policy.
		return nil, errors.New("--middleware-addr applies in serving mode only; in --one-shot mode the caller (the environment service) applies middleware")
	}
	for _, c := range []*grpcclient.Config{&f.state, &f.hooks, &f.lifecycle, &f.middleware.Client} {
		c.Dev, c.Plaintext = f.srv.Dev, f.srv.Plaintext
	}
	return f, nil
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	f, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "operator: %v\n", err)
		return exitConfig
	}
	log, err := logging.New(stderr, logging.Options{Level: f.logLevel, Format: f.logFormat, Service: "operator"})
	if err != nil {
		fmt.Fprintf(stderr, "operator: %v\n", err)
		return exitConfig
	}
	// The server first (serving mode), with the policy middleware when
	// one is configured: a bad security config, or a fail-closed
	// middleware that cannot be reached, fails before anything else is set
	// up.
	var srv *grpcserver.Server
	if !f.oneShot {
		mw, closeMW, err := remote.Dial(ctx, f.middleware, log)
		if err != nil {
			fmt.Fprintf(stderr, "operator: %v\n", err)
			return exitConfig
		}
		defer closeMW()
		var opts []grpcserver.Option
		if mw != nil {
			u, s := mw.ExecServerInterceptors()
			opts = append(opts, grpcserver.WithInterceptors([]grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{s}))
		}
		if srv, err = grpcserver.New(f.srv, log, opts...); err != nil {
			fmt.Fprintf(stderr, "operator: %v\n", err)
			return exitConfig
		}
	}
	op, cleanup, err := build(ctx, f, log)
	if err != nil {
		fmt.Fprintf(stderr, "operator: %v\n", err)
		return exitConfig
	}
	defer cleanup()
	if f.oneShot {
		if f.inputFile != "" {
			file, err := os.Open(f.inputFile)
			if err != nil {
				fmt.Fprintf(stderr, "operator: --one-shot-input: %v\n", err)
				return exitConfig
			}
			defer file.Close()
			stdin = file
		}
		return operator.RunOneShot(ctx, op, stdin, stdout, stderr)
	}
	operatorv1.RegisterOperatorServiceServer(srv, operator.NewServer(op))
	lis, err := srv.Listen()
	if err != nil {
		fmt.Fprintf(stderr, "operator: %v\n", err)
		return 1
	}
	if err := srv.Serve(ctx, lis); err != nil {
		fmt.Fprintf(stderr, "operator: %v\n", err)
		return 1
	}
	return 0
}

// build constructs the operator and its dependencies by hand.
func build(ctx context.Context, f *flags, log *slog.Logger) (*operator.Operator, func(), error) {
	var closers []func()
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(err error) (*operator.Operator, func(), error) {
		cleanup()
		return nil, func() {}, err
	}

	cfg := operator.DefaultConfig()
	cfg.Model = f.model
	cfg.SystemPrompt = f.system
	if f.systemFile != "" {
		b, err := os.ReadFile(f.systemFile)
		if err != nil {
			return fail(fmt.Errorf("--system-prompt-file: %w", err))
		}
		cfg.SystemPrompt = strings.TrimSpace(string(b))
	}
	cfg.MaxTurns = uint32(min(f.maxTurns, 1<<31))
	cfg.MaxDuration = f.maxDuration
	if f.maxCost != "" {
		d, err := decimal.NewFromString(f.maxCost)
		if err != nil || d.IsNegative() {
			return fail(fmt.Errorf("--max-cost %q: want a non-negative decimal amount in USD such as 0.50", f.maxCost))
		}
		cfg.MaxCost = d
	}
	cfg.MaxTokens, cfg.CircuitBreaker, cfg.HistoryEntries = f.maxTokens, f.breaker, f.history

	if f.script != "" {
		s, err := scripted.ParseFile(f.script)
		if err != nil {
			return fail(fmt.Errorf("--script: %w", err))
		}
		f.scriptOpts = append(f.scriptOpts, scripted.WithScript(s))
	}
	router, cat, strategy, err := models(f, log)
	if err != nil {
		return fail(err)
	}
	tools, closeTools, err := toolRegistry(f, log)
	if err != nil {
		return fail(err)
	}
	closers = append(closers, closeTools)
	if f.mcpConfig != "" {
		closeMCP, err := mcpTools(ctx, f, tools, log)
		if err != nil {
			return fail(err)
		}
		closers = append(closers, closeMCP)
	}
	opts := []operator.Option{
		operator.WithTools(tools),
		operator.WithCompaction(strategy, budgetFor(cat, f.models.reserve)),
	}
	if f.lifecycle.Target != "" {
		conn, err := grpcclient.Dial(f.lifecycle)
		if err != nil {
			return fail(fmt.Errorf("--lifecycle-addr: %w", err))
		}
		pub := operator.NewLifecyclePublisher(lifecyclev1.NewLifecycleServiceClient(conn), log, 0)
		closers = append(closers, func() { pub.Close(); conn.Close() })
		opts = append(opts, operator.WithPublisher(pub))
	}

	if f.state.Target != "" {
		conn, err := grpcclient.Dial(f.state)
		if err != nil {
			return fail(fmt.Errorf("--state-addr: %w", err))
		}
		closers = append(closers, func() { conn.Close() })
		opts = append(opts, operator.WithHistory(operator.StateHistory{Client: statev1.NewStateServiceClient(conn), Log: log}))
		log.Info("session history from the state service", "addr", f.state.Target)
	} else {
		log.Warn("no --state-addr: inputs that name a session will be refused")
	}

	if f.hooks.Target != "" {
		reg := hook.NewRegistry(log, hook.WithTimeout(f.hookTimeout))
		for _, addr := range strings.Split(f.hooks.Target, ",") {
			addr = strings.TrimSpace(addr)
			if addr == "" {
				continue
			}
			c := f.hooks
			c.Target = addr
			conn, err := grpcclient.Dial(c)
			if err != nil {
				return fail(fmt.Errorf("--hook-addr %s: %w", addr, err))
			}
			closers = append(closers, func() { conn.Close() })
			// A configured policy hook that cannot be reached at start-up
			// is a configuration error: starting without it would
			// silently drop the policy.
			remote, err := hook.DialRemote(ctx, conn, f.hookTimeout)
			if err != nil {
				return fail(err)
			}
			reg.Add(remote)
			log.Info("remote hook", "name", remote.Name(), "addr", addr, "points", fmt.Sprint(remote.Points()))
		}
		opts = append(opts, operator.WithHooks(reg))
	}

	op, err := operator.New(cfg, router, log, opts...)
	if err != nil {
		return fail(err)
	}
	return op, cleanup, nil
}

// toolRegistry registers the enabled built-in tools and the effect tools.
func toolRegistry(f *flags, log *slog.Logger) (*tool.Registry, func(), error) {
	reg := tool.NewRegistry(tool.WithDefaultTimeout(f.toolTimeout), tool.WithMaxOutputBytes(f.toolOutput))
	noop := func() {}
	if f.effectTools {
		for _, t := range effect.All() {
			if err := reg.RegisterEffect(t); err != nil {
				return nil, noop, err
			}
		}
	}
	var names []string
	for _, n := range strings.Split(f.tools, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return reg, noop, nil
	}
	dir, err := filepath.Abs(f.workspace)
	if err != nil {
		return nil, noop, fmt.Errorf("--workspace: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, noop, fmt.Errorf("--workspace: %w", err)
	}
	ws, err := builtin.OpenWorkspace(dir)
	if err != nil {
		return nil, noop, fmt.Errorf("--workspace: %w", err)
	}
	closeWS := func() { ws.Close() }
	for _, n := range names {
		var t tool.Tool
		switch n {
		case "read":
			t = builtin.NewRead(ws)
		case "write":
			t = builtin.NewWrite(ws)
		case "edit":
			t = builtin.NewEdit(ws)
		case "bash":
			if err := sandbox.Supported(); err != nil {
				if !f.unconfined {
					closeWS()
					return nil, noop, fmt.Errorf("the bash tool needs Landlock, which this kernel lacks (%v); drop bash from --tools, or for development only pass --dev --sandbox-unconfined", err)
				}
				log.Warn("SANDBOX UNCONFINED: bash runs without Landlock", "reason", err.Error())
			}
			// A private temp dir per call keeps mktemp files out of the
			// workspace; the default limits cap open files and file size.
			env := sandbox.DefaultEnv(dir)
			for _, name := range strings.Split(f.toolEnv, ",") {
				if v, ok := os.LookupEnv(strings.TrimSpace(name)); ok && strings.TrimSpace(name) != "" {
					env = append(env, strings.TrimSpace(name)+"="+v)
				}
			}
			var readOnly []string
			for _, p := range strings.Split(f.toolRead, ",") {
				if p = strings.TrimSpace(p); p != "" {
					readOnly = append(readOnly, p)
				}
			}
			// Standalone, every command gets its own namespaces: a
			// private root holding the workspace and the system's
			// programs only, no network, its own process tree (killed
			// whole when the command ends). In --one-shot mode the
			// operator already runs inside an environment backend's
			// sandbox, whose seccomp filter refuses new namespaces:
			// commands then run under its namespaces, with their own
			// Landlock ruleset, filter and limits on top.
			ns := sandbox.Namespaces{User: true, Mount: true, PID: true, Net: true, IPC: true, UTS: true}
			if f.oneShot {
				ns = sandbox.Namespaces{}
			}
			t = builtin.NewBash(dir, sandbox.Policy{
				Workspace: dir, Env: env, ReadOnly: readOnly, PrivateTmp: true, Limits: sandbox.DefaultLimits(), AllowUnconfined: f.unconfined,
				Namespaces: ns,
			})
		default:
			closeWS()
			return nil, noop, fmt.Errorf("--tools: unknown tool %q; built-in tools are read, write, edit, bash", n)
		}
		if err := reg.Register(t); err != nil {
			closeWS()
			return nil, noop, err
		}
	}
	log.Info("tools", "builtin", strings.Join(names, ","), "effect_tools", f.effectTools, "workspace", dir)
	return reg, closeWS, nil
}

// mcpTools connects to the configured MCP servers and registers their
// tools beside the built-in ones (validated by the same registry).
func mcpTools(ctx context.Context, f *flags, reg *tool.Registry, log *slog.Logger) (func(), error) {
	data, err := os.ReadFile(f.mcpConfig)
	if err != nil {
		return nil, fmt.Errorf("--mcp-config: %w", err)
	}
	servers, err := mcp.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("--mcp-config %s: %w", f.mcpConfig, err)
	}
	var clients []*mcp.Client
	closeAll := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	for _, s := range servers {
		c, err := mcp.Connect(ctx, s, log)
		if err != nil {
			closeAll()
			return nil, err
		}
		clients = append(clients, c)
		tools, err := c.Tools(ctx)
		if err != nil {
			closeAll()
			return nil, err
		}
		for _, t := range tools {
			if err := reg.Register(t); err != nil {
				closeAll()
				return nil, fmt.Errorf("MCP server %q: %w", s.Name, err)
			}
		}
		log.Info("MCP tools", "server", s.Name, "tools", len(tools))
	}
	return closeAll, nil
}
