package scripted

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func TestParse(t *testing.T) {
	data := `{
	  "turns": [
	    {"text": "Let me read it.",
	     "tool_calls": [{"name": "read", "arguments": {"path": "a.txt", "n": [1, 2]}},
	                    {"name": "ls"}]},
	    {"tool_calls": [{"name": "write", "raw_arguments": "{\"path\": \"b.txt\""}],
	     "usage": {"input_tokens": 1200, "output_tokens": 40, "cache_read_tokens": 7, "cache_write_tokens": 3},
	     "cost": "0.0125"},
	    {"text": "Cut.", "stop": "max_tokens", "cost": 2.5, "delay": "50ms"},
	    {"stop": "content_filter"},
	    {}
	  ]
	}`
	got, err := Parse([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	want := &Script{Turns: []Turn{
		{Text: "Let me read it.", ToolCalls: []ToolCall{
			{Name: "read", Input: json.RawMessage(`{"path":"a.txt","n":[1,2]}`)},
			{Name: "ls"},
		}},
		{ToolCalls: []ToolCall{{Name: "write", Input: json.RawMessage(`{"path": "b.txt"`)}},
			Usage: &provider.Usage{InputTokens: 1200, OutputTokens: 40, CacheReadTokens: 7, CacheWriteTokens: 3},
			Cost:  decimal.RequireFromString("0.0125")},
		{Text: "Cut.", Stop: provider.StopMaxTokens, Cost: decimal.RequireFromString("2.5"), Delay: 50 * time.Millisecond},
		{Stop: provider.StopContentFilter},
		{},
	}}
	if len(got.Turns) != len(want.Turns) {
		t.Fatalf("got %d turns, want %d", len(got.Turns), len(want.Turns))
	}
	for i := range want.Turns {
		g, w := got.Turns[i], want.Turns[i]
		if !g.Cost.Equal(w.Cost) {
			t.Errorf("turn %d cost = %s, want %s", i, g.Cost, w.Cost)
		}
		g.Cost, w.Cost = decimal.Zero, decimal.Zero
		if !reflect.DeepEqual(g, w) {
			t.Errorf("turn %d =\n%#v\nwant\n%#v", i, g, w)
		}
	}
}

func TestParseCases(t *testing.T) {
	got, err := Parse([]byte(`{
	  "cases": [
	    {"contains": "Results of delegated", "turns": [{"text": "Summary."}, {"text": "Done.", "cost": "0.5"}]},
	    {"contains": "ping", "turns": [{"tool_calls": [{"name": "pong"}]}]}
	  ]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Turns) != 0 {
		t.Errorf("Turns = %#v, want none", got.Turns)
	}
	if len(got.Cases) != 2 {
		t.Fatalf("got %d cases, want 2", len(got.Cases))
	}
	c0, c1 := got.Cases[0], got.Cases[1]
	if c0.Contains != "Results of delegated" || len(c0.Turns) != 2 || c0.Turns[0].Text != "Summary." ||
		c0.Turns[1].Text != "Done." || !c0.Turns[1].Cost.Equal(decimal.RequireFromString("0.5")) {
		t.Errorf("cases[0] = %#v", c0)
	}
	if want := (Case{Contains: "ping", Turns: []Turn{{ToolCalls: []ToolCall{{Name: "pong"}}}}}); !reflect.DeepEqual(c1, want) {
		t.Errorf("cases[1] =\n%#v\nwant\n%#v", c1, want)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct{ data, want string }{
		{``, `script: want a JSON object like {"turns":[{"text":"hello"}]}: invalid argument`},
		{`[1]`, `script: want a JSON object like {"turns":[{"text":"hello"}]}: invalid argument`},
		{`{}`, `script: no turns: want {"turns":[...]} with at least one turn, or "cases": invalid argument`},
		{`{"turns":[]}`, `script: no turns: want {"turns":[...]} with at least one turn, or "cases": invalid argument`},
		{`{"turns":[],"cases":[]}`, `script: no turns: want {"turns":[...]} with at least one turn, or "cases": invalid argument`},
		{`{"cases":[{"contains":"x"}]}`, `script: cases[0]: no turns: a case needs at least one turn: invalid argument`},
		{`{"turns":[{}],"cases":[{"contains":"x","turns":[]}]}`, `script: cases[0]: no turns: a case needs at least one turn: invalid argument`},
		{`{"cases":[{"turns":[{}]}]}`, `script: cases[0]: contains is required: invalid argument`},
		{`{"cases":[{"contains":"a","turns":[{}]},{"contains":"","turns":[{}]}]}`, `script: cases[1]: contains is required: invalid argument`},
		{`{"cases":[{"contains":"x","turns":[{}],"when":"y"}]}`, `script: cases[0]: json: unknown field "when": invalid argument`},
		{`{"cases":["x"]}`, `script: cases[0]: a case is a JSON object like {"contains":"results","turns":[{"text":"done"}]}: invalid argument`},
		{`{"cases":[{"contains":"x","turns":[{"txt":"a"}]}]}`, `script: cases[0].turns[0]: json: unknown field "txt": invalid argument`},
		{`{"turns":[{}],"cases":[{"contains":"a","turns":[{}]},{"contains":"b","turns":[{},{"tool_calls":[{}]}]}]}`, `script: cases[1].turns[1].tool_calls[0]: name is required: invalid argument`},
		{`{"turns":[{}],"cases":{"contains":"a"}}`, `script: json: cannot unmarshal object into Go struct field wireScript.cases of type []json.RawMessage: invalid argument`},
		{`{"turns":[{}], "model":"x"}`, `script: json: unknown field "model": invalid argument`},
		{`{"turns":[{}]} {}`, `script: unexpected data after the JSON object: invalid argument`},
		{`{"turns":[{"text":"a"},{"txt":"b"}]}`, `script: turns[1]: json: unknown field "txt": invalid argument`},
		{`{"turns":[{}, "hi"]}`, `script: turns[1]: a turn is a JSON object: invalid argument`},
		{`{"turns":[null]}`, `script: turns[0]: a turn is a JSON object: invalid argument`},
		{`{"turns":[{"text":1}]}`, `script: turns[0]: json: cannot unmarshal number into Go struct field wireTurn.text of type string: invalid argument`},
		{`{"turns":[{"stop":"length"}]}`, `script: turns[0]: stop "length": want "end_turn", "tool_use", "max_tokens" or "content_filter": invalid argument`},
		{`{"turns":[{"cost":"-1"}]}`, `script: turns[0]: cost "-1": want a decimal string of USD such as "0.0125": invalid argument`},
		{`{"turns":[{"cost":1e-3}]}`, `script: turns[0]: cost 1e-3: want a decimal string of USD such as "0.0125": invalid argument`},
		{`{"turns":[{"cost":"cheap"}]}`, `script: turns[0]: cost "cheap": want a decimal string of USD such as "0.0125": invalid argument`},
		{`{"turns":[{"delay":"soon"}]}`, `script: turns[0]: delay "soon": want a duration such as "250ms" or "2s": invalid argument`},
		{`{"turns":[{"delay":"-1s"}]}`, `script: turns[0]: delay "-1s": want a duration such as "250ms" or "2s": invalid argument`},
		{`{"turns":[{"usage":{"tokens":3}}]}`, `script: turns[0]: json: unknown field "tokens": invalid argument`},
		{`{"turns":[{},{"tool_calls":[{"name":"a"},{"arguments":{}}]}]}`, `script: turns[1].tool_calls[1]: name is required: invalid argument`},
		{`{"turns":[{"tool_calls":[{"name":"a","args":{}}]}]}`, `script: turns[0].tool_calls[0]: json: unknown field "args": invalid argument`},
		{`{"turns":[{"tool_calls":["read"]}]}`, `script: turns[0].tool_calls[0]: a tool call is a JSON object like {"name":"read","arguments":{}}: invalid argument`},
		{`{"turns":[{"tool_calls":[{"name":"a","arguments":{},"raw_arguments":"{"}]}]}`, `script: turns[0].tool_calls[0]: give "arguments" or "raw_arguments", not both: invalid argument`},
		{`{"turns":[{"tool_calls":[{"name":"a","raw_arguments":{}}]}]}`, `script: turns[0].tool_calls[0]: json: cannot unmarshal object into Go struct field wireToolCall.raw_arguments of type string: invalid argument`},
	}
	for _, tt := range tests {
		_, err := Parse([]byte(tt.data))
		if err == nil {
			t.Errorf("Parse(%s) succeeded, want %q", tt.data, tt.want)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("Parse(%s)\n got %q\nwant %q", tt.data, err, tt.want)
		}
		if !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("Parse(%s): error does not wrap errs.InvalidArgument", tt.data)
		}
	}
}

func TestParseTooLarge(t *testing.T) {
	_, err := Parse([]byte(`{"turns":[{"text":"` + strings.Repeat("x", MaxScriptBytes) + `"}]}`))
	if err == nil || !strings.Contains(err.Error(), "at most 4194304") {
		t.Errorf("error = %v", err)
	}
}

func TestParseFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, []byte(`{"turns":[{"text":"hi"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := ParseFile(good)
	if err != nil || len(s.Turns) != 1 || s.Turns[0].Text != "hi" {
		t.Errorf("ParseFile = %+v, %v", s, err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"turns":[{"txt":"hi"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = ParseFile(bad)
	if want := "script file " + bad + `: script: turns[0]: json: unknown field "txt": invalid argument`; err == nil || err.Error() != want {
		t.Errorf("error = %v, want %q", err, want)
	}
	_, err = ParseFile(filepath.Join(dir, "missing.json"))
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), "script file: open ") {
		t.Errorf("error = %v", err)
	}
}
