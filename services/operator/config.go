package operator

import (
	"errors"
	"fmt"
	"time"

	"github.com/shopspring/decimal"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
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
	if in.SystemAddendum != nil && in.GetSystemAddendum() != "" {
		if l.system != "" {
			l.system += "\n\n"
		}
		l.system += in.GetSystemAddendum()
	}
	return l, nil
}
