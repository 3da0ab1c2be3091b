package scripted

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/shopspring/decimal"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/services/operator/provider"
)

// Script is a sequence of assistant turns, played in order, with
// optional cases that replace the turns for some user messages. Build it
// with Parse, or in Go; a Go-built script is not checked.
type Script struct {
	Turns []Turn
	// Cases are tried in order against the text of the last genuine user
	// message; the first whose Contains it contains plays its Turns
	// instead of Script.Turns.
	Cases []Case
}

// Case is a list of turns played when the last genuine user message
// contains Contains (case-sensitive; an empty Contains, which Parse
// rejects, matches every message).
type Case struct {
	Contains string
	Turns    []Turn
}

// Turn is one assistant response.
type Turn struct {
	Text      string
	ToolCalls []ToolCall
	// Stop overrides the stop reason; zero means StopToolUse when there are
	// tool calls, else StopEndTurn.
	Stop provider.StopReason
	// Usage is reported as is; nil means estimated.
	Usage *provider.Usage
	// Cost is the call's cost in USD.
	Cost decimal.Decimal
	// Delay is waited before answering, or until the context ends.
	Delay time.Duration
}

// ToolCall is one tool call of a turn.
type ToolCall struct {
	Name string
	// Input is given to the loop verbatim, valid JSON or not; empty means
	// {}.
	Input json.RawMessage
}

// MaxScriptBytes bounds a script's JSON.
const MaxScriptBytes = 4 << 20

type wireScript struct {
	Turns []json.RawMessage `json:"turns"`
	Cases []json.RawMessage `json:"cases"`
}

type wireCase struct {
	Contains string            `json:"contains"`
	Turns    []json.RawMessage `json:"turns"`
}

type wireTurn struct {
	Text      string            `json:"text"`
	ToolCalls []json.RawMessage `json:"tool_calls"`
	Stop      string            `json:"stop"`
	Usage     *wireUsage        `json:"usage"`
	Cost      json.RawMessage   `json:"cost"`
	Delay     string            `json:"delay"`
}

type wireUsage struct {
	InputTokens      uint64 `json:"input_tokens"`
	OutputTokens     uint64 `json:"output_tokens"`
	CacheReadTokens  uint64 `json:"cache_read_tokens"`
	CacheWriteTokens uint64 `json:"cache_write_tokens"`
}

type wireToolCall struct {
	Name         string          `json:"name"`
	Arguments    json.RawMessage `json:"arguments"`
	RawArguments *string         `json:"raw_arguments"`
}

var stopNames = map[string]provider.StopReason{
	"end_turn":       provider.StopEndTurn,
	"tool_use":       provider.StopToolUse,
	"max_tokens":     provider.StopMaxTokens,
	"content_filter": provider.StopContentFilter,
}

// Parse reads a script in the JSON format of the package documentation.
// Errors wrap errs.InvalidArgument and name the faulty place, e.g.
// "script: turns[2].tool_calls[0]: name is required".
func Parse(data []byte) (*Script, error) {
	if len(data) > MaxScriptBytes {
		return nil, invalid("", "%d bytes, at most %d", len(data), MaxScriptBytes)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, invalid("", `want a JSON object like {"turns":[{"text":"hello"}]}`)
	}
	var ws wireScript
	if err := decodeStrict(trimmed, &ws); err != nil {
		return nil, invalid("", "%v", err)
	}
	if len(ws.Turns) == 0 && len(ws.Cases) == 0 {
		return nil, invalid("", `no turns: want {"turns":[...]} with at least one turn, or "cases"`)
	}
	turns, err := parseTurns(ws.Turns, "turns")
	if err != nil {
		return nil, err
	}
	s := &Script{Turns: turns}
	for i, raw := range ws.Cases {
		c, err := parseCase(raw, fmt.Sprintf("cases[%d]", i))
		if err != nil {
			return nil, err
		}
		s.Cases = append(s.Cases, c)
	}
	return s, nil
}

func parseTurns(raws []json.RawMessage, where string) ([]Turn, error) {
	var turns []Turn
	for i, raw := range raws {
		t, err := parseTurn(raw, fmt.Sprintf("%s[%d]", where, i))
		if err != nil {
			return nil, err
		}
		turns = append(turns, t)
	}
	return turns, nil
}

func parseCase(raw json.RawMessage, where string) (Case, error) {
	if !isObject(raw) {
		return Case{}, invalid(where, `a case is a JSON object like {"contains":"results","turns":[{"text":"done"}]}`)
	}
	var wc wireCase
	if err := decodeStrict(raw, &wc); err != nil {
		return Case{}, invalid(where, "%v", err)
	}
	if wc.Contains == "" {
		return Case{}, invalid(where, "contains is required")
	}
	if len(wc.Turns) == 0 {
		return Case{}, invalid(where, "no turns: a case needs at least one turn")
	}
	turns, err := parseTurns(wc.Turns, where+".turns")
	if err != nil {
		return Case{}, err
	}
	return Case{Contains: wc.Contains, Turns: turns}, nil
}

// ParseFile reads and parses the script file at path.
func ParseFile(path string) (*Script, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("script file: %w", err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("script file %s: %w", path, err)
	}
	return s, nil
}

func parseTurn(raw json.RawMessage, where string) (Turn, error) {
	if !isObject(raw) {
		return Turn{}, invalid(where, "a turn is a JSON object")
	}
	var wt wireTurn
	if err := decodeStrict(raw, &wt); err != nil {
		return Turn{}, invalid(where, "%v", err)
	}
	t := Turn{Text: wt.Text}
	if wt.Stop != "" {
		st, ok := stopNames[wt.Stop]
		if !ok {
			return Turn{}, invalid(where, `stop %q: want "end_turn", "tool_use", "max_tokens" or "content_filter"`, wt.Stop)
		}
		t.Stop = st
	}
	if u := wt.Usage; u != nil {
		t.Usage = &provider.Usage{
			InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
			CacheReadTokens: u.CacheReadTokens, CacheWriteTokens: u.CacheWriteTokens,
		}
	}
	if len(wt.Cost) > 0 && string(wt.Cost) != "null" {
		amount := string(wt.Cost)
		if wt.Cost[0] == '"' {
			if err := json.Unmarshal(wt.Cost, &amount); err != nil {
				return Turn{}, invalid(where, "cost: %v", err)
			}
		}
		d, err := money.Parse(&typesv1.Money{Amount: amount})
		if err != nil {
			return Turn{}, invalid(where, "cost %s: want a decimal string of USD such as \"0.0125\"", wt.Cost)
		}
		t.Cost = d
	}
	if wt.Delay != "" {
		d, err := time.ParseDuration(wt.Delay)
		if err != nil || d < 0 {
			return Turn{}, invalid(where, "delay %q: want a duration such as \"250ms\" or \"2s\"", wt.Delay)
		}
		t.Delay = d
	}
	for j, raw := range wt.ToolCalls {
		tc, err := parseToolCall(raw, fmt.Sprintf("%s.tool_calls[%d]", where, j))
		if err != nil {
			return Turn{}, err
		}
		t.ToolCalls = append(t.ToolCalls, tc)
	}
	return t, nil
}

func parseToolCall(raw json.RawMessage, where string) (ToolCall, error) {
	if !isObject(raw) {
		return ToolCall{}, invalid(where, `a tool call is a JSON object like {"name":"read","arguments":{}}`)
	}
	var wc wireToolCall
	if err := decodeStrict(raw, &wc); err != nil {
		return ToolCall{}, invalid(where, "%v", err)
	}
	if wc.Name == "" {
		return ToolCall{}, invalid(where, "name is required")
	}
	hasArgs := len(wc.Arguments) > 0
	if hasArgs && wc.RawArguments != nil {
		return ToolCall{}, invalid(where, `give "arguments" or "raw_arguments", not both`)
	}
	tc := ToolCall{Name: wc.Name}
	switch {
	case wc.RawArguments != nil:
		tc.Input = json.RawMessage(*wc.RawArguments)
	case hasArgs:
		var buf bytes.Buffer
		if err := json.Compact(&buf, wc.Arguments); err != nil {
			return ToolCall{}, invalid(where, "arguments: %v", err) // unreachable: already decoded
		}
		tc.Input = buf.Bytes()
	}
	return tc, nil
}

func isObject(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

// decodeStrict decodes one JSON value into v, rejecting unknown fields and
// trailing data.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

func invalid(where, format string, args ...any) error {
	prefix := "script"
	if where != "" {
		prefix += ": " + where
	}
	return fmt.Errorf("%s: %s: %w", prefix, fmt.Sprintf(format, args...), errs.InvalidArgument)
}
