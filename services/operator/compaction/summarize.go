package compaction

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// SummaryHeader starts the text of a summary message.
const SummaryHeader = "[Summary of the earlier conversation]"

// Defaults of the SummarizeOptions.
const (
	DefaultMaxSummaryTokens = 1024
	DefaultKeepRecent       = 2
)

// minTranscriptTokens is the least room given to the transcript of a
// summary request, however small the window.
const minTranscriptTokens = 512

// SummarizeOption configures Summarize.
type SummarizeOption func(*summarizeOptions)

type summarizeOptions struct {
	maxSummaryTokens int
	keepRecent       int
	log              *slog.Logger
}

// WithMaxSummaryTokens caps the summary's length: it is the summary
// request's MaxTokens, and the room Summarize plans for the summary.
// Default DefaultMaxSummaryTokens; n < 1 keeps the default.
func WithMaxSummaryTokens(n int) SummarizeOption {
	return func(o *summarizeOptions) {
		if n > 0 {
			o.maxSummaryTokens = n
		}
	}
}

// WithKeepRecent sets how many of the latest turns (a genuine user message
// and what follows it) are kept verbatim when summarizing. Default
// DefaultKeepRecent; n < 1 keeps the default. Fewer are kept when they
// would not fit with the summary, but never fewer than one.
func WithKeepRecent(n int) SummarizeOption {
	return func(o *summarizeOptions) {
		if n > 0 {
			o.keepRecent = n
		}
	}
}

// WithLogger sets where the warning of a fallback goes. Default: nowhere
// (Report.Err still says why).
func WithLogger(l *slog.Logger) SummarizeOption {
	return func(o *summarizeOptions) {
		if l != nil {
			o.log = l
		}
	}
}

// Summarize returns the strategy that replaces the oldest messages by one
// summary that model, called through p, writes. p must not be nil.
//
// When Estimate(system, tools, msgs) exceeds ContextWindow-Reserve, it
// keeps the latest turns verbatim (WithKeepRecent; fewer when they would
// not fit with a summary of WithMaxSummaryTokens, at least the last one:
// the current invocation's turns) and sends the older prefix msgs[:k] to
// the model as a plain-text transcript (roles, text, tool calls and
// results abbreviated; when the transcript alone would overflow the
// window, entries in its middle are left out and counted), asking for a
// summary of facts, decisions, open tasks and file names. The result is
//
//	[{User, "[Summary of the earlier conversation]\n<summary>"}] + msgs[k:]
//
// The summary is a message of its own rather than merged into the first
// kept message, so that no user message is altered: providers that need
// alternating roles merge the two consecutive user messages. A summary
// message is itself a genuine user message, so a later compaction of a
// list that holds one summarizes the summary again (rolling summary).
// Callers should therefore keep out as their message list, so that the
// prefix is summarized once, not before every model call.
//
// Race safety: Compact keeps no state and reads only its arguments. The
// summary covers exactly the snapshot msgs[:k] of the list it was given,
// and out ends with msgs[k:] of that same list, so no turn is summarized
// away or lost. A caller that compacts in the background while appending
// turns must splice: out followed by current[Report.MessagesBefore:].
//
// When the summary call fails (or returns no text, or is stopped by a
// content filter) while ctx is live, Compact falls back to the sliding
// window: it returns SlidingWindow's result with Report.Strategy
// FallbackName, Report.Err set, and logs a warning. A summary cut at
// MaxTokens is used as it is. When ctx ends, Compact returns an error
// wrapping ctx.Err() and no messages.
func Summarize(p provider.Provider, model string, opts ...SummarizeOption) Strategy {
	if p == nil {
		panic("compaction.Summarize: nil provider")
	}
	o := summarizeOptions{
		maxSummaryTokens: DefaultMaxSummaryTokens,
		keepRecent:       DefaultKeepRecent,
		log:              slog.New(slog.DiscardHandler),
	}
	for _, opt := range opts {
		opt(&o)
	}
	return &summarizer{p: p, model: model, o: o}
}

type summarizer struct {
	p     provider.Provider
	model string
	o     summarizeOptions
}

func (s *summarizer) Name() string { return NameSummarize }

func (s *summarizer) Compact(ctx context.Context, system string, tools []provider.ToolSpec, msgs []provider.Message, b Budget) ([]provider.Message, *Report, error) {
	e, before, limit, cuts, ok := overBudget(system, tools, msgs, b)
	if !ok {
		return msgs, nil, nil
	}
	k := s.cut(e, cuts, limit)
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("summarizing the %d oldest messages: %w", k, err)
	}
	resp, err := s.p.Complete(ctx, s.request(msgs[:k], b))
	if cerr := ctx.Err(); cerr != nil {
		return nil, nil, fmt.Errorf("summarizing the %d oldest messages: %w", k, cerr)
	}
	var summary string
	if err == nil {
		summary, err = s.check(resp)
	}
	if err != nil {
		out, rep := slide(system, tools, msgs, b)
		rep.Strategy = FallbackName
		rep.Err = err
		s.account(rep, resp)
		s.o.log.Warn("context summary failed; dropped the oldest messages instead",
			"model", s.model, "err", err, "dropped", rep.Dropped, "tokens_before", rep.TokensBefore, "tokens_after", rep.TokensAfter)
		return out, rep, nil
	}
	out := make([]provider.Message, 0, 1+len(msgs)-k)
	out = append(out, SummaryMessage(summary))
	out = append(out, msgs[k:]...)
	after := Estimate(system, tools, out)
	rep := &Report{
		Strategy:       NameSummarize,
		TokensBefore:   before,
		TokensAfter:    after,
		MessagesBefore: len(msgs),
		MessagesAfter:  len(out),
		Summarized:     k,
		OverBudget:     after > limit,
	}
	s.account(rep, resp)
	return out, rep, nil
}

// cut picks the cut point: the one keeping keepRecent turns, or fewer
// when those and a summary of the maximum length would not fit.
func (s *summarizer) cut(e *estimator, cuts []int, limit int) int {
	room := Estimate("", nil, []provider.Message{SummaryMessage("")}) + s.o.maxSummaryTokens
	for keep := min(s.o.keepRecent, len(cuts)); keep > 1; keep-- {
		if k := cuts[len(cuts)-keep]; e.tail(k)+room <= limit {
			return k
		}
	}
	return cuts[len(cuts)-1]
}

// check returns the summary of a response, or why it is unusable.
func (s *summarizer) check(resp *provider.Response) (string, error) {
	fail := func(msg string) error {
		return &provider.Error{Provider: s.p.Name(), Model: s.model, Kind: errs.NonRetryable, Message: msg}
	}
	switch {
	case resp == nil:
		return "", fail("no response to the summary request")
	case resp.Stop == provider.StopContentFilter:
		return "", fail("the summary was stopped by the provider's content filter")
	}
	summary := strings.TrimSpace(resp.Text())
	if summary == "" {
		return "", fail("the model returned an empty summary")
	}
	return summary, nil
}

// account records the summary call's model, usage and cost.
func (s *summarizer) account(rep *Report, resp *provider.Response) {
	if resp == nil {
		return
	}
	rep.Model = resp.Model
	if rep.Model == "" {
		rep.Model = s.model
	}
	rep.Usage = resp.Usage
	rep.Cost = resp.Cost
}

// request is the summary request for the prefix.
func (s *summarizer) request(prefix []provider.Message, b Budget) *provider.Request {
	sys := fmt.Sprintf(instruction, s.o.maxSummaryTokens*3/4)
	overhead := Estimate(sys, nil, []provider.Message{{Role: provider.User, Parts: []provider.Part{{Text: transcriptOpen + transcriptClose}}}})
	room := max(b.ContextWindow-max(b.Reserve, s.o.maxSummaryTokens)-overhead, minTranscriptTokens)
	return &provider.Request{
		Model:  s.model,
		System: sys,
		Messages: []provider.Message{{Role: provider.User, Parts: []provider.Part{
			{Text: transcriptOpen + transcript(prefix, room*BytesPerToken) + transcriptClose},
		}}},
		MaxTokens: s.o.maxSummaryTokens,
	}
}

// SummaryMessage is the user message holding a summary: SummaryHeader, a
// newline, and the summary.
func SummaryMessage(summary string) provider.Message {
	return provider.Message{Role: provider.User, Parts: []provider.Part{{Text: SummaryHeader + "\n" + summary}}}
}

// IsSummary reports whether m is a summary message made by Summarize.
func IsSummary(m provider.Message) bool {
	return m.Role == provider.User && len(m.Parts) == 1 && m.Parts[0].IsText() &&
		strings.HasPrefix(m.Parts[0].Text, SummaryHeader+"\n")
}

const instruction = `You summarize the earlier part of a conversation between a user and an AI assistant that uses tools, so that the assistant can continue the work without the full transcript. The transcript may start with a summary of an even earlier part: fold it in.

Write a concise summary that keeps:
- facts learned, including results of tool calls that still matter;
- decisions made, and why;
- open tasks, questions and promises not yet fulfilled;
- file names, paths, identifiers, URLs and commands mentioned.

Use short bullet points under those headings. Do not invent anything that is not in the transcript. Do not address the user and do not continue the conversation: output only the summary, in under about %d words.`

const (
	transcriptOpen  = "Summarize this transcript of the earlier conversation.\n\n<transcript>\n"
	transcriptClose = "\n</transcript>"
)
