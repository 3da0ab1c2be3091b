package compaction

import (
	"context"
	"fmt"
	"strings"

	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// The strategies' names, as Parse accepts them and Strategy.Name returns
// them.
const (
	NameNone      = "none"
	NameSliding   = "sliding"
	NameSummarize = "summarize"
)

// FallbackName is Report.Strategy when Summarize could not get a summary
// and fell back to the sliding window.
const FallbackName = NameSummarize + "(fallback: " + NameSliding + ")"

// Names lists the strategy names Parse accepts.
func Names() []string { return []string{NameNone, NameSliding, NameSummarize} }

// Budget is the room the messages may take in one model call.
type Budget struct {
	// ContextWindow is the model's context window in tokens. Zero (or
	// less) means unknown: no strategy ever compacts.
	ContextWindow int
	// Reserve is the number of tokens kept free for the model's output and
	// as a safety margin for the estimate's error. The system prompt and
	// the tool schemas are part of Estimate, so they need no reserve.
	Reserve int
}

// limit is the largest Estimate that fits, and false when the window is
// unknown.
func (b Budget) limit() (int, bool) {
	if b.ContextWindow <= 0 {
		return 0, false
	}
	return b.ContextWindow - b.Reserve, true
}

// Fits reports whether msgs fit b as the strategies judge it: ok is
// true when Estimate(system, tools, msgs), returned as estimate, is at
// most limit, ContextWindow-Reserve, or when the window is unknown (limit
// is then 0). It is the check of a caller that removes nothing and must
// refuse what does not fit (the operator's context strategy NONE).
func Fits(system string, tools []provider.ToolSpec, msgs []provider.Message, b Budget) (estimate, limit int, ok bool) {
	limit, known := b.limit()
	if !known {
		return 0, 0, true
	}
	estimate = Estimate(system, tools, msgs)
	return estimate, limit, estimate <= limit
}

// Report describes one compaction. Token counts are Estimate's.
type Report struct {
	// Strategy is the strategy that produced the result: NameSliding,
	// NameSummarize, or FallbackName.
	Strategy string
	// TokensBefore and TokensAfter are Estimate(system, tools, msgs) of
	// the input and of the output.
	TokensBefore, TokensAfter int
	// MessagesBefore is len(msgs) of the input, MessagesAfter len(out).
	MessagesBefore, MessagesAfter int
	// Summarized is the number of input messages replaced by the summary,
	// 0 unless Strategy is NameSummarize.
	Summarized int
	// Dropped is the number of input messages removed without a summary
	// (sliding window, and the fallback).
	Dropped int
	// OverBudget is true when even the output does not fit the budget:
	// the last genuine user message and what follows it are always kept,
	// and the model call may then be rejected by the provider.
	OverBudget bool

	// Model, Usage and Cost describe the summary call, when one returned
	// a response (also on a fallback caused by an unusable response). The
	// loop adds Usage and Cost to the invocation's totals. Cost is what
	// the provider reported (non-zero only behind a priced wrapper).
	Model string
	Usage provider.Usage
	Cost  decimal.Decimal
	// Err is why Summarize fell back to the sliding window, nil otherwise.
	// It is the provider's error (normally a *provider.Error) or a
	// *provider.Error for an unusable response.
	Err error
}

// Strategy decides what part of a conversation is sent to the model. The
// loop calls Compact before each model call with the whole message list:
// the history of previous invocations followed by this invocation's turns.
//
// Implementations are stateless and safe for concurrent use.
type Strategy interface {
	// Name is the strategy's name, as Parse accepts it.
	Name() string
	// Compact returns the messages to send. It never modifies msgs, its
	// messages or their parts; out is a new slice whose messages share
	// their Parts with msgs (neither may be modified afterwards). When
	// nothing changed, out is msgs itself and report is nil. err is
	// non-nil only when ctx ended during a summary call.
	Compact(ctx context.Context, system string, tools []provider.ToolSpec, msgs []provider.Message, b Budget) (out []provider.Message, report *Report, err error)
}

// Parse returns the strategy named by a flag value: "none" (or ""),
// "sliding" or "summarize". Summarize needs p, the provider to call, and
// model, the model to ask; the others ignore p, model and opts. An unknown
// name is an error wrapping errs.InvalidArgument that lists the names.
func Parse(name string, p provider.Provider, model string, opts ...SummarizeOption) (Strategy, error) {
	switch name {
	case NameNone, "":
		return None(), nil
	case NameSliding:
		return SlidingWindow(), nil
	case NameSummarize:
		if p == nil {
			return nil, fmt.Errorf("context strategy %q needs a model to write summaries, and none is configured: %w", name, errs.InvalidArgument)
		}
		return Summarize(p, model, opts...), nil
	}
	return nil, fmt.Errorf("unknown context strategy %q: use one of %s: %w", name, strings.Join(Names(), ", "), errs.InvalidArgument)
}

// None returns the strategy that sends every message, always.
func None() Strategy { return none{} }

type none struct{}

func (none) Name() string { return NameNone }

func (none) Compact(_ context.Context, _ string, _ []provider.ToolSpec, msgs []provider.Message, _ Budget) ([]provider.Message, *Report, error) {
	return msgs, nil, nil
}
