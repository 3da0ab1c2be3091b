package gemini

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/genai"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// assembler builds one Response from a generateContent response or from
// the chunks of a stream.
type assembler struct {
	model   string
	idBase  int // tool calls already in the conversation
	onText  func(string)
	parts   []provider.Part
	text    strings.Builder // text since the last tool call
	calls   int
	answer  bool // a candidate was seen
	reason  genai.FinishReason
	message string // the candidate's finish message
	blocked genai.BlockedReason
	usage   *genai.GenerateContentResponseUsageMetadata
}

func newAssembler(model string, idBase int, onText func(string)) *assembler {
	return &assembler{model: model, idBase: idBase, onText: onText}
}

// add takes in one response or stream chunk. Within a stream, each chunk's
// usage is the running total so far: the last one wins.
func (a *assembler) add(r *genai.GenerateContentResponse) {
	if r == nil {
		return
	}
	if r.ModelVersion != "" {
		a.model = r.ModelVersion
	}
	if r.UsageMetadata != nil {
		a.usage = r.UsageMetadata
	}
	if f := r.PromptFeedback; f != nil && f.BlockReason != "" && f.BlockReason != genai.BlockedReasonUnspecified {
		a.blocked = f.BlockReason
	}
	if len(r.Candidates) == 0 || r.Candidates[0] == nil {
		return
	}
	c := r.Candidates[0]
	a.answer = true
	if c.Content != nil {
		for _, p := range c.Content.Parts {
			switch {
			case p == nil:
			case p.FunctionCall != nil:
				a.flushText()
				a.parts = append(a.parts, provider.Part{ToolUse: a.toolUse(p.FunctionCall)})
			case p.Thought:
				// Reasoning summaries are not part of the answer.
			case p.Text != "":
				a.text.WriteString(p.Text)
				if a.onText != nil {
					a.onText(p.Text)
				}
			}
		}
	}
	if c.FinishReason != "" {
		a.reason = c.FinishReason
		a.message = c.FinishMessage
	}
}

func (a *assembler) toolUse(fc *genai.FunctionCall) *provider.ToolUse {
	id := fc.ID
	if id == "" {
		id = GeneratedIDPrefix + strconv.Itoa(a.idBase+a.calls)
	}
	a.calls++
	input := json.RawMessage("{}")
	if len(fc.Args) > 0 {
		if b, err := json.Marshal(fc.Args); err == nil {
			input = b
		}
	}
	return &provider.ToolUse{ID: id, Name: fc.Name, Input: input}
}

func (a *assembler) flushText() {
	if a.text.Len() > 0 {
		a.parts = append(a.parts, provider.Part{Text: a.text.String()})
		a.text.Reset()
	}
}

// complete reports whether the model finished: a finish or block reason
// was seen.
func (a *assembler) complete() bool { return a.reason != "" || a.blocked != "" }

// finish returns the response, or the error of a response that is not an
// answer. fail builds the errors.
func (a *assembler) finish(streamed bool, fail func(*errs.Kind, string) error) (*provider.Response, error) {
	a.flushText()
	resp := &provider.Response{Parts: a.parts, Model: a.model, Usage: usage(a.usage)}
	if a.blocked != "" {
		resp.Stop = provider.StopContentFilter
		return resp, nil
	}
	if streamed && !a.complete() {
		return nil, fail(errs.Retryable, "the stream ended before the model finished (no finish reason)")
	}
	if !a.answer {
		return nil, fail(errs.NonRetryable, "malformed response: no candidates and no block reason")
	}
	switch a.reason {
	case genai.FinishReasonMaxTokens, genai.FinishReasonContinuation:
		resp.Stop = provider.StopMaxTokens
	case genai.FinishReasonSafety, genai.FinishReasonRecitation, genai.FinishReasonBlocklist,
		genai.FinishReasonProhibitedContent, genai.FinishReasonSPII, genai.FinishReasonLanguage,
		genai.FinishReasonImageSafety, genai.FinishReasonImageProhibitedContent,
		genai.FinishReasonImageRecitation:
		resp.Stop = provider.StopContentFilter
	case genai.FinishReasonMalformedFunctionCall, genai.FinishReasonUnexpectedToolCall:
		msg := fmt.Sprintf("the model produced an invalid function call (%s)", a.reason)
		if a.message != "" {
			msg += ": " + a.message
		}
		return nil, fail(errs.Retryable, msg)
	default: // STOP, OTHER, and reasons this package does not know
		resp.Stop = provider.StopEndTurn
		if a.calls > 0 {
			resp.Stop = provider.StopToolUse
		}
	}
	return resp, nil
}

// usage maps Gemini's counts: the prompt count includes cached tokens and
// the candidates count excludes thinking tokens.
func usage(u *genai.GenerateContentResponseUsageMetadata) provider.Usage {
	if u == nil {
		return provider.Usage{}
	}
	count := func(n int32) uint64 { return uint64(max(n, 0)) }
	prompt := count(u.PromptTokenCount) + count(u.ToolUsePromptTokenCount)
	cached := min(count(u.CachedContentTokenCount), prompt)
	return provider.Usage{
		InputTokens:     prompt - cached,
		OutputTokens:    count(u.CandidatesTokenCount) + count(u.ThoughtsTokenCount),
		CacheReadTokens: cached,
	}
}
