package compaction

import "github.com/secbear/neuron/services/operator/provider"

// The constants of Estimate.
const (
	// BytesPerToken is how many bytes of UTF-8 text count as one token.
	BytesPerToken = 4
	// MessageTokens is added for each message (role and framing).
	MessageTokens = 4
	// ImageTokens is the fixed cost of one image, inline or by URL: about
	// what the large vendors charge for a picture of a megapixel or so.
	ImageTokens = 1600
)

// Estimate is a deterministic, model-independent estimate of the tokens a
// model call takes: the UTF-8 bytes of the system prompt, of each tool's
// name, description and input schema, and of each message part (text; a
// tool call's id, name and raw input; a tool result's id and content),
// divided by BytesPerToken and rounded up; plus MessageTokens per message
// and ImageTokens per image.
//
// It is an approximation: it tends to overestimate English prose and
// code a little and to underestimate CJK text. Budget.Reserve absorbs the
// difference.
func Estimate(system string, tools []provider.ToolSpec, msgs []provider.Message) int {
	bytes, fixed := baseBytes(system, tools), 0
	for _, m := range msgs {
		b, f := messageCost(m)
		bytes += b
		fixed += f
	}
	return tokens(bytes, fixed)
}

func tokens(bytes, fixed int) int {
	return (bytes+BytesPerToken-1)/BytesPerToken + fixed
}

func baseBytes(system string, tools []provider.ToolSpec) int {
	n := len(system)
	for _, t := range tools {
		n += len(t.Name) + len(t.Description) + len(t.InputSchema)
	}
	return n
}

// messageCost is a message's bytes and its fixed tokens.
func messageCost(m provider.Message) (bytes, fixed int) {
	fixed = MessageTokens
	for _, p := range m.Parts {
		switch {
		case p.ToolUse != nil:
			bytes += len(p.ToolUse.ID) + len(p.ToolUse.Name) + len(p.ToolUse.Input)
		case p.ToolResult != nil:
			bytes += len(p.ToolResult.ToolUseID) + len(p.ToolResult.Content)
		case p.Image != nil:
			fixed += ImageTokens
		default:
			bytes += len(p.Text)
		}
	}
	return bytes, fixed
}

// estimator gives Estimate of every suffix msgs[i:] in constant time.
type estimator struct {
	base  int
	bytes []int // bytes[i]: bytes of msgs[i:]
	fixed []int
}

func newEstimator(system string, tools []provider.ToolSpec, msgs []provider.Message) *estimator {
	e := &estimator{base: baseBytes(system, tools), bytes: make([]int, len(msgs)+1), fixed: make([]int, len(msgs)+1)}
	for i := len(msgs) - 1; i >= 0; i-- {
		b, f := messageCost(msgs[i])
		e.bytes[i] = e.bytes[i+1] + b
		e.fixed[i] = e.fixed[i+1] + f
	}
	return e
}

// tail is Estimate(system, tools, msgs[i:]).
func (e *estimator) tail(i int) int { return tokens(e.base+e.bytes[i], e.fixed[i]) }
