package operator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/hook"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/mcp"
)

// Operator runs invocations. It is safe for concurrent use: each
// invocation has its own state.
type Operator struct {
	cfg     Config
	router  provider.Router
	tools   *tool.Registry
	hooks   *hook.Registry
	history History
	log     *slog.Logger
	compact compaction.Strategy
	budget  func(model string) compaction.Budget
	events  Publisher
	// The MCP servers invocations bring: checked against mcpPolicy,
	// shared through mcpPool (nil when the policy allows none).
	mcpPool   *mcp.Pool
	mcpPolicy MCPPolicy
	// resume signs and checks resume tokens (resume.go).
	resume resumeKey
}

// Option sets an optional dependency.
type Option func(*Operator)

// WithTools sets the tool registry; without it the operator has no tools.
func WithTools(r *tool.Registry) Option { return func(o *Operator) { o.tools = r } }

// WithHooks sets the hook registry; without it no hooks run.
func WithHooks(r *hook.Registry) Option { return func(o *Operator) { o.hooks = r } }

// WithHistory sets where session history is read from. Without it an
// input that names a session is refused with FAILED_PRECONDITION, since
// its history could not be read and would be silently lost.
func WithHistory(h History) Option { return func(o *Operator) { o.history = h } }

// WithCompaction sets the context strategy run before each model call,
// and how to find the context budget of a model (its window from the
// catalog, less an output reserve). Without it the context is sent whole.
func WithCompaction(s compaction.Strategy, budget func(model string) compaction.Budget) Option {
	return func(o *Operator) { o.compact, o.budget = s, budget }
}

// WithMCP lets invocations bring MCP servers of their own
// (OperatorConfig.mcp_servers) within policy, connected through pool,
// which the caller closes after the operator's last invocation. Without
// it (or with a nil pool) every such server is refused with
// PERMISSION_DENIED.
func WithMCP(pool *mcp.Pool, policy MCPPolicy) Option {
	return func(o *Operator) { o.mcpPool, o.mcpPolicy = pool, policy }
}

// WithResumeKey sets the key resume tokens are signed with (at least
// MinResumeKey bytes; a shorter one makes New fail). Without it each
// Operator draws a random key, so only the same Operator accepts its
// tokens: operators that share suspended invocations (replicas, one-shot
// processes) must share a key.
func WithResumeKey(key []byte) Option {
	return func(o *Operator) { o.resume = resumeKey{key: append([]byte(nil), key...)} }
}

// WithPublisher sets where lifecycle events (compaction) go; the default
// logs them.
func WithPublisher(p Publisher) Option { return func(o *Operator) { o.events = p } }

// New returns an operator with cfg's invocation defaults (SystemPrompt
// to HistoryEntries, used as given: they must pass Validate, so start
// from DefaultConfig; the other fields of cfg are Run's, which builds the
// router and options from them). The default model must route.
func New(cfg Config, router provider.Router, log *slog.Logger, opts ...Option) (*Operator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if router == nil {
		return nil, errors.New("operator: a model router is required")
	}
	if _, _, err := router.Route(cfg.Model); err != nil {
		return nil, fmt.Errorf("default model: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	o := &Operator{cfg: cfg, router: router, log: log}
	for _, opt := range opts {
		opt(o)
	}
	if o.tools == nil {
		o.tools = tool.NewRegistry()
	}
	if o.compact == nil || o.budget == nil {
		o.compact, o.budget = compaction.None(), func(string) compaction.Budget { return compaction.Budget{} }
	}
	if o.events == nil {
		o.events = LogPublisher{Log: log}
	}
	if o.resume.key == nil {
		o.resume = newRandomResumeKey()
	} else if len(o.resume.key) < MinResumeKey {
		return nil, fmt.Errorf("operator: the resume key is %d bytes; give at least %d", len(o.resume.key), MinResumeKey)
	}
	return o, nil
}

// Events receives progress events of an invocation, in order. An error
// from it (the client went away) ends the invocation with that error.
type Events func(*operatorv1.ExecuteStreamResponse) error

// Execute runs one invocation. Limits end the loop with an ExitReason and
// an output; errors are returned for what the caller must act on (see the
// package doc). events may be nil.
//
// An input with resume set continues an invocation that exited
// SUSPENDED: its token must be one this operator's key signed, and its
// tool_decisions must decide every call the suspension listed (both
// INVALID_ARGUMENT otherwise). Its message is required as for any input
// but not added to the conversation, which the token carries.
func (o *Operator) Execute(ctx context.Context, in *operatorv1.OperatorInput, events Events) (*operatorv1.OperatorOutput, error) {
	return o.execute(ctx, in, events, false)
}

// execute is Execute; oneShot says the invocation is a process of its
// own (OneShot), which a random resume key could never resume.
func (o *Operator) execute(ctx context.Context, in *operatorv1.OperatorInput, events Events, oneShot bool) (*operatorv1.OperatorOutput, error) {
	if in == nil || in.GetMessage() == nil {
		return nil, fmt.Errorf("input.message is required: %w", errs.InvalidArgument)
	}
	if len(in.GetMessage().GetBlocks()) == 0 {
		return nil, fmt.Errorf("input.message has no content blocks; send at least one, e.g. {\"text\":{\"text\":\"...\"}}: %w", errs.InvalidArgument)
	}
	lim, err := o.cfg.resolve(in.GetConfig())
	if err != nil {
		return nil, err
	}
	var (
		resumed *resumeState
		decided map[string]decision
	)
	if res := in.GetResume(); res != nil {
		if resumed, err = o.resume.open(res.GetResumeToken()); err != nil {
			return nil, err
		}
		if want := resumed.Session; (want == nil) != (in.SessionId == nil) || want != nil && *want != in.GetSessionId() {
			which := "no session_id"
			if want != nil {
				which = fmt.Sprintf("session_id %q", *want)
			}
			return nil, fmt.Errorf("input.session_id: the suspended invocation had %s; resume it with the same: %w", which, errs.InvalidArgument)
		}
		if decided, err = matchDecisions(resumed, res.GetToolDecisions()); err != nil {
			return nil, err
		}
	}
	prov, model, err := o.router.Route(lim.model)
	if err != nil {
		return nil, fmt.Errorf("config.model: %w", err)
	}
	if in.SessionId != nil && lim.history && o.history == nil {
		return nil, fmt.Errorf("session_id %q given, but this operator has no state service to read the session's history from; configure --state-addr or omit session_id: %w",
			in.GetSessionId(), errs.FailedPrecondition)
	}
	tools := &toolset{base: o.tools}
	if defs := in.GetConfig().GetMcpServers(); len(defs) > 0 {
		leases, err := o.agentServers(ctx, defs)
		if err != nil {
			return nil, err
		}
		defer func() {
			for _, l := range leases {
				l.Release()
			}
		}()
		tools.extra = make(map[string]*tool.Registry, len(leases))
		for i, l := range leases {
			tools.extra[defs[i].GetName()] = l.Registry
		}
	}
	specs, err := tools.specs(lim.allowed, lim.restrict)
	if err != nil {
		return nil, fmt.Errorf("config.allowed_tools: %w", err)
	}

	r := &run{
		op:       o,
		in:       in,
		lim:      lim,
		provider: prov,
		model:    model,
		specs:    specs,
		tools:    tools,
		strategy: o.strategy(lim.strategy, prov, model),
		strict:   lim.strategy == operatorv1.ContextStrategy_CONTEXT_STRATEGY_NONE,
		events:   events,
		start:    time.Now(),
		keyBase:  in.GetDispatch().GetDispatchId(),
		resume:   resumed,
		decided:  decided,
		oneShot:  oneShot,
		log:      o.log.With("dispatch_id", in.GetDispatch().GetDispatchId(), "workflow_id", in.GetDispatch().GetWorkflowId()),
	}
	if md := in.GetMetadata(); md != nil {
		r.metadata = md.AsMap()
	}
	if r.keyBase == "" {
		r.keyBase = "inv-" + randomHex(8)
	}
	r.allowed = make(map[string]bool, len(specs))
	for _, s := range specs {
		r.allowed[s.Name] = true
	}
	if prov.Name() == provider.ScriptedName {
		r.log.Warn("SCRIPTED MODEL: replies come from a script, not from a language model")
	}
	ctx, traced := r.traceInvocation(ctx)
	out, err := r.execute(ctx)
	traced(out, err)
	return out, err
}

// strategy is the context strategy of an invocation that asked for cs:
// UNSPECIFIED is the deployment's (--compaction); TRUNCATE the sliding
// window; COMPACT the deployment's summarizer when it has one, else a
// summarizer asking the invocation's own model (p, model); NONE sends
// everything (the run refuses what does not fit, see run.compact).
func (o *Operator) strategy(cs operatorv1.ContextStrategy, p provider.Provider, model string) compaction.Strategy {
	switch cs {
	case operatorv1.ContextStrategy_CONTEXT_STRATEGY_TRUNCATE:
		return compaction.SlidingWindow()
	case operatorv1.ContextStrategy_CONTEXT_STRATEGY_COMPACT:
		if o.compact.Name() == compaction.NameSummarize {
			return o.compact
		}
		return compaction.Summarize(p, model, compaction.WithLogger(o.log))
	case operatorv1.ContextStrategy_CONTEXT_STRATEGY_NONE:
		return compaction.None()
	}
	return o.compact
}

// agentServers checks every MCP server of an invocation against the
// deployment's policy, all before any is started, then leases each from
// the pool. On error nothing stays leased.
func (o *Operator) agentServers(ctx context.Context, defs []*operatorv1.McpServer) ([]*mcp.Lease, error) {
	policy := o.mcpPolicy
	if o.mcpPool == nil {
		policy = MCPPolicy{}
	}
	own := o.tools.Names()
	servers := make([]mcp.Server, len(defs))
	seen := map[string]int{}
	for i, d := range defs {
		field := fmt.Sprintf("config.mcp_servers[%d]", i)
		if j, ok := seen[d.GetName()]; ok {
			return nil, fmt.Errorf("%s: name %q is also the name of config.mcp_servers[%d]; names must be unique: %w", field, d.GetName(), j, errs.InvalidArgument)
		}
		seen[d.GetName()] = i
		for _, n := range own {
			if strings.HasPrefix(n, d.GetName()+"__") {
				return nil, fmt.Errorf("%s.name %q is taken by an MCP server of the operator deployment (its tool %q); choose another name: %w", field, d.GetName(), n, errs.InvalidArgument)
			}
		}
		s, err := policy.server(field, d)
		if err != nil {
			return nil, err
		}
		servers[i] = s
	}
	leases := make([]*mcp.Lease, 0, len(servers))
	for i, s := range servers {
		l, err := o.mcpPool.Acquire(ctx, s)
		if err != nil {
			for _, l := range leases {
				l.Release()
			}
			return nil, fmt.Errorf("config.mcp_servers[%d]: %w", i, err)
		}
		leases = append(leases, l)
	}
	return leases, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}
