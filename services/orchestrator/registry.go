package orchestrator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"buf.build/go/protovalidate"
	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
)

// Agent is one registry entry. Agents returned by a Registry are shared:
// do not modify them.
type Agent struct {
	ID string
	// Operator is the operator service address (a gRPC target).
	Operator string
	// Environment is the environment service address; the agent runs
	// isolated, with Spec. Exactly one of Operator and Environment is set.
	Environment string
	// Spec is the isolation the environment service is asked for; only
	// with Environment. nil means the service's default.
	Spec     *environmentv1.EnvironmentSpec
	Defaults AgentDefaults
	Retry    RetryPolicy
	// Revision is the revision of the stored definition this agent was
	// read from (services/orchestrator/agents); 0 for an agent of a YAML
	// registry, which has no revisions.
	Revision uint64
	// AllowedAgents, when Restricted, are the agents this one may
	// delegate or hand off to; the workflow refuses any other with
	// FAILED_PRECONDITION. Not Restricted: any agent.
	Restricted    bool
	AllowedAgents []string
	// Description and Labels describe the agent to people (AgentService).
	Description string
	Labels      map[string]string
	// BusySession is what a message for a session does while a workflow
	// of this agent for that session has not ended: "" (start another,
	// side by side), or one of the Busy* policies.
	BusySession string
}

// Busy-session policies (Agent.BusySession).
const (
	BusyReject    = "reject"
	BusyEnqueue   = "enqueue"
	BusyInterrupt = "interrupt"
	BusySignal    = "signal"
)

// AgentSource is where engines find the agents they dispatch: a YAML
// Registry, or the definitions kept in the State service
// (services/orchestrator/agents). Implementations are safe for
// concurrent use; the agents they return are shared: do not modify them.
type AgentSource interface {
	// Lookup returns the current definition of agent id, or an error
	// wrapping errs.NotFound that says how to define it.
	Lookup(id string) (*Agent, error)
	// LookupRevision returns agent id as it was at revision (0: the
	// current one), so that a workflow keeps the definition it started
	// with. A source without revisions returns the current one.
	LookupRevision(id string, revision uint64) (*Agent, error)
}

// Info is what the workflow decides on about a, as the engines record it.
func (a *Agent) Info() AgentInfo {
	return AgentInfo{Model: a.Defaults.Model, DowngradeModel: a.Defaults.DowngradeModel, Retry: a.Retry.WithDefaults(),
		Revision: a.Revision, Restricted: a.Restricted, AllowedAgents: a.AllowedAgents}
}

// AgentDefaults fill an invocation's unset OperatorConfig fields and
// metadata (see Agent.Apply), and the workflow-level settings.
type AgentDefaults struct {
	Model string
	// DowngradeModel is a cheaper model the budget policy may switch to.
	DowngradeModel string
	// Budget is the workflow-wide budget when a workflow started with this
	// agent names none.
	Budget decimal.NullDecimal
	// MaxCost is the per-invocation max_cost.
	MaxCost decimal.NullDecimal
	// MaxTurns of 0 means the operator's default.
	MaxTurns uint32
	// MaxDuration of 0 means the operator's default.
	MaxDuration time.Duration
	// AllowedTools nil means the operator's default; non-nil and empty
	// means no tools at all.
	AllowedTools   []string
	SystemAddendum string
	// Instructions is the agent's system prompt (OperatorConfig
	// instructions: it replaces the operator's own).
	Instructions string
	// MCPServers are the agent's own MCP servers and ModelParameters its
	// model's parameters (OperatorConfig mcp_servers, model_parameters).
	MCPServers      []*operatorv1.McpServer
	ModelParameters *operatorv1.ModelParameters
	// SearchableHistory makes the conversation history of its invocations
	// full-text indexed by the State service (off: stored, not indexed).
	SearchableHistory bool
	// SessionHistory is OperatorConfig.session_history: nil leaves the
	// operator's default (on); false means the agent's invocations neither
	// read nor write their session's conversation history.
	SessionHistory *bool
	// MemoryScopes is OperatorConfig.memory_scopes: the State scopes its
	// memory tools (search_memory, read_memory) may read; empty: its
	// invocations' own.
	MemoryScopes []string
	// ContextStrategy is OperatorConfig.context_strategy: how a
	// conversation longer than the model's context is fitted into it
	// (UNSPECIFIED: the operator's --compaction).
	ContextStrategy operatorv1.ContextStrategy
	// ToolApprovals is OperatorConfig.tool_approvals: which tool calls
	// wait for a person's approval, by tool name ("*": any other tool).
	ToolApprovals map[string]operatorv1.ToolApproval
	// Metadata is merged into the input's metadata; keys in the input win.
	Metadata *structpb.Struct
}

// RetryPolicy retries retryable operator errors with bounded exponential
// backoff and full jitter.
type RetryPolicy struct {
	// MaxAttempts counts every attempt including the first; 1 means no
	// retry.
	MaxAttempts int
	// InitialBackoff caps the wait after the first failure.
	InitialBackoff time.Duration
	// MaxBackoff caps every wait.
	MaxBackoff time.Duration
}

// The retry policy of an agent that sets none, and the bounds of a
// policy's fields.
const (
	DefaultRetryMaxAttempts    = 3
	DefaultRetryInitialBackoff = 200 * time.Millisecond
	DefaultRetryMaxBackoff     = 5 * time.Second
	MaxRetryAttempts           = 20
)

// MaxAgentIDLen is the longest agent id a registry accepts; it matches the
// agent_id limit of DispatchContext.
const MaxAgentIDLen = 256

// maxListedAgents bounds the known agents a Lookup error lists.
const maxListedAgents = 20

// WithDefaults fills zero fields with the defaults.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultRetryMaxAttempts
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = DefaultRetryInitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = DefaultRetryMaxBackoff
	}
	return p
}

// Backoff is how long to wait before the next attempt after the attempt-th
// failure (attempt counts from 1: the wait after the first failure). The
// ceiling is InitialBackoff doubled per earlier failure, capped at
// MaxBackoff; the wait is full jitter, rnd() times the ceiling, so it lies
// in [0, ceiling]. rnd returns a number in [0, 1) (values outside are
// clamped); nil means math/rand/v2's Float64. Zero fields of p mean the
// defaults; attempt below 1 counts as 1.
func (p RetryPolicy) Backoff(attempt int, rnd func() float64) time.Duration {
	p = p.WithDefaults()
	ceiling := min(p.InitialBackoff, p.MaxBackoff)
	for i := 1; i < attempt && ceiling < p.MaxBackoff; i++ {
		if ceiling > p.MaxBackoff/2 {
			ceiling = p.MaxBackoff
			break
		}
		ceiling *= 2
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	f := rnd()
	switch {
	case math.IsNaN(f) || f < 0:
		f = 0
	case f > 1:
		f = 1
	}
	wait := f * float64(ceiling)
	if wait >= float64(ceiling) { // also where float64 rounds past MaxInt64
		return ceiling
	}
	return time.Duration(wait)
}

// Registry is the set of agents an orchestrator dispatches, read from a
// YAML file. It does not change once parsed and is safe for concurrent
// use.
type Registry struct {
	agents []*Agent
	byID   map[string]*Agent
	// src, when set, answers Lookup and LookupRevision instead of the
	// file (SourceRegistry).
	src AgentSource
}

// SourceRegistry returns a Registry whose lookups are src's: the engines
// take a *Registry, and this is how they dispatch the definitions kept in
// the State service. file, when not nil, is the YAML registry the
// definitions were seeded from; Agents returns its agents.
func SourceRegistry(src AgentSource, file *Registry) *Registry {
	r := &Registry{src: src}
	if file != nil {
		r.agents, r.byID = file.agents, file.byID
	}
	return r
}

// LoadRegistry reads and parses the registry file at path (see
// ParseRegistry). Errors name the file.
func LoadRegistry(path string) (*Registry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("agent registry: %w", err)
	}
	return parseRegistry(data, "agent registry "+path)
}

// ParseRegistry parses an agent registry in YAML:
//
//	defaults:                 # optional; every agent inherits these
//	  operator: 127.0.0.1:7071
//	  retry: {max_attempts: 3, initial_backoff: 200ms, max_backoff: 5s}
//	agents:
//	  - id: researcher
//	    operator: 127.0.0.1:7071   # an operator service address (gRPC target)
//	    model: claude-sonnet-4-5
//	    downgrade_model: claude-haiku-4-5
//	    budget: "1.00"
//	    max_cost: "0.25"
//	    max_turns: 10
//	    max_duration: 2m
//	    allowed_tools: [read, write_memory, delegate]
//	    system_addendum: "Cite sources."
//	    searchable_history: true
//	    session_history: false
//	    context_strategy: truncate
//	    metadata: {team: research}
//	  - id: sandboxed
//	    environment: 127.0.0.1:7073  # an environment service address
//	    spec:
//	      timeout: 60s
//	      resources: {memory: 512Mi, max_processes: 64}
//
// Fields of an agent, all optional but id and the address:
//
//   - id: [A-Za-z0-9._-]+, at most 256 characters, unique.
//   - operator or environment (exactly one): the agent runs on the
//     operator service at that address, or inside the isolation of the
//     environment service at that address.
//   - spec: only with environment; a layer0.environment.v1.EnvironmentSpec
//     in its JSON mapping (lowerCamel or original field names), checked
//     against the proto's validation rules. Its durations may also be Go
//     durations such as "2m". Quote quantities ("1", not 1).
//   - model, downgrade_model: model names; downgrade_model is the cheaper
//     model the budget policy may switch to.
//   - budget: the workflow budget in USD when a workflow started with this
//     agent names none; max_cost: the cost limit of one invocation. Each a
//     non-negative decimal, a string ("0.25", preferred: exact) or a number.
//   - max_turns: at least 1. max_duration: a positive Go duration ("2m").
//   - allowed_tools: tool names; [] means no tools at all, absent means
//     the operator's default.
//   - system_addendum: appended to the operator's system prompt.
//   - searchable_history: true makes the conversation history of the
//     agent's sessions full-text searchable in the State service; by
//     default it is stored and read back, not indexed (cheaper).
//   - session_history: false makes the agent's invocations neither read
//     nor write their session's conversation history (default true).
//   - busy_session: what a message for a session does while a workflow
//     of this agent for that session has not ended: reject, enqueue,
//     interrupt or signal (absent: messages run side by side).
//   - memory_scopes: the State scopes the agent's memory tools
//     (search_memory, read_memory) may read: session, workflow, agent,
//     global (a stored definition's memory.readable_scopes); absent: its
//     invocations' own (session, workflow, agent).
//   - context_strategy: compact (summarise older turns), truncate (drop
//     them) or none (a conversation that does not fit fails); absent: the
//     operator's --compaction.
//   - tool_approvals: a mapping of tool name ("*": every tool not named)
//     to never, always (every call waits for a person's approval) or ask
//     (calls wait unless the tool is read-only).
//   - metadata: a mapping merged into every invocation's metadata.
//   - retry: max_attempts (1 to 20, counting the first; default 3),
//     initial_backoff (default 200ms) and max_backoff (default 5s),
//     positive durations with initial_backoff <= max_backoff.
//
// defaults takes the same fields but id. An agent's own field wins over
// the default one, whole (metadata and allowed_tools are not merged),
// except retry, merged field by field. An agent that sets operator drops
// the default environment and spec; one that sets environment drops the
// default operator. A default spec applies to agents run in an
// environment that set none.
//
// Unknown fields are errors. Every error wraps errs.InvalidArgument and
// names the agent and the field; YAML syntax errors give the line.
func ParseRegistry(data []byte) (*Registry, error) {
	return parseRegistry(data, "agent registry")
}

// Lookup returns the agent with the given id, or an error wrapping
// errs.NotFound that lists the known agents.
func (r *Registry) Lookup(id string) (*Agent, error) {
	if r.src != nil {
		return r.src.Lookup(id)
	}
	if a, ok := r.byID[id]; ok {
		return a, nil
	}
	ids := make([]string, 0, min(len(r.agents), maxListedAgents))
	for _, a := range r.agents[:min(len(r.agents), maxListedAgents)] {
		ids = append(ids, a.ID)
	}
	known := strings.Join(ids, ", ")
	if more := len(r.agents) - len(ids); more > 0 {
		known += fmt.Sprintf(" and %d more", more)
	}
	return nil, fmt.Errorf("agent %q is not in the agent registry (known agents: %s): %w", id, known, errs.NotFound)
}

// LookupRevision implements AgentSource: a file has no revisions, so it
// is Lookup (for a SourceRegistry, its source's).
func (r *Registry) LookupRevision(id string, revision uint64) (*Agent, error) {
	if r.src != nil {
		return r.src.LookupRevision(id, revision)
	}
	return r.Lookup(id)
}

// Agents returns the agents in file order.
func (r *Registry) Agents() []*Agent {
	return append([]*Agent(nil), r.agents...)
}

// memoryScopes is the OperatorConfig.memory_scopes of an invocation: the
// definition's (def), narrowed to those the input asks for (in). An input
// can narrow, never widen: a scope the definition does not allow (without
// memory_scopes: the invocation's own session, workflow and agent) is
// dropped, and nil (the invocation's own) is left when none remains.
func memoryScopes(in, def []string) []string {
	allowed := def
	if len(allowed) == 0 {
		allowed = []string{"session", "workflow", "agent"}
	}
	if len(in) == 0 {
		return slices.Clone(def)
	}
	var out []string
	for _, s := range in {
		if slices.Contains(allowed, s) && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// Apply returns a copy of in with the agent's defaults filled where the
// input's OperatorConfig leaves a field unset: max_turns, model,
// system_addendum and instructions when absent, mcp_servers when empty,
// model_parameters when nil, max_cost and max_duration when nil,
// allowed_tools when the AllowedTools wrapper is nil (a present wrapper,
// even an empty one, is kept). The agent's metadata is merged into the
// input's; keys of the input win. in is never modified; nil counts as an
// empty input.
func (a *Agent) Apply(in *operatorv1.OperatorInput) *operatorv1.OperatorInput {
	out := &operatorv1.OperatorInput{}
	if in != nil {
		out = proto.CloneOf(in)
	}
	d := &a.Defaults
	cfg := out.GetConfig()
	if cfg == nil {
		cfg = &operatorv1.OperatorConfig{}
	}
	if cfg.MaxTurns == nil && d.MaxTurns > 0 {
		cfg.MaxTurns = proto.Uint32(d.MaxTurns)
	}
	if cfg.MaxCost == nil && d.MaxCost.Valid {
		cfg.MaxCost = money.FromDecimal(d.MaxCost.Decimal)
	}
	if cfg.MaxDuration == nil && d.MaxDuration > 0 {
		cfg.MaxDuration = durationpb.New(d.MaxDuration)
	}
	if cfg.Model == nil && d.Model != "" {
		cfg.Model = proto.String(d.Model)
	}
	if cfg.AllowedTools == nil && d.AllowedTools != nil {
		cfg.AllowedTools = &operatorv1.AllowedTools{Names: append([]string{}, d.AllowedTools...)}
	}
	if cfg.SystemAddendum == nil && d.SystemAddendum != "" {
		cfg.SystemAddendum = proto.String(d.SystemAddendum)
	}
	if cfg.Instructions == nil && d.Instructions != "" {
		cfg.Instructions = proto.String(d.Instructions)
	}
	if len(cfg.McpServers) == 0 && len(d.MCPServers) > 0 {
		cfg.McpServers = make([]*operatorv1.McpServer, len(d.MCPServers))
		for i, s := range d.MCPServers {
			cfg.McpServers[i] = proto.CloneOf(s)
		}
	}
	if cfg.ModelParameters == nil && d.ModelParameters != nil {
		cfg.ModelParameters = proto.CloneOf(d.ModelParameters)
	}
	if cfg.SearchableHistory == nil && d.SearchableHistory {
		cfg.SearchableHistory = proto.Bool(true)
	}
	if cfg.SessionHistory == nil && d.SessionHistory != nil {
		cfg.SessionHistory = proto.Bool(*d.SessionHistory)
	}
	cfg.MemoryScopes = memoryScopes(cfg.MemoryScopes, d.MemoryScopes)
	if cfg.ContextStrategy == operatorv1.ContextStrategy_CONTEXT_STRATEGY_UNSPECIFIED {
		cfg.ContextStrategy = d.ContextStrategy
	}
	if len(cfg.ToolApprovals) == 0 && len(d.ToolApprovals) > 0 {
		cfg.ToolApprovals = maps.Clone(d.ToolApprovals)
	}
	if out.Config != nil || proto.Size(cfg) > 0 {
		out.Config = cfg
	}
	if len(d.Metadata.GetFields()) > 0 {
		md := proto.CloneOf(d.Metadata)
		for k, v := range out.GetMetadata().GetFields() {
			md.Fields[k] = v
		}
		out.Metadata = md
	}
	return out
}

// contextStrategies are the context_strategy values of the file, by name.
var contextStrategies = map[string]operatorv1.ContextStrategy{
	"compact":  operatorv1.ContextStrategy_CONTEXT_STRATEGY_COMPACT,
	"truncate": operatorv1.ContextStrategy_CONTEXT_STRATEGY_TRUNCATE,
	"none":     operatorv1.ContextStrategy_CONTEXT_STRATEGY_NONE,
}

// toolApprovals are the tool_approvals values of the file, by name (the
// names of layer0.agent.v1.ApprovalPolicy: ask waits for calls of tools
// that are not read-only).
var toolApprovals = map[string]operatorv1.ToolApproval{
	"never":  operatorv1.ToolApproval_TOOL_APPROVAL_NEVER,
	"always": operatorv1.ToolApproval_TOOL_APPROVAL_ALWAYS,
	"ask":    operatorv1.ToolApproval_TOOL_APPROVAL_UNLESS_READ_ONLY,
}

// agentEntry is one agent (or the defaults) as written in the file. A nil
// pointer or RawMessage is an absent field.
type agentEntry struct {
	ID             *string           `json:"id"`
	Operator       *string           `json:"operator"`
	Environment    *string           `json:"environment"`
	Spec           json.RawMessage   `json:"spec"`
	Model          *string           `json:"model"`
	DowngradeModel *string           `json:"downgrade_model"`
	Budget         json.RawMessage   `json:"budget"`
	MaxCost        json.RawMessage   `json:"max_cost"`
	MaxTurns       json.RawMessage   `json:"max_turns"`
	MaxDuration    json.RawMessage   `json:"max_duration"`
	AllowedTools   []string          `json:"allowed_tools"` // [] is non-nil
	SystemAddendum *string           `json:"system_addendum"`
	SearchableHist *bool             `json:"searchable_history"`
	SessionHist    *bool             `json:"session_history"`
	MemoryScopes   []string          `json:"memory_scopes"`
	ContextStrat   *string           `json:"context_strategy"`
	ToolApprovals  map[string]string `json:"tool_approvals"`
	Metadata       json.RawMessage   `json:"metadata"`
	Retry          *retryEntry       `json:"retry"`
	// Fields of the stored definitions (issue 20) that the file can seed.
	Instructions  *string           `json:"instructions"`
	Description   *string           `json:"description"`
	Labels        map[string]string `json:"labels"`
	AllowedAgents []string          `json:"allowed_agents"` // [] is non-nil: none
	BusySession   *string           `json:"busy_session"`
}

type retryEntry struct {
	MaxAttempts    json.RawMessage `json:"max_attempts"`
	InitialBackoff json.RawMessage `json:"initial_backoff"`
	MaxBackoff     json.RawMessage `json:"max_backoff"`
}

type registryFile struct {
	Defaults json.RawMessage   `json:"defaults"`
	Agents   []json.RawMessage `json:"agents"`
}

var agentIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// registryParser holds the state of one parse.
type registryParser struct {
	name string // "agent registry <path>", prefixed to every error
}

func parseRegistry(data []byte, name string) (*Registry, error) {
	p := &registryParser{name: name}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, p.errorf("", "%v", err)
	}
	js = bytes.TrimSpace(js)
	if len(js) == 0 || string(js) == "null" {
		return nil, p.errorf("", `the file is empty: want "agents:" with at least one agent`)
	}
	if !jsonIsObject(js) {
		return nil, p.errorf("", `want a mapping with "agents:" (and optionally "defaults:") at the top level`)
	}
	var file registryFile
	if err := decodeRegistryJSON(js, &file); err != nil {
		return nil, p.errorf("", "%s", err)
	}
	var defaults agentEntry
	if isSet(file.Defaults) {
		if !jsonIsObject(file.Defaults) {
			return nil, p.errorf("defaults", "want a mapping of agent fields")
		}
		if err := decodeRegistryJSON(file.Defaults, &defaults); err != nil {
			return nil, p.errorf("defaults", "%s", err)
		}
		if defaults.ID != nil {
			return nil, p.errorf("defaults", "id is not allowed here: defaults apply to every agent")
		}
		if defaults.Operator != nil && defaults.Environment != nil {
			return nil, p.errorf("defaults", "set operator or environment, not both")
		}
		if _, err := p.agent(defaults, "defaults", true); err != nil {
			return nil, err
		}
	}
	if len(file.Agents) == 0 {
		return nil, p.errorf("", `no agents: want "agents:" with at least one agent`)
	}
	r := &Registry{byID: make(map[string]*Agent, len(file.Agents))}
	index := make(map[string]int, len(file.Agents))
	for i, raw := range file.Agents {
		where := fmt.Sprintf("agents[%d]", i)
		if !jsonIsObject(raw) {
			return nil, p.errorf(where, "want a mapping with an id, such as {id: researcher, operator: 127.0.0.1:7071}")
		}
		var peek struct {
			ID any `json:"id"`
		}
		_ = json.Unmarshal(raw, &peek) // only to name the agent in errors
		if id, ok := peek.ID.(string); ok && id != "" && len(id) <= MaxAgentIDLen {
			where = fmt.Sprintf("agent %q", id)
		}
		var e agentEntry
		if err := decodeRegistryJSON(raw, &e); err != nil {
			return nil, p.errorf(where, "%s", err)
		}
		id := ""
		if e.ID != nil {
			id = *e.ID
		}
		switch {
		case id == "":
			return nil, p.errorf(where, "id is required")
		case len(id) > MaxAgentIDLen:
			return nil, p.errorf(where, "id %q...: %d characters, at most %d", id[:32], len(id), MaxAgentIDLen)
		case !agentIDPattern.MatchString(id):
			return nil, p.errorf(where, "id may contain only letters, digits, '.', '_' and '-'")
		}
		if j, dup := index[id]; dup {
			return nil, p.errorf(where, "id is already used by agents[%d]", j)
		}
		index[id] = i
		a, err := p.agent(mergeEntries(defaults, e), where, false)
		if err != nil {
			return nil, err
		}
		a.ID = id
		switch {
		case a.Operator == "" && a.Environment == "":
			return nil, p.errorf(where, "set operator (an operator service address) or environment (an environment service address)")
		case a.Operator != "" && a.Environment != "":
			return nil, p.errorf(where, "set operator or environment, not both")
		}
		r.agents = append(r.agents, a)
		r.byID[id] = a
	}
	return r, nil
}

// mergeEntries returns e with the fields it leaves unset taken from def.
func mergeEntries(def, e agentEntry) agentEntry {
	m := e
	// An agent that sets operator or environment leaves both defaults:
	// one that picks an operator drops the default environment and, as it
	// runs in none, the default spec.
	if e.Operator == nil && e.Environment == nil {
		m.Operator, m.Environment = def.Operator, def.Environment
	}
	if m.Spec == nil && m.Environment != nil {
		m.Spec = def.Spec
	}
	if m.Model == nil {
		m.Model = def.Model
	}
	if m.DowngradeModel == nil {
		m.DowngradeModel = def.DowngradeModel
	}
	if !isSet(m.Budget) {
		m.Budget = def.Budget
	}
	if !isSet(m.MaxCost) {
		m.MaxCost = def.MaxCost
	}
	if !isSet(m.MaxTurns) {
		m.MaxTurns = def.MaxTurns
	}
	if !isSet(m.MaxDuration) {
		m.MaxDuration = def.MaxDuration
	}
	if m.AllowedTools == nil {
		m.AllowedTools = def.AllowedTools
	}
	if m.SystemAddendum == nil {
		m.SystemAddendum = def.SystemAddendum
	}
	if m.SearchableHist == nil {
		m.SearchableHist = def.SearchableHist
	}
	if m.SessionHist == nil {
		m.SessionHist = def.SessionHist
	}
	if m.ContextStrat == nil {
		m.ContextStrat = def.ContextStrat
	}
	if !isSet(m.Metadata) {
		m.Metadata = def.Metadata
	}
	if m.Instructions == nil {
		m.Instructions = def.Instructions
	}
	if m.AllowedAgents == nil {
		m.AllowedAgents = def.AllowedAgents
	}
	if m.BusySession == nil {
		m.BusySession = def.BusySession
	}
	if def.Retry != nil {
		r := *def.Retry
		if e.Retry != nil {
			if isSet(e.Retry.MaxAttempts) {
				r.MaxAttempts = e.Retry.MaxAttempts
			}
			if isSet(e.Retry.InitialBackoff) {
				r.InitialBackoff = e.Retry.InitialBackoff
			}
			if isSet(e.Retry.MaxBackoff) {
				r.MaxBackoff = e.Retry.MaxBackoff
			}
		}
		m.Retry = &r
	}
	return m
}

// agent converts and checks every field of e but id. The defaults may
// have a spec without an environment, for agents that name one.
func (p *registryParser) agent(e agentEntry, where string, isDefaults bool) (*Agent, error) {
	a := &Agent{}
	var err error
	if e.Operator != nil {
		if *e.Operator == "" {
			return nil, p.errorf(where, `operator is empty: want an address such as "127.0.0.1:7071"`)
		}
		a.Operator = *e.Operator
	}
	if e.Environment != nil {
		if *e.Environment == "" {
			return nil, p.errorf(where, `environment is empty: want an address such as "127.0.0.1:7073"`)
		}
		a.Environment = *e.Environment
	}
	if isSet(e.Spec) {
		if e.Environment == nil && !isDefaults {
			return nil, p.errorf(where, "spec is only allowed with environment: an agent on an operator runs without isolation")
		}
		if a.Spec, err = p.spec(e.Spec); err != nil {
			return nil, p.errorf(where, "%s", err)
		}
	}
	d := &a.Defaults
	if e.Model != nil {
		if *e.Model == "" {
			return nil, p.errorf(where, "model is empty: leave it out for the operator's default")
		}
		d.Model = *e.Model
	}
	if e.DowngradeModel != nil {
		if *e.DowngradeModel == "" {
			return nil, p.errorf(where, "downgrade_model is empty: leave it out for none")
		}
		d.DowngradeModel = *e.DowngradeModel
	}
	if d.Budget, err = parseMoneyField("budget", e.Budget); err != nil {
		return nil, p.errorf(where, "%s", err)
	}
	if d.MaxCost, err = parseMoneyField("max_cost", e.MaxCost); err != nil {
		return nil, p.errorf(where, "%s", err)
	}
	if isSet(e.MaxTurns) {
		n, err := parseCountField("max_turns", e.MaxTurns, 1, math.MaxUint32)
		if err != nil {
			return nil, p.errorf(where, "%s; leave it out for the operator's default", err)
		}
		d.MaxTurns = uint32(n)
	}
	if d.MaxDuration, err = parseDurationField("max_duration", e.MaxDuration); err != nil {
		return nil, p.errorf(where, "%s", err)
	}
	for i, name := range e.AllowedTools {
		if name == "" {
			return nil, p.errorf(where, "allowed_tools[%d] is empty", i)
		}
	}
	if e.AllowedTools != nil {
		d.AllowedTools = append([]string{}, e.AllowedTools...)
	}
	if e.SystemAddendum != nil {
		d.SystemAddendum = *e.SystemAddendum
	}
	if e.SearchableHist != nil {
		d.SearchableHistory = *e.SearchableHist
	}
	if e.SessionHist != nil {
		d.SessionHistory = proto.Bool(*e.SessionHist)
	}
	for i, s := range e.MemoryScopes {
		if !slices.Contains([]string{"session", "workflow", "agent", "global"}, s) || slices.Index(e.MemoryScopes, s) != i {
			return nil, p.errorf(where, "memory_scopes[%d] %q: want session, workflow, agent or global, each once", i, s)
		}
	}
	d.MemoryScopes = slices.Clone(e.MemoryScopes)
	if e.ContextStrat != nil {
		cs, ok := contextStrategies[*e.ContextStrat]
		if !ok {
			return nil, p.errorf(where, "context_strategy %q: want compact, truncate or none (leave it out for the operator's default)", *e.ContextStrat)
		}
		d.ContextStrategy = cs
	}
	if e.ToolApprovals != nil {
		d.ToolApprovals = map[string]operatorv1.ToolApproval{}
		for tool, v := range e.ToolApprovals {
			a, ok := toolApprovals[v]
			if !ok || tool == "" {
				return nil, p.errorf(where, "tool_approvals: %q: %q: want a tool name (or \"*\") mapped to never, always or ask", tool, v)
			}
			d.ToolApprovals[tool] = a
		}
	}
	if isSet(e.Metadata) {
		md := &structpb.Struct{}
		if !jsonIsObject(e.Metadata) || protojson.Unmarshal(e.Metadata, md) != nil {
			return nil, p.errorf(where, "metadata: want a mapping, such as {team: research}")
		}
		d.Metadata = md
	}
	if a.Retry, err = parseRetry(e.Retry); err != nil {
		return nil, p.errorf(where, "%s", err)
	}
	if e.Instructions != nil {
		d.Instructions = *e.Instructions
	}
	if e.Description != nil {
		a.Description = *e.Description
	}
	a.Labels = e.Labels
	for i, id := range e.AllowedAgents {
		if !agentIDPattern.MatchString(id) || len(id) > MaxAgentIDLen {
			return nil, p.errorf(where, "allowed_agents[%d] %q: want an agent id", i, id)
		}
	}
	if e.AllowedAgents != nil {
		a.Restricted, a.AllowedAgents = true, append([]string{}, e.AllowedAgents...)
	}
	if e.BusySession != nil {
		switch *e.BusySession {
		case BusyReject, BusyEnqueue, BusyInterrupt, BusySignal:
			a.BusySession = *e.BusySession
		default:
			return nil, p.errorf(where, "busy_session %q: want reject, enqueue, interrupt or signal (leave it out to run messages side by side)", *e.BusySession)
		}
	}
	return a, nil
}

func parseRetry(e *retryEntry) (RetryPolicy, error) {
	var p RetryPolicy
	if e == nil {
		return p.WithDefaults(), nil
	}
	if isSet(e.MaxAttempts) {
		n, err := parseCountField("retry.max_attempts", e.MaxAttempts, 1, MaxRetryAttempts)
		if err != nil {
			return p, fmt.Errorf("%s (1 = no retry)", err)
		}
		p.MaxAttempts = int(n)
	}
	var err error
	if p.InitialBackoff, err = parseDurationField("retry.initial_backoff", e.InitialBackoff); err != nil {
		return p, err
	}
	if p.MaxBackoff, err = parseDurationField("retry.max_backoff", e.MaxBackoff); err != nil {
		return p, err
	}
	p = p.WithDefaults()
	if p.InitialBackoff > p.MaxBackoff {
		return p, fmt.Errorf("retry.initial_backoff %s is above retry.max_backoff %s", p.InitialBackoff, p.MaxBackoff)
	}
	return p, nil
}

// spec decodes and validates an EnvironmentSpec.
func (p *registryParser) spec(raw json.RawMessage) (*environmentv1.EnvironmentSpec, error) {
	if !jsonIsObject(raw) {
		return nil, errors.New("spec: want a mapping, such as {timeout: 60s}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // keep large integers exact
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("spec: %v", err) // unreachable: YAMLToJSON wrote it
	}
	spec := &environmentv1.EnvironmentSpec{}
	goDurationsToProto(spec.ProtoReflect().Descriptor(), tree)
	js, err := json.Marshal(tree)
	if err != nil {
		return nil, fmt.Errorf("spec: %v", err) // unreachable: decoded JSON
	}
	if err := protojson.Unmarshal(js, spec); err != nil {
		return nil, fmt.Errorf("spec: %s", protoErrorPrefix.ReplaceAllString(err.Error(), ""))
	}
	// protovalidate's process-wide validator (built once, on first use),
	// the one the server's chain checks requests with.
	if err := protovalidate.Validate(spec); err != nil {
		var verr *protovalidate.ValidationError
		if !errors.As(err, &verr) {
			return nil, fmt.Errorf("spec: %v", err)
		}
		msgs := make([]string, 0, len(verr.Violations))
		for _, v := range verr.Violations {
			path := "spec"
			if f := protovalidate.FieldPathString(v.Proto.GetField()); f != "" {
				path += "." + f
			}
			msgs = append(msgs, path+": "+v.Proto.GetMessage())
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	return spec, nil
}

// protoErrorPrefix matches the "proto: (line 1:2): " of protojson errors;
// the position is in the JSON converted from YAML, no help to a reader of
// the file. protojson varies the spaces, hence the character class.
var protoErrorPrefix = regexp.MustCompile(`^proto:[\s\x{00a0}]*(\(line \d+:\d+\):[\s\x{00a0}]*)?`)

// goDurationsToProto rewrites, in place, the strings of tree that fill a
// google.protobuf.Duration field of md and parse as Go durations ("2m",
// "1h30m") into the form protojson reads ("120s", "5400s"). Other values
// are left to protojson to judge.
func goDurationsToProto(md protoreflect.MessageDescriptor, tree any) {
	obj, ok := tree.(map[string]any)
	if !ok {
		return
	}
	for k, v := range obj {
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			fd = md.Fields().ByName(protoreflect.Name(k))
		}
		if fd == nil || fd.Message() == nil || fd.IsMap() {
			continue
		}
		sub := fd.Message()
		each := func(v any) any {
			switch {
			case sub.FullName() == "google.protobuf.Duration":
				return goDurationToProto(v)
			case sub.FullName().Parent() != "google.protobuf":
				goDurationsToProto(sub, v)
			}
			return v
		}
		if list, ok := v.([]any); ok && fd.IsList() {
			for i := range list {
				list[i] = each(list[i])
			}
			continue
		}
		obj[k] = each(v)
	}
}

func goDurationToProto(v any) any {
	s, ok := v.(string)
	if !ok {
		return v
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return v
	}
	js, err := protojson.Marshal(durationpb.New(d))
	if err != nil {
		return v
	}
	var out string
	if json.Unmarshal(js, &out) != nil {
		return v
	}
	return out
}

// parseMoneyField parses an amount of USD written as a string or a
// number: a non-negative decimal that fits Money.
func parseMoneyField(field string, raw json.RawMessage) (decimal.NullDecimal, error) {
	if !isSet(raw) {
		return decimal.NullDecimal{}, nil
	}
	bad := fmt.Errorf(`%s %s: want a non-negative amount of USD such as "0.25"`, field, raw)
	s := string(raw)
	if raw[0] == '"' {
		if json.Unmarshal(raw, &s) != nil {
			return decimal.NullDecimal{}, bad
		}
	} else if !isJSONNumber(raw) {
		return decimal.NullDecimal{}, bad
	}
	d, err := decimal.NewFromString(strings.TrimSpace(s))
	if err != nil {
		return decimal.NullDecimal{}, bad
	}
	if d.IsNegative() {
		return decimal.NullDecimal{}, fmt.Errorf("%s %s: must not be negative", field, raw)
	}
	// Through Money's own parser, so money.FromDecimal cannot fail later.
	d, err = money.Parse(&typesv1.Money{Amount: d.StringFixed(max(0, -d.Exponent()))})
	if err != nil {
		return decimal.NullDecimal{}, fmt.Errorf("%s %s: %v", field, raw, err)
	}
	return decimal.NewNullDecimal(d), nil
}

// parseDurationField parses a positive Go duration; absent is 0.
func parseDurationField(field string, raw json.RawMessage) (time.Duration, error) {
	if !isSet(raw) {
		return 0, nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return 0, fmt.Errorf(`%s %s: want a duration such as "90s" or "2m"`, field, raw)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf(`%s %s: want a duration such as "90s" or "2m"`, field, raw)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%s %s: must be positive", field, raw)
	}
	return d, nil
}

// parseCountField parses a whole number in [lo, hi].
func parseCountField(field string, raw json.RawMessage, lo, hi uint64) (uint64, error) {
	n, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s %s: want a whole number from %d to %d", field, raw, lo, hi)
	}
	return n, nil
}

func isJSONNumber(raw []byte) bool {
	return len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9')
}

// isSet reports whether a field was given a value (not absent, not null).
func isSet(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

func jsonIsObject(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

// decodeRegistryJSON decodes one JSON value into v, rejecting unknown
// fields, with messages in the file's terms.
func decodeRegistryJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return errors.New("unexpected data after the mapping") // unreachable: YAMLToJSON wrote it
		}
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		want := yamlTypeName(te.Type.String())
		if want == "a string" && (te.Value == "bool" || te.Value == "number") {
			// YAML reads yes, no, on, off, y, n as booleans.
			want += "; quote it"
		}
		return fmt.Errorf("%s: got %s, want %s", te.Field, withArticle(te.Value), want)
	}
	return errors.New(strings.TrimPrefix(err.Error(), "json: "))
}

func withArticle(noun string) string {
	if noun != "" && strings.ContainsRune("aeiou", rune(noun[0])) {
		return "an " + noun
	}
	return "a " + noun
}

func yamlTypeName(goType string) string {
	switch goType {
	case "string", "*string":
		return "a string"
	case "[]string":
		return "a list of strings"
	case "[]json.RawMessage":
		return "a list"
	case "orchestrator.retryEntry", "*orchestrator.retryEntry", "orchestrator.agentEntry":
		return "a mapping"
	}
	return goType
}

func (p *registryParser) errorf(where, format string, args ...any) error {
	prefix := p.name
	if where != "" {
		prefix += ": " + where
	}
	return fmt.Errorf("%s: %s: %w", prefix, fmt.Sprintf(format, args...), errs.InvalidArgument)
}
