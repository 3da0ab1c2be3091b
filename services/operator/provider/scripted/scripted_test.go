package scripted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func user(text string) provider.Message {
	return provider.Message{Role: provider.User, Parts: []provider.Part{{Text: text}}}
}

func toolResults(results ...provider.ToolResult) provider.Message {
	m := provider.Message{Role: provider.User}
	for i := range results {
		m.Parts = append(m.Parts, provider.Part{ToolResult: &results[i]})
	}
	return m
}

func assistant(r *provider.Response) provider.Message {
	return provider.Message{Role: provider.Assistant, Parts: r.Parts}
}

func text(s string) provider.Part { return provider.Part{Text: s} }

func toolUse(id, name, input string) provider.Part {
	return provider.Part{ToolUse: &provider.ToolUse{ID: id, Name: name, Input: json.RawMessage(input)}}
}

// want is the expected response; Usage nil means "do not check".
type want struct {
	parts []provider.Part
	stop  provider.StopReason
	usage *provider.Usage
	cost  string
}

func check(t *testing.T, got *provider.Response, w want) {
	t.Helper()
	if got.Model != "scripted" {
		t.Errorf("Model = %q, want scripted", got.Model)
	}
	if !reflect.DeepEqual(got.Parts, w.parts) {
		t.Errorf("Parts =\n%s\nwant\n%s", show(got.Parts), show(w.parts))
	}
	if got.Stop != w.stop {
		t.Errorf("Stop = %s, want %s", got.Stop, w.stop)
	}
	if w.usage != nil && got.Usage != *w.usage {
		t.Errorf("Usage = %+v, want %+v", got.Usage, *w.usage)
	}
	wc := decimal.Zero
	if w.cost != "" {
		wc = decimal.RequireFromString(w.cost)
	}
	if !got.Cost.Equal(wc) {
		t.Errorf("Cost = %s, want %s", got.Cost, wc)
	}
}

func show(parts []provider.Part) string {
	var b strings.Builder
	for _, p := range parts {
		switch {
		case p.ToolUse != nil:
			fmt.Fprintf(&b, "  tool_use{%s %s %s}\n", p.ToolUse.ID, p.ToolUse.Name, p.ToolUse.Input)
		case p.ToolResult != nil:
			fmt.Fprintf(&b, "  tool_result{%+v}\n", *p.ToolResult)
		default:
			fmt.Fprintf(&b, "  text{%q}\n", p.Text)
		}
	}
	return b.String()
}

func complete(t *testing.T, p *Provider, req *provider.Request) *provider.Response {
	t.Helper()
	resp, err := p.Complete(context.Background(), req)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return resp
}

const loopScript = `{"turns":[
  {"text":"Reading.","tool_calls":[{"name":"read","arguments":{"path":"a.txt"}},{"name":"ls"}]},
  {"tool_calls":[{"name":"write","raw_arguments":"{\"path\": \"b.txt\""}],"usage":{"input_tokens":100,"output_tokens":7},"cost":"0.0125"},
  {"text":"All done.","cost":"0.5"}
]}`

func mustParse(t *testing.T, s string) *Script {
	t.Helper()
	sc, err := Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestPlaysTurnsInOrder drives the model as the loop does: each response
// goes into the history, followed by the tool results.
func TestPlaysTurnsInOrder(t *testing.T) {
	p := New(WithScript(mustParse(t, loopScript)))
	if p.Name() != "scripted" {
		t.Errorf("Name = %q", p.Name())
	}
	req := &provider.Request{System: "be brief", Messages: []provider.Message{user("go")}}

	r0 := complete(t, p, req)
	check(t, r0, want{
		parts: []provider.Part{text("Reading."), toolUse("call_0_0", "read", `{"path":"a.txt"}`), toolUse("call_0_1", "ls", `{}`)},
		stop:  provider.StopToolUse,
	})
	req.Messages = append(req.Messages, assistant(r0),
		toolResults(provider.ToolResult{ToolUseID: "call_0_0", Content: "hello"}, provider.ToolResult{ToolUseID: "call_0_1", Content: "a.txt"}))

	r1 := complete(t, p, req)
	check(t, r1, want{
		// The invalid JSON arrives verbatim.
		parts: []provider.Part{toolUse("call_1_0", "write", `{"path": "b.txt"`)},
		stop:  provider.StopToolUse,
		usage: &provider.Usage{InputTokens: 100, OutputTokens: 7},
		cost:  "0.0125",
	})
	req.Messages = append(req.Messages, assistant(r1),
		toolResults(provider.ToolResult{ToolUseID: "call_1_0", Content: "input is not valid JSON", IsError: true}))

	r2 := complete(t, p, req)
	check(t, r2, want{parts: []provider.Part{text("All done.")}, stop: provider.StopEndTurn, cost: "0.5"})
	req.Messages = append(req.Messages, assistant(r2))

	// Past the end: the loop asked again (e.g. after a forced continue).
	req.Messages = append(req.Messages, toolResults(provider.ToolResult{ToolUseID: "x", Content: "late"}))
	check(t, complete(t, p, req), want{
		parts: []provider.Part{text("[scripted model: script exhausted after 3 turns]")},
		stop:  provider.StopEndTurn,
	})

	// A new user message starts the script again.
	req.Messages = append(req.Messages, user("again"))
	r := complete(t, p, req)
	if len(r.Parts) != 3 || r.Parts[1].ToolUse.ID != "call_0_0" {
		t.Errorf("a new user message did not restart the script: %s", show(r.Parts))
	}
}

func TestTurnIndex(t *testing.T) {
	a := provider.Message{Role: provider.Assistant, Parts: []provider.Part{text("x")}}
	res := toolResults(provider.ToolResult{ToolUseID: "1"})
	mixed := provider.Message{Role: provider.User, Parts: []provider.Part{{ToolResult: &provider.ToolResult{ToolUseID: "1"}}, text("also this")}}
	tests := []struct {
		msgs []provider.Message
		want int
	}{
		{nil, 0},
		{[]provider.Message{user("a")}, 0},
		{[]provider.Message{user("a"), a}, 1},
		{[]provider.Message{user("a"), a, res}, 1},
		{[]provider.Message{user("a"), a, res, a, res}, 2},
		{[]provider.Message{user("a"), a, res, a, user("b")}, 0},
		{[]provider.Message{user("a"), a, res, a, user("b"), a, res}, 1},
		{[]provider.Message{user("a"), a, mixed}, 0},                    // text beside a result is the user speaking
		{[]provider.Message{a, res, a}, 2},                              // no user message at all
		{[]provider.Message{user("a"), a, {Role: provider.User}, a}, 2}, // an empty user message is not genuine
	}
	for i, tt := range tests {
		if got := TurnIndex(tt.msgs); got != tt.want {
			t.Errorf("case %d: TurnIndex = %d, want %d", i, got, tt.want)
		}
	}
}

func TestExhausted(t *testing.T) {
	p := New(WithScript(&Script{Turns: []Turn{{Text: "only"}}}))
	msgs := []provider.Message{user("hi"), {Role: provider.Assistant, Parts: []provider.Part{text("only")}}}
	check(t, complete(t, p, &provider.Request{Messages: msgs}), want{
		parts: []provider.Part{text("[scripted model: script exhausted after 1 turn]")},
		stop:  provider.StopEndTurn,
	})
}

func TestStopOverridesAndGoScripts(t *testing.T) {
	p := New(WithScript(&Script{Turns: []Turn{
		{Text: "cut", Stop: provider.StopMaxTokens},
		{ToolCalls: []ToolCall{{Name: "x", Input: json.RawMessage(`[1]`)}}, Stop: provider.StopContentFilter},
		{ToolCalls: []ToolCall{{Name: "y"}}, Stop: provider.StopEndTurn},
	}}))
	msgs := []provider.Message{user("hi")}
	wants := []want{
		{parts: []provider.Part{text("cut")}, stop: provider.StopMaxTokens},
		{parts: []provider.Part{toolUse("call_1_0", "x", `[1]`)}, stop: provider.StopContentFilter},
		{parts: []provider.Part{toolUse("call_2_0", "y", `{}`)}, stop: provider.StopEndTurn},
	}
	for _, w := range wants {
		r := complete(t, p, &provider.Request{Messages: msgs})
		check(t, r, w)
		msgs = append(msgs, assistant(r))
	}
}

func TestResponseDoesNotAliasTheScript(t *testing.T) {
	s := mustParse(t, `{"turns":[{"tool_calls":[{"name":"read","arguments":{"a":1}}]}]}`)
	p := New(WithScript(s))
	r := complete(t, p, &provider.Request{Messages: []provider.Message{user("hi")}})
	r.Parts[0].ToolUse.Input[0] = 'X'
	if string(s.Turns[0].ToolCalls[0].Input) != `{"a":1}` {
		t.Errorf("changing a response changed the script: %s", s.Turns[0].ToolCalls[0].Input)
	}
}

func TestMetadataOverride(t *testing.T) {
	const js = `{"turns":[{"text":"from metadata"}]}`
	var asMap map[string]any
	if err := json.Unmarshal([]byte(js), &asMap); err != nil {
		t.Fatal(err)
	}
	st, err := structpb.NewStruct(asMap)
	if err != nil {
		t.Fatal(err)
	}
	defaultScript := New(WithScript(mustParse(t, `{"turns":[{"text":"default"}]}`)))
	rules := New()
	for _, tt := range []struct {
		name string
		v    any
	}{
		{"map", asMap},
		{"string", js},
		{"bytes", []byte(js)},
		{"raw message", json.RawMessage(js)},
		{"struct", st},
	} {
		for _, p := range []*Provider{defaultScript, rules} {
			t.Run(tt.name, func(t *testing.T) {
				r := complete(t, p, &provider.Request{
					Messages: []provider.Message{user("hi")},
					Metadata: map[string]any{MetadataKey: tt.v, "trace_id": "abc"},
				})
				check(t, r, want{parts: []provider.Part{text("from metadata")}, stop: provider.StopEndTurn})
			})
		}
	}
	// Without the key, or with nil, the default applies.
	for _, md := range []map[string]any{nil, {"other": 1}, {MetadataKey: nil}} {
		r := complete(t, defaultScript, &provider.Request{Messages: []provider.Message{user("hi")}, Metadata: md})
		if r.Text() != "default" {
			t.Errorf("metadata %v: text = %q, want the default script", md, r.Text())
		}
	}
}

func TestMetadataOverrideErrors(t *testing.T) {
	tests := []struct {
		v    any
		want string
	}{
		{42, `scripted model: metadata "scripted" is a int; want a JSON object or a string holding one: invalid argument`},
		{"not json", `scripted model: metadata "scripted": script: want a JSON object like {"turns":[{"text":"hello"}]}: invalid argument`},
		{map[string]any{"turns": []any{map[string]any{"txt": "x"}}}, `scripted model: metadata "scripted": script: turns[0]: json: unknown field "txt": invalid argument`},
	}
	for _, tt := range tests {
		_, err := New().Complete(context.Background(), &provider.Request{
			Messages: []provider.Message{user("hi")},
			Metadata: map[string]any{MetadataKey: tt.v},
		})
		if err == nil || err.Error() != tt.want {
			t.Errorf("metadata %v: error = %v, want %q", tt.v, err, tt.want)
		}
		if !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("metadata %v: error does not wrap errs.InvalidArgument", tt.v)
		}
	}
	if _, err := New().Complete(context.Background(), nil); !errors.Is(err, errs.InvalidArgument) {
		t.Errorf("nil request: %v", err)
	}
}

const casesScript = `{
  "turns": [
    {"tool_calls": [{"name": "delegate", "arguments": {"agent": "researcher"}}]},
    {"text": "Delegated; waiting."}
  ],
  "cases": [
    {"contains": "Results of delegated", "turns": [
      {"tool_calls": [{"name": "write", "arguments": {"path": "report.md"}}]},
      {"text": "Report written.", "cost": "0.25"}
    ]},
    {"contains": "Results", "turns": [{"text": "Some other results."}]}
  ]
}`

// TestCases drives an orchestrator-like agent: invoked with a task, it
// delegates; invoked again with the results, it plays the case instead of
// starting the top-level turns over.
func TestCases(t *testing.T) {
	p := New(WithScript(mustParse(t, casesScript)))
	msgs := []provider.Message{user("Write a report on X.")}

	r := complete(t, p, &provider.Request{Messages: msgs})
	check(t, r, want{parts: []provider.Part{toolUse("call_0_0", "delegate", `{"agent":"researcher"}`)}, stop: provider.StopToolUse})
	msgs = append(msgs, assistant(r), toolResults(provider.ToolResult{ToolUseID: "call_0_0", Content: "delegated"}))
	r = complete(t, p, &provider.Request{Messages: msgs})
	check(t, r, want{parts: []provider.Part{text("Delegated; waiting.")}, stop: provider.StopEndTurn})
	msgs = append(msgs, assistant(r))

	// Re-invoked with the results: the first matching case plays from its
	// turn 0, though "Results" (the second case) matches too.
	msgs = append(msgs, provider.Message{Role: provider.User, Parts: []provider.Part{text("Here you go."), text("Results of delegated tasks:\n- researcher: X is Y")}})
	r = complete(t, p, &provider.Request{Messages: msgs})
	check(t, r, want{parts: []provider.Part{toolUse("call_0_0", "write", `{"path":"report.md"}`)}, stop: provider.StopToolUse})
	msgs = append(msgs, assistant(r), toolResults(provider.ToolResult{ToolUseID: "call_0_0", Content: "ok"}))
	r = complete(t, p, &provider.Request{Messages: msgs})
	check(t, r, want{parts: []provider.Part{text("Report written.")}, stop: provider.StopEndTurn, cost: "0.25"})
	msgs = append(msgs, assistant(r), toolResults(provider.ToolResult{ToolUseID: "late", Content: "late"}))
	check(t, complete(t, p, &provider.Request{Messages: msgs}), want{
		parts: []provider.Part{text("[scripted model: script exhausted after 2 turns]")},
		stop:  provider.StopEndTurn,
	})

	tests := []struct {
		name string
		msg  string
		want string
	}{
		{"second case", "Results: none", "Some other results."},
		{"case-sensitive: falls back to the top-level turns", "results of delegated tasks", ""},
		{"no case: top-level turns", "Write another report.", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := complete(t, p, &provider.Request{Messages: []provider.Message{user(tt.msg)}})
			if tt.want == "" {
				check(t, r, want{parts: []provider.Part{toolUse("call_0_0", "delegate", `{"agent":"researcher"}`)}, stop: provider.StopToolUse})
				return
			}
			check(t, r, want{parts: []provider.Part{text(tt.want)}, stop: provider.StopEndTurn})
		})
	}
}

func TestCasesWithoutTopLevelTurns(t *testing.T) {
	p := New(WithScript(mustParse(t, `{"cases":[{"contains":"ping","turns":[{"text":"pong"}]}]}`)))
	check(t, complete(t, p, &provider.Request{Messages: []provider.Message{user("ping?")}}), want{
		parts: []provider.Part{text("pong")}, stop: provider.StopEndTurn,
	})
	check(t, complete(t, p, &provider.Request{Messages: []provider.Message{user("hello")}}), want{
		parts: []provider.Part{text("[scripted model: no case of the script matches the last user message]")},
		stop:  provider.StopEndTurn,
	})
}

func TestMetadataOverrideWithCases(t *testing.T) {
	md := map[string]any{"cases": []any{
		map[string]any{"contains": "Results of delegated", "turns": []any{map[string]any{"text": "from the case"}}},
	}, "turns": []any{map[string]any{"text": "from the top level"}}}
	st, err := structpb.NewStruct(md)
	if err != nil {
		t.Fatal(err)
	}
	// The default script would answer "default" to anything.
	p := New(WithScript(mustParse(t, `{"turns":[{"text":"default"}],"cases":[{"contains":"Results","turns":[{"text":"default case"}]}]}`)))
	for _, v := range []any{md, st} {
		for msg, wantText := range map[string]string{
			"Results of delegated tasks: ...": "from the case",
			"Results: none":                   "from the top level",
		} {
			r := complete(t, p, &provider.Request{Messages: []provider.Message{user(msg)}, Metadata: map[string]any{MetadataKey: v}})
			if r.Text() != wantText {
				t.Errorf("metadata %T, message %q: text = %q, want %q", v, msg, r.Text(), wantText)
			}
		}
	}
	// Without the override the default script's case plays.
	if r := complete(t, p, &provider.Request{Messages: []provider.Message{user("Results: none")}}); r.Text() != "default case" {
		t.Errorf("text = %q, want the default script's case", r.Text())
	}
}

func TestRules(t *testing.T) {
	long := strings.Repeat("é", 250)
	tests := []struct {
		name string
		msgs []provider.Message
		want want
	}{
		{"echo", []provider.Message{user("hello there")},
			want{parts: []provider.Part{text("[scripted model] You said: hello there")}, stop: provider.StopEndTurn}},
		{"echo joins text parts", []provider.Message{{Role: provider.User, Parts: []provider.Part{text("a"), {Image: &provider.Image{URL: "u"}}, text("b")}}},
			want{parts: []provider.Part{text("[scripted model] You said: a\nb")}, stop: provider.StopEndTurn}},
		{"no user text", nil,
			want{parts: []provider.Part{text("[scripted model] You said: ")}, stop: provider.StopEndTurn}},
		{"tool call", []provider.Message{user(`/tool read {"path": "a.txt"}`)},
			want{parts: []provider.Part{toolUse("call_0_0", "read", `{"path": "a.txt"}`)}, stop: provider.StopToolUse}},
		{"tool call without args", []provider.Message{user("  /tool\tls  ")},
			want{parts: []provider.Part{toolUse("call_0_0", "ls", `{}`)}, stop: provider.StopToolUse}},
		{"invalid args verbatim", []provider.Message{user(`/tool write {"path": `)},
			want{parts: []provider.Part{toolUse("call_0_0", "write", `{"path":`)}, stop: provider.StopToolUse}},
		{"usage", []provider.Message{user("/tool")},
			want{parts: []provider.Part{text("[scripted model] usage: /tool <name> <json-args>")}, stop: provider.StopEndTurn}},
		{"not the command", []provider.Message{user("/toolbox x")},
			want{parts: []provider.Part{text("[scripted model] You said: /toolbox x")}, stop: provider.StopEndTurn}},
		{"summary", []provider.Message{
			user(`/tool read {"path":"a.txt"}`),
			{Role: provider.Assistant, Parts: []provider.Part{toolUse("call_0_0", "read", `{"path":"a.txt"}`)}},
			toolResults(provider.ToolResult{ToolUseID: "call_0_0", Content: "file contents"}),
		}, want{parts: []provider.Part{text("[scripted model] read returned: file contents")}, stop: provider.StopEndTurn}},
		{"summary of an error", []provider.Message{
			user(`/tool read {}`),
			{Role: provider.Assistant, Parts: []provider.Part{toolUse("call_0_0", "read", `{}`)}},
			toolResults(provider.ToolResult{ToolUseID: "call_0_0", Content: "path is required", IsError: true}),
		}, want{parts: []provider.Part{text("[scripted model] read failed: path is required")}, stop: provider.StopEndTurn}},
		{"summary is cut at 200 characters", []provider.Message{
			user(`/tool cat`),
			{Role: provider.Assistant, Parts: []provider.Part{toolUse("call_0_0", "cat", `{}`)}},
			toolResults(provider.ToolResult{ToolUseID: "call_0_0", Content: long}),
		}, want{parts: []provider.Part{text("[scripted model] cat returned: " + strings.Repeat("é", 200) + "…")}, stop: provider.StopEndTurn}},
		{"a new user message after a tool", []provider.Message{
			user(`/tool ls`),
			{Role: provider.Assistant, Parts: []provider.Part{toolUse("call_0_0", "ls", `{}`)}},
			toolResults(provider.ToolResult{ToolUseID: "call_0_0", Content: "a.txt"}),
			{Role: provider.Assistant, Parts: []provider.Part{text("[scripted model] ls returned: a.txt")}},
			user("thanks"),
		}, want{parts: []provider.Part{text("[scripted model] You said: thanks")}, stop: provider.StopEndTurn}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check(t, complete(t, New(), &provider.Request{Messages: tt.msgs}), tt.want)
		})
	}
}

func TestEstimatedUsage(t *testing.T) {
	req := &provider.Request{
		System:   "sys",                                                                                    // 3
		Messages: []provider.Message{user("hello")},                                                        // 5
		Tools:    []provider.ToolSpec{{Name: "ab", Description: "cd", InputSchema: json.RawMessage(`{}`)}}, // 6
	}
	// Reply: "[scripted model] You said: hello" is 32 characters.
	check(t, complete(t, New(), req), want{
		parts: []provider.Part{text("[scripted model] You said: hello")},
		stop:  provider.StopEndTurn,
		usage: &provider.Usage{InputTokens: 4, OutputTokens: 8},
	})
	// Tool calls and results count; the minimum is 1.
	p := New(WithScript(&Script{Turns: []Turn{{ToolCalls: []ToolCall{{Name: "r", Input: json.RawMessage(`{}`)}}}}}))
	check(t, complete(t, p, &provider.Request{}), want{
		parts: []provider.Part{toolUse("call_0_0", "r", `{}`)},
		stop:  provider.StopToolUse,
		usage: &provider.Usage{InputTokens: 1, OutputTokens: 1},
	})
}

func TestDelay(t *testing.T) {
	p := New(WithScript(mustParse(t, `{"turns":[{"text":"slow","delay":"30ms"}]}`)))
	start := time.Now()
	r := complete(t, p, &provider.Request{Messages: []provider.Message{user("hi")}})
	if e := time.Since(start); e < 30*time.Millisecond {
		t.Errorf("answered after %s, before the 30ms delay", e)
	}
	if r.Text() != "slow" {
		t.Errorf("text = %q", r.Text())
	}
}

func TestDelayHonoursCancellation(t *testing.T) {
	p := New(WithScript(mustParse(t, `{"turns":[{"text":"never","delay":"1h"}]}`)))
	req := &provider.Request{Messages: []provider.Message{user("hi")}, OnText: func(string) { t.Error("OnText called on a cancelled call") }}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p.Complete(ctx, req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error = %v, want DeadlineExceeded", err)
	}
	if err != nil && err.Error() != "scripted model: during a 1h0m0s delay: context deadline exceeded" {
		t.Errorf("error text = %q", err)
	}
	if e := time.Since(start); e > 5*time.Second {
		t.Errorf("cancellation took %s", e)
	}

	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	if _, err := p.Complete(ctx, req); !errors.Is(err, context.Canceled) {
		t.Errorf("error = %v, want Canceled", err)
	}

	// A context already done fails at once, delay or not.
	if _, err := New().Complete(ctx, req); !errors.Is(err, context.Canceled) {
		t.Errorf("done context: error = %v, want Canceled", err)
	}
}

func TestOnText(t *testing.T) {
	const txt = "  Hello big\n\nworld, héllo  "
	p := New(WithScript(&Script{Turns: []Turn{{Text: txt, ToolCalls: []ToolCall{{Name: "x"}}}}}))
	var chunks []string
	r := complete(t, p, &provider.Request{Messages: []provider.Message{user("hi")}, OnText: func(s string) { chunks = append(chunks, s) }})
	want := []string{"  ", "Hello ", "big\n\n", "world, ", "héllo  "}
	if !reflect.DeepEqual(chunks, want) {
		t.Errorf("chunks = %q, want %q", chunks, want)
	}
	if strings.Join(chunks, "") != r.Text() || r.Text() != txt {
		t.Errorf("chunks %q do not make the text %q", chunks, r.Text())
	}
	// No text, no call.
	p = New(WithScript(&Script{Turns: []Turn{{ToolCalls: []ToolCall{{Name: "x"}}}}}))
	complete(t, p, &provider.Request{OnText: func(s string) { t.Errorf("OnText(%q) without text", s) }})
}

func TestChunks(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"one", []string{"one"}},
		{"a b", []string{"a ", "b"}},
		{" ", []string{" "}},
		{"a  \tb c ", []string{"a  \t", "b ", "c "}},
	}
	for _, tt := range tests {
		if got := Chunks(tt.in); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Chunks(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	p := New(WithScript(mustParse(t, loopScript)))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				r, err := p.Complete(context.Background(), &provider.Request{Messages: []provider.Message{user("go")}})
				if err != nil || r.Text() != "Reading." {
					t.Errorf("Complete = %v, %v", r, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
