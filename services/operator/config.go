package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
)

// Defaults.
const (
	DefaultMaxTurns       = 25
	DefaultMaxDuration    = 10 * time.Minute
	DefaultCircuitBreaker = 5
	DefaultHistoryEntries = 100
	DefaultSystemPrompt   = "You are a helpful agent. Use the tools you are given when they help; answer plainly when you are done."
)

// Validate reports invocation defaults that cannot work (New's check of
// SystemPrompt to HistoryEntries; the other fields are Run's).
func (c Config) Validate() error {
	var problems []error
	if c.MaxTurns == 0 {
		problems = append(problems, errors.New("max turns must be at least 1"))
	}
	if c.MaxDuration <= 0 {
		problems = append(problems, errors.New("max duration must be positive"))
	}
	if c.MaxCost.IsNegative() {
		problems = append(problems, errors.New("max cost must not be negative"))
	}
	if c.MaxTokens < 0 || c.CircuitBreaker < 0 || c.HistoryEntries < 0 {
		problems = append(problems, errors.New("max tokens, circuit breaker and history entries must not be negative"))
	}
	if p := c.Models.ContextPressure; p < 0 || p > 100 || p != p {
		problems = append(problems, errors.New("context pressure must be a percent from 0 (never) to 100"))
	}
	return errors.Join(problems...)
}

// limits is the effective configuration of one invocation.
type limits struct {
	model       string
	system      string
	maxTurns    uint32
	maxDuration time.Duration
	maxCost     decimal.Decimal
	costBounded bool
	allowed     []string
	restrict    bool
	// The model parameters of the invocation (zero: the defaults).
	maxTokens    int
	temperature  *float64
	effort       string
	outputSchema map[string]any
	// history is whether a named session's history is read and written
	// (OperatorConfig.session_history; unset: on).
	history bool
	// strategy is OperatorConfig.context_strategy (UNSPECIFIED: the
	// deployment's --compaction).
	strategy operatorv1.ContextStrategy
	// approvals is OperatorConfig.tool_approvals: which tool calls wait
	// for a person (empty: none).
	approvals map[string]operatorv1.ToolApproval
}

// MaxInstructionsBytes bounds OperatorConfig.instructions (and the
// addendum), in bytes.
const MaxInstructionsBytes = 64 << 10

// efforts maps the contract's reasoning effort to the providers' level.
var efforts = map[operatorv1.ReasoningEffort]string{
	operatorv1.ReasoningEffort_REASONING_EFFORT_MINIMAL: provider.EffortMinimal,
	operatorv1.ReasoningEffort_REASONING_EFFORT_LOW:     provider.EffortLow,
	operatorv1.ReasoningEffort_REASONING_EFFORT_MEDIUM:  provider.EffortMedium,
	operatorv1.ReasoningEffort_REASONING_EFFORT_HIGH:    provider.EffortHigh,
}

// resolve merges an input's overrides into the defaults.
func (c Config) resolve(in *operatorv1.OperatorConfig) (limits, error) {
	l := limits{
		model:       c.Model,
		system:      c.SystemPrompt,
		maxTurns:    c.MaxTurns,
		maxDuration: c.MaxDuration,
		maxCost:     c.MaxCost,
		costBounded: c.MaxCost.IsPositive(),
		maxTokens:   c.MaxTokens,
		history:     true,
	}
	if in == nil {
		return l, nil
	}
	if in.MaxTurns != nil {
		l.maxTurns = in.GetMaxTurns()
	}
	if in.MaxCost != nil {
		d, err := money.Parse(in.GetMaxCost())
		if err != nil {
			return l, fmt.Errorf("config.max_cost: %w", err)
		}
		l.maxCost, l.costBounded = d, true
	}
	if in.MaxDuration != nil {
		if err := in.GetMaxDuration().CheckValid(); err != nil {
			return l, fmt.Errorf("config.max_duration: %v: %w", err, errs.InvalidArgument)
		}
		l.maxDuration = in.GetMaxDuration().AsDuration()
	}
	if in.Model != nil {
		l.model = in.GetModel()
	}
	if in.AllowedTools != nil {
		l.allowed = in.GetAllowedTools().GetNames()
		l.restrict = true
	}
	if in.Instructions != nil {
		// The agent's own prompt replaces the process default; the
		// addendum below still appends to it.
		if len(in.GetInstructions()) > MaxInstructionsBytes {
			return l, fmt.Errorf("config.instructions is %d bytes; the limit is %d: %w", len(in.GetInstructions()), MaxInstructionsBytes, errs.InvalidArgument)
		}
		if strings.TrimSpace(in.GetInstructions()) == "" {
			return l, fmt.Errorf("config.instructions is blank; omit it to use the operator's default prompt: %w", errs.InvalidArgument)
		}
		l.system = in.GetInstructions()
	}
	if in.SessionHistory != nil {
		l.history = in.GetSessionHistory()
	}
	// Checked here too: the one-shot path and embedders call Execute
	// without the gRPC validator.
	if cs := in.GetContextStrategy(); operatorv1.ContextStrategy_name[int32(cs)] == "" {
		return l, fmt.Errorf("config.context_strategy %d is not a known strategy; use COMPACT, TRUNCATE, NONE or leave it unset for the operator's default: %w", int32(cs), errs.InvalidArgument)
	}
	l.strategy = in.GetContextStrategy()
	if err := checkApprovals(in.GetToolApprovals()); err != nil {
		return l, err
	}
	l.approvals = in.GetToolApprovals()
	if err := l.modelParams(in.GetModelParameters()); err != nil {
		return l, err
	}
	if in.SystemAddendum != nil && in.GetSystemAddendum() != "" {
		if l.system != "" {
			l.system += "\n\n"
		}
		l.system += in.GetSystemAddendum()
	}
	return l, nil
}

// modelParams applies the invocation's model parameters. The contract's
// ranges are checked here too (the one-shot path and embedders call
// Execute without the gRPC validator); whether the provider supports each
// one is the provider's to say, when it builds its request.
func (l *limits) modelParams(mp *operatorv1.ModelParameters) error {
	if mp == nil {
		return nil
	}
	if mp.Temperature != nil {
		t := mp.GetTemperature()
		if math.IsNaN(t) || t < 0 || t > 2 {
			return fmt.Errorf("config.model_parameters.temperature %g is outside 0 to 2: %w", t, errs.InvalidArgument)
		}
		l.temperature = &t
	}
	if mp.MaxOutputTokens != nil {
		n := mp.GetMaxOutputTokens()
		if n == 0 || n > 1_000_000 {
			return fmt.Errorf("config.model_parameters.max_output_tokens %d is outside 1 to 1000000: %w", n, errs.InvalidArgument)
		}
		l.maxTokens = int(n)
	}
	if e := mp.GetReasoningEffort(); e != operatorv1.ReasoningEffort_REASONING_EFFORT_UNSPECIFIED {
		level, ok := efforts[e]
		if !ok {
			return fmt.Errorf("config.model_parameters.reasoning_effort %d is not a known level: %w", int32(e), errs.InvalidArgument)
		}
		l.effort = level
	}
	if s := mp.GetOutputSchema(); s != nil {
		schema := s.AsMap()
		raw, err := json.Marshal(schema)
		if err != nil {
			return fmt.Errorf("config.model_parameters.output_schema cannot be encoded as JSON: %v: %w", err, errs.InvalidArgument)
		}
		// Compiled by the same JSON Schema implementation as the tools'
		// schemas, so a schema that cannot compile fails here, before any
		// model call, rather than at the provider.
		if err := tool.NewRegistry().Register(schemaProbe{schema: raw}); err != nil {
			return fmt.Errorf("config.model_parameters.output_schema is not a usable JSON Schema object (it must compile and have \"type\": \"object\" at its top): %w", err)
		}
		l.outputSchema = schema
	}
	return nil
}

// schemaProbe is a tool that exists only to have its schema compiled.
type schemaProbe struct{ schema json.RawMessage }

func (p schemaProbe) Spec() tool.Spec {
	return tool.Spec{Name: "output_schema", Description: "output schema", Schema: p.schema, Tier: tool.ReadOnly}
}

func (schemaProbe) Call(context.Context, json.RawMessage) (string, error) { return "", nil }
