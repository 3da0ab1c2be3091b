package compaction

import (
	"context"
	"slices"

	"github.com/secbear/neuron/services/operator/provider"
)

// SlidingWindow returns the strategy that drops the oldest messages until
// the estimate fits: when Estimate(system, tools, msgs) exceeds
// ContextWindow-Reserve, it keeps the longest tail msgs[k:] that fits,
// where k is a cut point: msgs[k] is a genuine user message (a user
// message with some content other than tool results) and no tool call in
// the tail lacks its result or the other way round. When no such tail
// fits it keeps the shortest one, the tail starting at the last cut point
// (the current invocation's turns), and sets Report.OverBudget: the
// provider will reject the call if it truly is too big. When there is no
// cut point at all, nothing changes. It never fails.
func SlidingWindow() Strategy { return sliding{} }

type sliding struct{}

func (sliding) Name() string { return NameSliding }

func (sliding) Compact(_ context.Context, system string, tools []provider.ToolSpec, msgs []provider.Message, b Budget) ([]provider.Message, *Report, error) {
	out, rep := slide(system, tools, msgs, b)
	return out, rep, nil
}

// overBudget returns the estimator, the input's estimate and the cut
// points when msgs exceed the budget and can be cut; ok is false when
// nothing is to be done.
func overBudget(system string, tools []provider.ToolSpec, msgs []provider.Message, b Budget) (e *estimator, before, limit int, cuts []int, ok bool) {
	limit, known := b.limit()
	if !known {
		return nil, 0, 0, nil, false
	}
	e = newEstimator(system, tools, msgs)
	before = e.tail(0)
	if before <= limit {
		return nil, 0, 0, nil, false
	}
	cuts = cutPoints(msgs)
	if len(cuts) == 0 {
		return nil, 0, 0, nil, false
	}
	return e, before, limit, cuts, true
}

func slide(system string, tools []provider.ToolSpec, msgs []provider.Message, b Budget) ([]provider.Message, *Report) {
	e, before, limit, cuts, ok := overBudget(system, tools, msgs, b)
	if !ok {
		return msgs, nil
	}
	k := cuts[len(cuts)-1]
	for _, c := range cuts {
		if e.tail(c) <= limit {
			k = c
			break
		}
	}
	return slideReport(e, msgs, k, before, limit)
}

func slideReport(e *estimator, msgs []provider.Message, k, before, limit int) ([]provider.Message, *Report) {
	out := slices.Clone(msgs[k:])
	after := e.tail(k)
	return out, &Report{
		Strategy:       NameSliding,
		TokensBefore:   before,
		TokensAfter:    after,
		MessagesBefore: len(msgs),
		MessagesAfter:  len(out),
		Dropped:        k,
		OverBudget:     after > limit,
	}
}
