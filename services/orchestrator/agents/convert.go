package agents

import (
	"fmt"
	"maps"
	"slices"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/services/orchestrator"
)

// The tools an operator has built in, and its effect tools
// (services/operator/tool/builtin and .../effect): the names a
// definition's tools.builtin and tools.effects may hold.
var (
	builtinTools = []string{"read", "write", "edit", "bash"}
	effectTools  = []string{"write_memory", "delete_memory", "delegate", "handoff", "signal"}
)

// ToAgent maps a stored definition onto what the engines dispatch:
//
//   - route: the operator address, or the environment address and spec;
//   - model.name and the first of model.fallbacks: the model and the
//     cheaper model the budget policy may switch to;
//   - limits: max_turns, max_cost, max_duration per invocation, and
//     workflow_budget;
//   - tools: builtin, effects and operator_tools together are the
//     invocation's allowed tools (unset tools: the operator's default);
//   - instructions, system_addendum, memory.searchable_history, metadata,
//     retry;
//   - model's temperature, max_output_tokens, reasoning_effort and
//     output_schema: OperatorConfig.model_parameters; tools.mcp_servers:
//     OperatorConfig.mcp_servers (MCPServer);
//   - memory.session_history and context_strategy:
//     OperatorConfig.session_history and context_strategy (the same
//     strategies by name);
//   - delegation.allowed_agents: the allowlist the workflow enforces;
//   - tool_approvals: OperatorConfig.tool_approvals (ALWAYS and NEVER
//     alike, ASK as UNLESS_READ_ONLY), which the operator enforces.
//
// memory.readable_scopes is stored and returned, not yet enforced:
// nothing reads memory by scope until the recall tools do.
func ToAgent(a *agentv1.Agent) (*orchestrator.Agent, error) {
	d := a.GetDefinition()
	out := &orchestrator.Agent{ID: a.GetName(), Revision: a.GetRevision(), Description: d.GetDescription(), Labels: d.GetLabels()}
	switch r := d.GetRoute().GetTarget().(type) {
	case *agentv1.Route_Operator:
		out.Operator = r.Operator.GetAddress()
	case *agentv1.Route_Environment:
		out.Environment, out.Spec = r.Environment.GetAddress(), r.Environment.GetSpec()
	default:
		return nil, fmt.Errorf("route: want an operator or an environment address")
	}
	def := &out.Defaults
	def.Model = d.GetModel().GetName()
	if fb := d.GetModel().GetFallbacks(); len(fb) > 0 {
		def.DowngradeModel = fb[0]
	}
	var err error
	l := d.GetLimits()
	if def.Budget, err = nullMoney("limits.workflow_budget", l.GetWorkflowBudget()); err != nil {
		return nil, err
	}
	if def.MaxCost, err = nullMoney("limits.max_cost", l.GetMaxCost()); err != nil {
		return nil, err
	}
	def.MaxTurns = l.GetMaxTurns()
	def.MaxDuration = l.GetMaxDuration().AsDuration()
	if t := d.GetTools(); t != nil {
		def.AllowedTools = slices.Concat([]string{}, t.GetBuiltin(), t.GetEffects(), t.GetOperatorTools())
	}
	def.Instructions = d.GetInstructions()
	def.ModelParameters = ModelParameters(d.GetModel())
	for _, s := range d.GetTools().GetMcpServers() {
		def.MCPServers = append(def.MCPServers, MCPServer(s))
	}
	def.SystemAddendum = d.GetSystemAddendum()
	def.SearchableHistory = d.GetMemory().GetSearchableHistory()
	if m := d.GetMemory(); m != nil && m.SessionHistory != nil {
		def.SessionHistory = proto.Bool(m.GetSessionHistory())
	}
	def.MemoryScopes = slices.Clone(d.GetMemory().GetReadableScopes())
	def.ContextStrategy = ContextStrategy(d.GetContextStrategy())
	for tool, p := range d.GetToolApprovals() {
		if def.ToolApprovals == nil {
			def.ToolApprovals = map[string]operatorv1.ToolApproval{}
		}
		def.ToolApprovals[tool] = ToolApproval(p)
	}
	if md := d.GetMetadata(); len(md.GetFields()) > 0 {
		def.Metadata = md
	}
	if r := d.GetRetry(); r != nil {
		out.Retry = orchestrator.RetryPolicy{MaxAttempts: int(r.GetMaxAttempts()), InitialBackoff: r.GetInitialBackoff().AsDuration(), MaxBackoff: r.GetMaxBackoff().AsDuration()}
	}
	out.Retry = out.Retry.WithDefaults()
	if dl := d.GetDelegation(); dl != nil {
		out.Restricted, out.AllowedAgents = true, append([]string{}, dl.GetAllowedAgents()...)
	}
	out.BusySession = busySessions[d.GetBusySession()]
	return out, nil
}

// ModelParameters is the OperatorConfig.model_parameters of m; nil when
// it sets none.
func ModelParameters(m *agentv1.ModelSettings) *operatorv1.ModelParameters {
	if m == nil || m.Temperature == nil && m.MaxOutputTokens == nil && m.GetReasoningEffort() == agentv1.ReasoningEffort_REASONING_EFFORT_UNSPECIFIED && m.GetOutputSchema() == nil {
		return nil
	}
	p := &operatorv1.ModelParameters{Temperature: m.Temperature, MaxOutputTokens: m.MaxOutputTokens, OutputSchema: m.GetOutputSchema()}
	// The same efforts by name (the operator's enum also has MINIMAL).
	p.ReasoningEffort = operatorv1.ReasoningEffort(operatorv1.ReasoningEffort_value[m.GetReasoningEffort().String()])
	return p
}

// ToolApproval is the OperatorConfig.tool_approvals value of an
// approval policy: ASK waits for calls of tools that are not read-only.
func ToolApproval(p agentv1.ApprovalPolicy) operatorv1.ToolApproval {
	switch p {
	case agentv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS:
		return operatorv1.ToolApproval_TOOL_APPROVAL_ALWAYS
	case agentv1.ApprovalPolicy_APPROVAL_POLICY_ASK:
		return operatorv1.ToolApproval_TOOL_APPROVAL_UNLESS_READ_ONLY
	case agentv1.ApprovalPolicy_APPROVAL_POLICY_NEVER:
		return operatorv1.ToolApproval_TOOL_APPROVAL_NEVER
	}
	return operatorv1.ToolApproval_TOOL_APPROVAL_UNSPECIFIED
}

// ContextStrategy is the OperatorConfig.context_strategy of an agent's
// context strategy: the same strategy by name (a value neither knows is
// UNSPECIFIED, the operator's default).
func ContextStrategy(cs agentv1.ContextStrategy) operatorv1.ContextStrategy {
	return operatorv1.ContextStrategy(operatorv1.ContextStrategy_value[cs.String()])
}

// MCPServer is the OperatorConfig.mcp_servers entry of s.
func MCPServer(s *agentv1.McpServer) *operatorv1.McpServer {
	out := &operatorv1.McpServer{Name: s.GetName()}
	switch t := s.GetTransport().(type) {
	case *agentv1.McpServer_Stdio:
		out.Transport = &operatorv1.McpServer_Stdio{Stdio: &operatorv1.McpStdio{Command: t.Stdio.GetCommand(), Args: t.Stdio.GetArgs()}}
	case *agentv1.McpServer_Http:
		out.Transport = &operatorv1.McpServer_Http{Http: &operatorv1.McpHttp{Url: t.Http.GetUrl(), CredentialRef: t.Http.GetCredentialRef()}}
	}
	return out
}

func nullMoney(field string, m *typesv1.Money) (decimal.NullDecimal, error) {
	if m == nil {
		return decimal.NullDecimal{}, nil
	}
	d, err := money.Parse(m)
	if err != nil {
		return decimal.NullDecimal{}, fmt.Errorf("%s: %v", field, err)
	}
	return decimal.NewNullDecimal(d), nil
}

// FromAgent is the definition of an agent of a YAML registry (the
// import): every field the file can set, allowed tools split into
// built-in, effect and operator tools by name.
func FromAgent(a *orchestrator.Agent) *agentv1.Agent {
	d := &agentv1.AgentDefinition{Description: a.Description, Instructions: a.Defaults.Instructions, SystemAddendum: a.Defaults.SystemAddendum}
	if len(a.Labels) > 0 {
		d.Labels = maps.Clone(a.Labels)
	}
	if a.Environment != "" {
		d.Route = &agentv1.Route{Target: &agentv1.Route_Environment{Environment: &agentv1.EnvironmentRoute{Address: a.Environment, Spec: a.Spec}}}
	} else {
		d.Route = &agentv1.Route{Target: &agentv1.Route_Operator{Operator: &agentv1.OperatorRoute{Address: a.Operator}}}
	}
	def := a.Defaults
	if def.Model != "" || def.DowngradeModel != "" {
		d.Model = &agentv1.ModelSettings{Name: def.Model}
		if def.DowngradeModel != "" {
			d.Model.Fallbacks = []string{def.DowngradeModel}
		}
	}
	if def.Budget.Valid || def.MaxCost.Valid || def.MaxTurns > 0 || def.MaxDuration > 0 {
		l := &agentv1.Limits{}
		if def.Budget.Valid {
			l.WorkflowBudget = money.FromDecimal(def.Budget.Decimal)
		}
		if def.MaxCost.Valid {
			l.MaxCost = money.FromDecimal(def.MaxCost.Decimal)
		}
		if def.MaxTurns > 0 {
			l.MaxTurns = proto.Uint32(def.MaxTurns)
		}
		if def.MaxDuration > 0 {
			l.MaxDuration = durationpb.New(def.MaxDuration)
		}
		d.Limits = l
	}
	if def.AllowedTools != nil {
		t := &agentv1.Tools{}
		for _, n := range def.AllowedTools {
			switch {
			case slices.Contains(builtinTools, n):
				t.Builtin = appendOnce(t.Builtin, n)
			case slices.Contains(effectTools, n):
				t.Effects = appendOnce(t.Effects, n)
			default:
				t.OperatorTools = appendOnce(t.OperatorTools, n)
			}
		}
		d.Tools = t
	}
	if def.SearchableHistory || def.SessionHistory != nil || len(def.MemoryScopes) > 0 {
		d.Memory = &agentv1.MemorySettings{SearchableHistory: def.SearchableHistory, ReadableScopes: slices.Clone(def.MemoryScopes)}
		if def.SessionHistory != nil {
			d.Memory.SessionHistory = proto.Bool(*def.SessionHistory)
		}
	}
	d.ContextStrategy = agentv1.ContextStrategy(agentv1.ContextStrategy_value[def.ContextStrategy.String()])
	for tool, a := range def.ToolApprovals {
		if d.ToolApprovals == nil {
			d.ToolApprovals = map[string]agentv1.ApprovalPolicy{}
		}
		switch a {
		case operatorv1.ToolApproval_TOOL_APPROVAL_ALWAYS:
			d.ToolApprovals[tool] = agentv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS
		case operatorv1.ToolApproval_TOOL_APPROVAL_UNLESS_READ_ONLY:
			d.ToolApprovals[tool] = agentv1.ApprovalPolicy_APPROVAL_POLICY_ASK
		default:
			d.ToolApprovals[tool] = agentv1.ApprovalPolicy_APPROVAL_POLICY_NEVER
		}
	}
	if len(def.Metadata.GetFields()) > 0 {
		d.Metadata = proto.CloneOf(def.Metadata)
	}
	for p, name := range busySessions {
		if name != "" && name == a.BusySession {
			d.BusySession = p
		}
	}
	r := a.Retry.WithDefaults()
	if r != (orchestrator.RetryPolicy{}).WithDefaults() {
		d.Retry = &agentv1.RetryPolicy{MaxAttempts: uint32(r.MaxAttempts), InitialBackoff: durationpb.New(r.InitialBackoff), MaxBackoff: durationpb.New(r.MaxBackoff)}
	}
	if a.Restricted {
		d.Delegation = &agentv1.Delegation{AllowedAgents: append([]string{}, a.AllowedAgents...)}
	}
	return &agentv1.Agent{Name: a.ID, Definition: d}
}

func appendOnce(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// busySessions are the Agent.BusySession names of the definition's
// policies.
var busySessions = map[agentv1.BusySessionPolicy]string{
	agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_UNSPECIFIED: "",
	agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_REJECT:      orchestrator.BusyReject,
	agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_ENQUEUE:     orchestrator.BusyEnqueue,
	agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_INTERRUPT:   orchestrator.BusyInterrupt,
	agentv1.BusySessionPolicy_BUSY_SESSION_POLICY_SIGNAL:      orchestrator.BusySignal,
}
