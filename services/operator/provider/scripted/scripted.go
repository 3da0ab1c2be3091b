package scripted

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// Name is the provider's name and the model name of every response.
const Name = provider.ScriptedName

// MetadataKey is the Request.Metadata key of a per-request script.
const MetadataKey = "scripted"

// ResultPreviewChars is how much of a tool result the /tool rule quotes.
const ResultPreviewChars = 200

// Provider is the scripted model. It keeps no state between calls and is
// safe for concurrent use.
type Provider struct {
	script *Script
}

// Option configures a Provider.
type Option func(*Provider)

// WithScript sets the default script; nil means the rules.
func WithScript(s *Script) Option { return func(p *Provider) { p.script = s } }

// New returns a scripted model.
func New(opts ...Option) *Provider {
	p := &Provider{}
	for _, o := range opts {
		o(p)
	}
	return p
}

var _ provider.Provider = (*Provider)(nil)

// Name implements provider.Provider; it is always "scripted".
func (p *Provider) Name() string { return Name }

// reply is what one call answers, before it becomes a Response.
type reply struct {
	text  string
	calls []ToolCall
	stop  provider.StopReason
	usage *provider.Usage
	cost  decimal.Decimal
	delay time.Duration
	turn  int // for tool-use ids
}

// Complete implements provider.Provider. It fails only when ctx is done
// (with ctx's error) or the request is unusable (errs.InvalidArgument).
func (p *Provider) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	if req == nil {
		return nil, fmt.Errorf("scripted model: nil request: %w", errs.InvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("scripted model: %w", err)
	}
	script, err := scriptFromMetadata(req.Metadata)
	if err != nil {
		return nil, err
	}
	if script == nil {
		script = p.script
	}
	var r reply
	if script != nil {
		r = play(script, req.Messages)
	} else {
		r = rules(req.Messages)
	}
	if r.delay > 0 {
		t := time.NewTimer(r.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("scripted model: during a %s delay: %w", r.delay, ctx.Err())
		}
	}
	resp := &provider.Response{Model: Name, Cost: r.cost}
	if r.text != "" {
		resp.Parts = append(resp.Parts, provider.Part{Text: r.text})
		if req.OnText != nil {
			for _, c := range Chunks(r.text) {
				req.OnText(c)
			}
		}
	}
	for i, c := range r.calls {
		in := bytes.Clone(c.Input)
		if len(in) == 0 {
			in = json.RawMessage("{}")
		}
		resp.Parts = append(resp.Parts, provider.Part{ToolUse: &provider.ToolUse{
			ID: ToolUseID(r.turn, i), Name: c.Name, Input: in,
		}})
	}
	resp.Stop = r.stop
	if resp.Stop == 0 {
		resp.Stop = provider.StopEndTurn
		if len(r.calls) > 0 {
			resp.Stop = provider.StopToolUse
		}
	}
	if r.usage != nil {
		resp.Usage = *r.usage
	} else {
		resp.Usage = provider.Usage{
			InputTokens:  tokens(requestChars(req)),
			OutputTokens: tokens(replyChars(resp)),
		}
	}
	return resp, nil
}

// ToolUseID is the id of the index-th tool call of turn turn, both from 0.
func ToolUseID(turn, index int) string { return fmt.Sprintf("call_%d_%d", turn, index) }

// TurnIndex is the turn a call with these messages plays: the number of
// assistant messages after the last genuine user message (one with some
// content other than tool results).
func TurnIndex(msgs []provider.Message) int {
	n := 0
	for i := len(msgs) - 1; i >= 0; i-- {
		switch {
		case msgs[i].Role == provider.Assistant:
			n++
		case genuineUser(msgs[i]):
			return n
		}
	}
	return n
}

func genuineUser(m provider.Message) bool {
	if m.Role != provider.User {
		return false
	}
	for _, p := range m.Parts {
		if p.ToolResult == nil {
			return true
		}
	}
	return false
}

func play(s *Script, msgs []provider.Message) reply {
	turns := s.Turns
	if len(s.Cases) > 0 {
		matched := false
		text := lastUserText(msgs)
		for _, c := range s.Cases {
			if strings.Contains(text, c.Contains) {
				turns, matched = c.Turns, true
				break
			}
		}
		if !matched && len(turns) == 0 {
			return reply{text: noCase, stop: provider.StopEndTurn}
		}
	}
	n := TurnIndex(msgs)
	if n >= len(turns) {
		return reply{text: exhausted(len(turns)), stop: provider.StopEndTurn}
	}
	t := turns[n]
	return reply{text: t.Text, calls: t.ToolCalls, stop: t.Stop, usage: t.Usage, cost: t.Cost, delay: t.Delay, turn: n}
}

// noCase is the reply when no case matches and the script has no
// top-level turns.
const noCase = "[scripted model: no case of the script matches the last user message]"

func exhausted(n int) string {
	if n == 1 {
		return "[scripted model: script exhausted after 1 turn]"
	}
	return fmt.Sprintf("[scripted model: script exhausted after %d turns]", n)
}

func scriptFromMetadata(md map[string]any) (*Script, error) {
	v, ok := md[MetadataKey]
	if !ok || v == nil {
		return nil, nil
	}
	var data []byte
	switch x := v.(type) {
	case string:
		data = []byte(x)
	case []byte:
		data = x
	case json.RawMessage:
		data = x
	case map[string]any:
		b, err := json.Marshal(x)
		if err != nil {
			return nil, fmt.Errorf("scripted model: metadata %q: %v: %w", MetadataKey, err, errs.InvalidArgument)
		}
		data = b
	case proto.Message:
		b, err := protojson.Marshal(x)
		if err != nil {
			return nil, fmt.Errorf("scripted model: metadata %q: %v: %w", MetadataKey, err, errs.InvalidArgument)
		}
		data = b
	default:
		return nil, fmt.Errorf("scripted model: metadata %q is a %T; want a JSON object or a string holding one: %w",
			MetadataKey, v, errs.InvalidArgument)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("scripted model: metadata %q: %w", MetadataKey, err)
	}
	return s, nil
}

// rules answers without a script; see the package documentation.
func rules(msgs []provider.Message) reply {
	text := lastUserText(msgs)
	if name, args, ok := toolCommand(text); ok {
		if name == "" {
			return reply{text: "[scripted model] usage: /tool <name> <json-args>"}
		}
		if TurnIndex(msgs) == 0 {
			return reply{calls: []ToolCall{{Name: name, Input: json.RawMessage(args)}}}
		}
		if res := lastToolResult(msgs); res != nil {
			verb := "returned"
			if res.IsError {
				verb = "failed"
			}
			return reply{text: fmt.Sprintf("[scripted model] %s %s: %s", name, verb, preview(res.Content))}
		}
	}
	return reply{text: "[scripted model] You said: " + text}
}

// toolCommand parses "/tool <name> <json-args>".
func toolCommand(text string) (name, args string, ok bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(text), "/tool")
	if !ok {
		return "", "", false
	}
	if r, _ := utf8.DecodeRuneInString(rest); rest != "" && !unicode.IsSpace(r) {
		return "", "", false // "/toolbox ..." is not the command
	}
	rest = strings.TrimSpace(rest)
	name = rest
	if i := strings.IndexFunc(rest, unicode.IsSpace); i >= 0 {
		name, args = rest[:i], rest[i:]
	}
	return name, strings.TrimSpace(args), true
}

func lastUserText(msgs []provider.Message) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if !genuineUser(msgs[i]) {
			continue
		}
		var texts []string
		for _, p := range msgs[i].Parts {
			if p.IsText() && p.Text != "" {
				texts = append(texts, p.Text)
			}
		}
		return strings.Join(texts, "\n")
	}
	return ""
}

func lastToolResult(msgs []provider.Message) *provider.ToolResult {
	for i := len(msgs) - 1; i >= 0; i-- {
		if genuineUser(msgs[i]) {
			return nil
		}
		parts := msgs[i].Parts
		for j := len(parts) - 1; j >= 0; j-- {
			if parts[j].ToolResult != nil {
				return parts[j].ToolResult
			}
		}
	}
	return nil
}

func preview(s string) string {
	if utf8.RuneCountInString(s) <= ResultPreviewChars {
		return s
	}
	n := 0
	for i := range s {
		if n == ResultPreviewChars {
			return s[:i] + "…"
		}
		n++
	}
	return s
}

// Chunks splits text into words, each with the whitespace that follows
// it (leading whitespace is a chunk of its own). The chunks concatenate to
// text; the empty text has none.
func Chunks(text string) []string {
	var out []string
	start, inSpace := 0, false
	for i, r := range text {
		if unicode.IsSpace(r) {
			inSpace = true
			continue
		}
		if inSpace {
			out = append(out, text[start:i])
			start, inSpace = i, false
		}
	}
	if start < len(text) {
		out = append(out, text[start:])
	}
	return out
}

// tokens estimates tokens from characters: a quarter, rounded up, at
// least 1.
func tokens(chars int) uint64 {
	return uint64(max(1, (chars+3)/4))
}

func requestChars(req *provider.Request) int {
	n := utf8.RuneCountInString(req.System)
	for _, m := range req.Messages {
		for _, p := range m.Parts {
			n += partChars(p)
		}
	}
	for _, t := range req.Tools {
		n += utf8.RuneCountInString(t.Name) + utf8.RuneCountInString(t.Description) + utf8.RuneCount(t.InputSchema)
	}
	return n
}

func replyChars(r *provider.Response) int {
	n := 0
	for _, p := range r.Parts {
		n += partChars(p)
	}
	return n
}

func partChars(p provider.Part) int {
	switch {
	case p.ToolUse != nil:
		return utf8.RuneCountInString(p.ToolUse.Name) + utf8.RuneCount(p.ToolUse.Input)
	case p.ToolResult != nil:
		return utf8.RuneCountInString(p.ToolResult.Content)
	case p.Image != nil:
		return 0
	}
	return utf8.RuneCountInString(p.Text)
}
