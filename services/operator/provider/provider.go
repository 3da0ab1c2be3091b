package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/pkg/errs"
)

// Role is who said a message.
type Role int

const (
	// User is the person, or the operator feeding back tool results.
	User Role = iota + 1
	// Assistant is the model.
	Assistant
)

func (r Role) String() string {
	switch r {
	case User:
		return "user"
	case Assistant:
		return "assistant"
	}
	return "unknown"
}

// Message is one turn of the conversation.
type Message struct {
	Role  Role
	Parts []Part
}

// Part is one piece of a message. Exactly one field is set.
type Part struct {
	Text       string
	ToolUse    *ToolUse
	ToolResult *ToolResult
	Image      *Image
}

// IsText reports whether the part is plain text.
func (p Part) IsText() bool { return p.ToolUse == nil && p.ToolResult == nil && p.Image == nil }

// ToolUse is the model asking for a tool call.
type ToolUse struct {
	// ID is the model's id for the call; the result refers to it.
	ID   string
	Name string
	// Input is the raw JSON the model produced. It may be malformed: the
	// tool registry validates it, the provider never fixes it up.
	Input json.RawMessage
}

// ToolResult is a tool's answer, fed back to the model.
type ToolResult struct {
	ToolUseID string
	Content   string
	IsError   bool
}

// Image is an image given to the model, inline or by URL.
type Image struct {
	Data      []byte
	URL       string
	MediaType string
}

// ToolSpec describes a tool to the model.
type ToolSpec struct {
	Name        string
	Description string
	// InputSchema is a JSON Schema object.
	InputSchema json.RawMessage
}

// Request is one model call.
type Request struct {
	// Model is a catalog name; empty means the provider's default.
	Model    string
	System   string
	Messages []Message
	Tools    []ToolSpec
	// MaxTokens caps the response; 0 means the provider's default.
	MaxTokens int
	// Metadata is the invocation's opaque passthrough (trace ids, routing);
	// providers may forward what their API accepts and ignore the rest.
	// It is shared by the calls of an invocation: read it, never change it.
	Metadata map[string]any
	// SessionID is the invocation's session, empty when stateless. A
	// provider with server-side conversation state (OpenAI Responses'
	// previous_response_id) may use it to chain calls; others ignore it.
	SessionID string
	// Temperature, when set, is the sampling temperature (0 to 2; each
	// provider refuses values outside its own range with an error of kind
	// errs.InvalidArgument naming the parameter and itself).
	Temperature *float64
	// ReasoningEffort is how much a reasoning model thinks: one of the
	// Effort constants; empty means the provider's default. A provider
	// that has no such level refuses it (errs.InvalidArgument).
	ReasoningEffort string
	// OutputSchema, when set, is a JSON Schema object the final answer
	// must conform to (structured output), mapped by each provider onto
	// its own field. It is shared by the calls of an invocation: read it,
	// never change it.
	OutputSchema map[string]any
	// OnText, when set, receives text as the model produces it. A
	// provider that cannot stream calls it once with the whole text.
	OnText func(text string)
}

// The levels of Request.ReasoningEffort.
const (
	EffortMinimal = "minimal"
	EffortLow     = "low"
	EffortMedium  = "medium"
	EffortHigh    = "high"
)

// ParamError is the error a provider returns for a model parameter it
// cannot honour: kind errs.InvalidArgument, a message naming the
// parameter and the provider, never retried.
func ParamError(providerName, model, param, why string) error {
	return &Error{Provider: providerName, Model: model, Kind: errs.InvalidArgument,
		Message: fmt.Sprintf("model parameter %s: %s (provider %s)", param, why, providerName)}
}

// StopReason is why the model stopped producing output.
type StopReason int

const (
	// StopEndTurn is a final answer.
	StopEndTurn StopReason = iota + 1
	// StopToolUse means the response asks for tool calls.
	StopToolUse
	// StopMaxTokens means the output was cut at the token limit.
	StopMaxTokens
	// StopContentFilter means the provider refused or filtered the output.
	StopContentFilter
)

func (s StopReason) String() string {
	switch s {
	case StopEndTurn:
		return "end_turn"
	case StopToolUse:
		return "tool_use"
	case StopMaxTokens:
		return "max_tokens"
	case StopContentFilter:
		return "content_filter"
	}
	return "unknown"
}

// Usage is what one call consumed, as the provider reported it.
type Usage struct {
	InputTokens      uint64
	OutputTokens     uint64
	CacheReadTokens  uint64
	CacheWriteTokens uint64
}

// Add returns the sum of two usages.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		InputTokens:      u.InputTokens + v.InputTokens,
		OutputTokens:     u.OutputTokens + v.OutputTokens,
		CacheReadTokens:  u.CacheReadTokens + v.CacheReadTokens,
		CacheWriteTokens: u.CacheWriteTokens + v.CacheWriteTokens,
	}
}

// Response is the model's answer to one call.
type Response struct {
	Parts []Part
	Stop  StopReason
	Usage Usage
	// Model is the model that actually answered (after any fallback).
	Model string
	// Cost of this call in USD, computed by the provider from its price
	// list; zero when the model is free or unpriced.
	Cost decimal.Decimal
}

// ToolUses returns the response's tool calls in order.
func (r *Response) ToolUses() []*ToolUse {
	var out []*ToolUse
	for _, p := range r.Parts {
		if p.ToolUse != nil {
			out = append(out, p.ToolUse)
		}
	}
	return out
}

// Text returns the response's text parts joined.
func (r *Response) Text() string {
	var s string
	for _, p := range r.Parts {
		if p.IsText() {
			s += p.Text
		}
	}
	return s
}

// Provider is a language model.
type Provider interface {
	// Name identifies the provider in output metadata and logs, e.g.
	// "anthropic"; the built-in deterministic model is "scripted".
	Name() string
	// Complete runs one model call.
	Complete(ctx context.Context, req *Request) (*Response, error)
}

// UsageFromTotals builds a Usage from counts where the prompt total
// includes the tokens read from and written to the prompt cache (the way
// OpenAI reports them): InputTokens is what remains, never below zero, so
// each token is priced once. Negative counts are zero.
func UsageFromTotals(prompt, cacheRead, cacheWrite, output int64) Usage {
	count := func(n int64) uint64 { return uint64(max(n, 0)) }
	read, written, total := count(cacheRead), count(cacheWrite), count(prompt)
	var input uint64
	if total > read+written {
		input = total - read - written
	}
	return Usage{InputTokens: input, OutputTokens: count(output), CacheReadTokens: read, CacheWriteTokens: written}
}

// InMemoryBodies wraps an HTTP transport (nil means
// http.DefaultTransport) so that a request whose body can be re-read
// (Request.GetBody set) is sent with a fresh copy from GetBody. Go's
// HTTP/1 client writes the headers and an in-memory body (a
// *bytes.Reader, *bytes.Buffer or *strings.Reader, possibly in
// io.NopCloser) in one write, but flushes the headers on their own before
// any other body. The model SDKs wrap their in-memory bodies in readers of
// their own and set GetBody, so without this every model call costs a
// second write syscall: about 5% of a call's CPU against a local server.
func InMemoryBodies(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return inMemoryBodies{next}
}

type inMemoryBodies struct{ next http.RoundTripper }

func (t inMemoryBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.GetBody == nil || r.Body == nil || r.Body == http.NoBody {
		return t.next.RoundTrip(r)
	}
	body, err := r.GetBody()
	if err != nil {
		return t.next.RoundTrip(r)
	}
	// A RoundTripper must close the body it was given, and must not
	// change the request: the copy gets the fresh body.
	_ = r.Body.Close()
	c := *r
	c.Body = body
	return t.next.RoundTrip(&c)
}

// WithInMemoryBodies is c (nil means a plain &http.Client{}) with its
// transport wrapped by InMemoryBodies.
func WithInMemoryBodies(c *http.Client) *http.Client {
	if c == nil {
		c = &http.Client{}
	}
	cc := *c
	cc.Transport = InMemoryBodies(c.Transport)
	return &cc
}
