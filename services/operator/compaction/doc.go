// Package compaction holds the operator's context strategies: what part
// of a conversation the ReAct loop sends to the model when the whole of it
// would not fit the model's context window.
//
// The loop calls Strategy.Compact before each model call with the whole
// message list (the session's history, then this invocation's turns), the
// system prompt, the tool specs and a Budget. Three strategies exist,
// named for a flag and chosen with Parse:
//
//   - None ("none") sends everything, always.
//   - SlidingWindow ("sliding") drops the oldest messages.
//   - Summarize ("summarize") replaces the oldest messages by a summary
//     that a model writes, and falls back to the sliding window when the
//     summary call fails.
//
// # Budget and estimate
//
// Sizes are Estimate's: a deterministic count of about four bytes of text
// per token, over the system prompt, tool schemas, text, tool inputs and
// tool results, plus a fixed cost per message and per image. A list fits
// when Estimate(system, tools, msgs) <= ContextWindow - Reserve; Reserve
// is the room for the model's output and a margin for the estimate's
// error. A ContextWindow of 0 means unknown, and then nothing is ever
// compacted.
//
// # Rules every strategy keeps
//
//   - A cut happens only before a genuine user message (a user message
//     with some content other than tool results), and never between a
//     tool call and its result: the kept tail starts with a user message,
//     and every tool call in it has its result in it, and every result
//     its call.
//   - The last genuine user message and everything after it (the current
//     invocation's turns) are always kept, even when they alone exceed
//     the budget. The strategy then returns that minimal list with
//     Report.OverBudget set, and the provider rejects the call if it truly
//     is too big. When there is no cut point at all (only the current
//     invocation), nothing changes and the Report is nil.
//   - msgs is never modified. When nothing changes, Compact returns msgs
//     itself and a nil Report.
//
// # In the loop
//
// Before each model call:
//
//	out, rep, err := strategy.Compact(ctx, system, tools, messages, budget)
//	if err != nil { ... } // only Summarize, only when ctx ended
//	if rep != nil {
//		messages = out // keep it: a prefix is then summarized once
//		usage, cost = usage.Add(rep.Usage), cost.Add(rep.Cost)
//		// log or emit rep; rep.Err says why a summary fell back
//	}
//
// Compaction only shapes what is sent; the turns the invocation adds to
// the session's history are unaffected.
//
// # Around the strategy (in the operator)
//
// The operator publishes ContextPressure when the context passes
// --context-pressure percent of the budget, PreCompactionFlush just
// before a strategy other than None compacts a context over its budget,
// and CompactionComplete after. A Summarize summary of a session's
// oldest turns is persisted as the session's memory (the operator's
// summary.go: keys "summary/<epoch>~<writer>" and
// "summary-covers/<epoch>~<writer>"), and the session's next invocation
// starts from it: the summary message is then the first of msgs, and a
// later compaction folds it into the next summary (rolling).
package compaction
