package catalog

import (
	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/services/operator/provider"
)

// PriceFor returns the price that applies to a call with usage u: the
// LongContext price when the model has one and the call's input, cache
// read and cache write tokens together exceed its threshold, else Price.
func (m Model) PriceFor(u provider.Usage) Price {
	if lc := m.LongContext; lc != nil && u.InputTokens+u.CacheReadTokens+u.CacheWriteTokens > lc.AboveInputTokens {
		return lc.Price
	}
	return m.Price
}

// Cost is the price of a call in USD, exactly:
//
//	(input*Input + output*Output + cacheRead*CacheRead + cacheWrite*CacheWrite) / 1e6
//
// with the tier PriceFor picks. It is never rounded; round when
// displaying.
//
// Usage.InputTokens must be the input tokens billed at the full input
// price, that is without the cache read and cache write tokens, as
// Anthropic reports them. Providers whose API counts cached tokens inside
// the prompt total (OpenAI's prompt_tokens, Gemini's promptTokenCount)
// must subtract them when they fill Usage, or cached tokens are charged
// twice.
func (m Model) Cost(u provider.Usage) decimal.Decimal {
	p := m.PriceFor(u)
	sum := decimal.NewFromUint64(u.InputTokens).Mul(p.Input).
		Add(decimal.NewFromUint64(u.OutputTokens).Mul(p.Output)).
		Add(decimal.NewFromUint64(u.CacheReadTokens).Mul(p.CacheRead)).
		Add(decimal.NewFromUint64(u.CacheWriteTokens).Mul(p.CacheWrite))
	// Shift divides by 10^6 exactly, where Div would round.
	return sum.Shift(-6)
}

// Free reports whether every price of the model is zero: the scripted
// model, local models.
func (m Model) Free() bool {
	zero := func(p Price) bool {
		return p.Input.IsZero() && p.Output.IsZero() && p.CacheRead.IsZero() && p.CacheWrite.IsZero()
	}
	return zero(m.Price) && (m.LongContext == nil || zero(m.LongContext.Price))
}
