// Command operator serves layer0.operator.v1.OperatorService: the ReAct
// loop with tools, effect tools and hooks. With --one-shot it runs a
// single invocation instead of serving: an OperatorInput as protojson on
// stdin, the OperatorOutput on stdout (the environment service runs it so
// inside isolation). Every flag has an env fallback: --workspace is
// NEURON_OPERATOR_WORKSPACE, and so on. Run with --help for the list.
//
// The wiring is the operator package's (operator.Run, operator.RunOneShot);
// this command parses flags into an operator.Config.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider/providers"
	"github.com/secbear/neuron/services/operator/tool/mcp"
)

const envPrefix = "NEURON_OPERATOR"

// sharedResumeKeyEnv is the resume key's variable when neither
// --resume-key, --resume-key-file nor their NEURON_OPERATOR_* variables
// are set.
const sharedResumeKeyEnv = "NEURON_RESUME_KEY"

// exitConfig is the exit code for bad flags or configuration.
const exitConfig = 2

func main() {
	sandbox.Main() // a sandboxed child of this binary never returns from here
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// flags is the parsed command line: the operator's Config and what only
// the command has.
type flags struct {
	cfg       operator.Config
	oneShot   bool
	inputFile string
	logLevel  string
	logFormat string
}

func parse(args []string, stderr io.Writer) (*flags, error) {
	def := operator.DefaultConfig()
	f := &flags{cfg: def}
	c := &f.cfg
	var (
		maxTurns                              uint
		maxCost, tools, toolEnv, toolReadOnly string
		localModels, fallbackModels           string
	)
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.Server.BindFlags(fs)
	c.State.BindFlags(fs, "state")
	c.Hooks.BindFlags(fs, "hook")
	c.Lifecycle.BindFlags(fs, "lifecycle")
	c.Middleware.Bind(fs)
	m := &c.Models
	// Each provider's --<flag>-key-file and --<flag>-base-url.
	keyFiles, baseURLs := map[string]*string{}, map[string]*string{}
	var withDefault []string
	for _, d := range providers.All() {
		keyFiles[d.Name] = fs.String(d.KeyFileFlag(), "", d.KeyFileHelp())
		baseURLs[d.Name] = fs.String(d.BaseURLFlag(), "", d.BaseURLHelp())
		if d.DefaultModel != "" {
			withDefault = append(withDefault, d.Name)
		}
	}
	fs.StringVar(&m.OpenAIAPI, "openai-api", def.Models.OpenAIAPI, "OpenAI API for OpenAI models: chat (Chat Completions) or responses (Responses, chained per session)")
	fs.StringVar(&m.EgressProxy, "egress-proxy", "", "send all model traffic through this HTTP proxy: http://HOST:PORT, or unix:///PATH for a proxy on a Unix socket (what the environment service gives a sandbox) (default: $HTTPS_PROXY)")
	fs.StringVar(&m.Catalog, "catalog", "", "model catalog file adding to or replacing the built-in one (same format as catalog/models.json)")
	fs.StringVar(&localModels, "local-models", "", "comma-separated model names served by the OpenAI-compatible server (added to the catalog, free)")
	fs.StringVar(&fallbackModels, "fallback-models", "", "comma-separated models tried in order when the default model keeps failing with retryable errors")
	fs.IntVar(&m.Retries, "model-retries", def.Models.Retries, "retries of a model call after a transient error (429, 5xx, reset), with backoff and Retry-After")
	fs.StringVar(&m.Compaction, "compaction", def.Models.Compaction, "context strategy: "+strings.Join(compaction.Names(), ", "))
	fs.IntVar(&m.ContextReserve, "context-reserve", def.Models.ContextReserve, "tokens of the context window kept free for the response")
	fs.Float64Var(&m.ContextPressure, "context-pressure", def.Models.ContextPressure, "publish a ContextPressure lifecycle event when the context fills this percent of the budget (window less --context-reserve); 0: never")
	fs.BoolVar(&f.oneShot, "one-shot", false, "run one invocation: OperatorInput (protojson) on stdin, OperatorOutput on stdout; exit 0 complete, 3 other exit, 10+gRPC code on error")
	fs.StringVar(&f.inputFile, "one-shot-input", "", "with --one-shot, read the OperatorInput from this file instead of stdin (e.g. a mounted Kubernetes Secret)")
	fs.StringVar(&c.Model, "model", "", "default model, a catalog name (default: the first provider with credentials: "+strings.Join(withDefault, ", ")+"; else the scripted model)")
	fs.StringVar(&c.MCPConfig, "mcp-config", "", `JSON file of MCP servers whose tools to offer: {"servers":[{"name":"fs","command":["..."]},{"name":"web","url":"http://..."}]}`)
	var mcpStdioAllow, mcpHTTPAllow string
	fs.StringVar(&mcpStdioAllow, "mcp-stdio-allow", "", "comma-separated commands an invocation's own stdio MCP servers (OperatorConfig.mcp_servers) may run, compared verbatim; any arguments are allowed, so never list a shell or an interpreter (default: none)")
	fs.StringVar(&mcpHTTPAllow, "mcp-http-allow", "", `comma-separated hosts ("host" or "host:port") an invocation's own streamable HTTP MCP servers may be reached at (default: none)`)
	fs.StringVar(&c.MCPCredentials, "mcp-credentials", "", `JSON file of credentials invocations' MCP servers name by credential_ref: {"credentials":{"NAME":{"headers":{...},"env":{...}}}}`)
	fs.IntVar(&c.MCPPoolSize, "mcp-pool-size", mcp.DefaultPoolSize, "invocation MCP servers kept connected at most (the least recently used idle one is closed first)")
	fs.DurationVar(&c.MCPIdleTimeout, "mcp-idle-timeout", mcp.DefaultIdleTimeout, "close an invocation MCP server no invocation used for this long")
	fs.DurationVar(&c.MCPConnectTimeout, "mcp-connect-timeout", mcp.DefaultConnectTimeout, "bound on starting an invocation MCP server and listing its tools")
	fs.StringVar(&m.Script, "script", "", "JSON script for the scripted model (default: its echo rules)")
	fs.StringVar(&c.SystemPrompt, "system-prompt", def.SystemPrompt, "the agent's system prompt")
	fs.StringVar(&c.SystemPromptFile, "system-prompt-file", "", "read the system prompt from this file (overrides --system-prompt)")
	fs.UintVar(&maxTurns, "max-turns", uint(def.MaxTurns), "default maximum loop iterations per invocation")
	fs.DurationVar(&c.MaxDuration, "max-duration", def.MaxDuration, "default maximum wall-clock time per invocation")
	fs.StringVar(&maxCost, "max-cost", "", "default maximum cost per invocation in USD, e.g. 0.50 (empty: unbounded)")
	fs.IntVar(&c.MaxTokens, "max-tokens", 0, "cap on each model response's tokens (0: the provider's default)")
	fs.IntVar(&c.CircuitBreaker, "circuit-breaker", def.CircuitBreaker, "end the loop after this many consecutive failed tool calls (0: never)")
	fs.IntVar(&c.HistoryEntries, "history-entries", def.HistoryEntries, "read at most this many past invocations of a session as context (0: all)")
	fs.StringVar(&c.Workspace, "workspace", def.Workspace, "directory the file tools and bash are confined to (created if missing)")
	fs.StringVar(&tools, "tools", strings.Join(def.Tools, ","), "comma-separated built-in tools to enable (empty: none)")
	fs.BoolVar(&c.EffectTools, "effect-tools", def.EffectTools, "offer the effect tools (write_memory, delete_memory, delegate, handoff, signal)")
	fs.StringVar(&toolEnv, "tool-env", "", "comma-separated names of this process's environment variables that bash commands get too (their environment is otherwise minimal), e.g. GITHUB_TOKEN")
	fs.StringVar(&toolReadOnly, "tool-read-only", "", "comma-separated extra files or directories bash commands may read (e.g. credential files)")
	fs.DurationVar(&c.ToolTimeout, "tool-timeout", def.ToolTimeout, "default timeout of one tool call")
	fs.IntVar(&c.ToolMaxOutput, "tool-max-output", def.ToolMaxOutput, "tool output beyond this many bytes is truncated, with a notice")
	fs.BoolVar(&c.SandboxUnconfined, "sandbox-unconfined", false, "run bash without Landlock when the kernel lacks it (only with --dev)")
	fs.DurationVar(&c.HookTimeout, "hook-call-timeout", def.HookTimeout, "deadline of each hook call; a slow hook is skipped, not fatal")
	var resumeKey string
	fs.StringVar(&resumeKey, "resume-key", "", "key signing the resume tokens of invocations suspended for tool approval, in hex (at least 16 bytes, e.g. from openssl rand -hex 32); operators that resume each other's invocations (replicas, one-shot runs) must share it (default: $"+sharedResumeKeyEnv+", else a random key of this process)")
	fs.StringVar(&c.ResumeKeyFile, "resume-key-file", "", "file holding the --resume-key in hex")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "json", "json or text")
	fs.Usage = flagenv.Usage(fs, envPrefix, "operator: the layer0 OperatorService (ReAct loop, tools, hooks); --hook-addr takes a comma-separated list")
	if err := flagenv.Parse(fs, envPrefix, args, nil); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.inputFile != "" && !f.oneShot {
		return nil, errors.New("--one-shot-input needs --one-shot")
	}
	if maxCost != "" {
		d, err := decimal.NewFromString(maxCost)
		if err != nil || d.IsNegative() {
			return nil, fmt.Errorf("--max-cost %q: want a non-negative decimal amount in USD such as 0.50", maxCost)
		}
		c.MaxCost = d
	}
	// In a Config zero takes the default; on the command line 0 is a
	// value, and it is refused as ever.
	var problems []error
	if maxTurns == 0 {
		problems = append(problems, errors.New("max turns must be at least 1"))
	}
	if c.MaxDuration <= 0 {
		problems = append(problems, errors.New("max duration must be positive"))
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	c.MaxTurns = uint32(min(maxTurns, 1<<31))
	if resumeKey == "" && c.ResumeKeyFile == "" {
		// The name every neuron service may share (`neuron up` can set
		// it once for all operators).
		resumeKey = os.Getenv(sharedResumeKeyEnv)
	}
	if resumeKey != "" {
		if c.ResumeKeyFile != "" {
			return nil, errors.New("--resume-key and --resume-key-file are exclusive; give one")
		}
		k, err := operator.ParseResumeKey(resumeKey)
		if err != nil {
			return nil, fmt.Errorf("--resume-key: %w", err)
		}
		c.ResumeKey = k
	}
	c.Tools = flagenv.SplitList(tools)
	c.ToolEnv = flagenv.SplitList(toolEnv)
	c.ToolReadOnly = flagenv.SplitList(toolReadOnly)
	c.MCPStdioAllow, c.MCPHTTPAllow = flagenv.SplitList(mcpStdioAllow), flagenv.SplitList(mcpHTTPAllow)
	m.KeyFiles, m.BaseURLs = nonEmpty(keyFiles), nonEmpty(baseURLs)
	m.LocalModels = flagenv.SplitList(localModels)
	m.FallbackModels = flagenv.SplitList(fallbackModels)
	return f, nil
}

// nonEmpty is the flags of m that were set, by provider name; nil when
// none was.
func nonEmpty(m map[string]*string) map[string]string {
	var out map[string]string
	for name, v := range m {
		if *v != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[name] = *v
		}
	}
	return out
}

// run is the flag layer: it parses args (with the NEURON_OPERATOR_* env
// fallbacks) into an operator.Config, builds the logger, and calls
// operator.Run, or operator.RunOneShot with --one-shot. It returns the
// exit code: exitConfig for bad flags or configuration, 1 when serving
// fails, the one-shot codes with --one-shot.
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
	f.cfg.Log = log
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
		code, err := operator.RunOneShot(ctx, f.cfg, stdin, stdout, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "operator: %v\n", err)
			return exitConfig
		}
		return code
	}
	if err := operator.Run(ctx, f.cfg); err != nil {
		fmt.Fprintf(stderr, "operator: %v\n", err)
		if errors.Is(err, operator.ErrServe) {
			return 1
		}
		return exitConfig
	}
	return 0
}
