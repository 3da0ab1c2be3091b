package operator

import (
	"encoding/json"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/secbear/neuron/services/operator/provider"
)

// benchTurns is one invocation's turns as the whole-path benchmark makes
// them: a task, three read-tool calls and their results, an answer.
func benchTurns() []provider.Message {
	msgs := []provider.Message{{Role: provider.User, Parts: []provider.Part{{Text: "read bench.txt three times, then say done"}}}}
	for i := range 3 {
		id := "call_" + string(rune('a'+i))
		msgs = append(msgs,
			provider.Message{Role: provider.Assistant, Parts: []provider.Part{{ToolUse: &provider.ToolUse{ID: id, Name: "read", Input: json.RawMessage(`{"path":"bench.txt"}`)}}}},
			provider.Message{Role: provider.User, Parts: []provider.Part{{ToolResult: &provider.ToolResult{ToolUseID: id, Content: "1\tThe quick brown fox jumps over the lazy dog.\n"}}}})
	}
	return append(msgs, provider.Message{Role: provider.Assistant, Parts: []provider.Part{{Text: "done"}}})
}

func BenchmarkEncodeEntry(b *testing.B) {
	msgs := benchTurns()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeEntry("d-1", msgs); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeEntry(b *testing.B) {
	v, err := encodeEntry("d-1", benchTurns())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeEntry(v); err != nil {
			b.Fatal(err)
		}
	}
}

// entryCases are turns covering every part kind and the values protojson
// treats specially (empty strings, no blocks, a non-object tool input,
// empty image data).
func entryCases() map[string][]provider.Message {
	u := func(parts ...provider.Part) provider.Message {
		return provider.Message{Role: provider.User, Parts: parts}
	}
	a := func(parts ...provider.Part) provider.Message {
		return provider.Message{Role: provider.Assistant, Parts: parts}
	}
	use := func(id, name, in string) provider.Part {
		return provider.Part{ToolUse: &provider.ToolUse{ID: id, Name: name, Input: json.RawMessage(in)}}
	}
	res := func(id, content string, isErr bool) provider.Part {
		return provider.Part{ToolResult: &provider.ToolResult{ToolUseID: id, Content: content, IsError: isErr}}
	}
	return map[string][]provider.Message{
		"bench":            benchTurns(),
		"none":             nil,
		"empty":            {},
		"empty text":       {u(provider.Part{Text: ""}), a(provider.Part{Text: "x"})},
		"no parts":         {u(), a()},
		"several texts":    {u(provider.Part{Text: "a"}, provider.Part{Text: "b\n\"c\"\u2028é"}), a(provider.Part{Text: "ok"})},
		"tool input kinds": {a(use("1", "t", `{"a":[1,2.5,-3e10,true,null,{"b":"c"}],"s":"é"}`), use("2", "t", `[1,2]`), use("3", "t", `not json`), use("4", "t", ``), use("5", "t", `"s"`), use("", "", `{}`))},
		"tool results":     {u(res("1", "out", false), res("2", "", true), res("", "x", false))},
		"images": {u(provider.Part{Image: &provider.Image{URL: "https://x/y.png"}},
			provider.Part{Image: &provider.Image{URL: "https://x/y.png", MediaType: "image/png"}},
			provider.Part{Image: &provider.Image{Data: []byte{0, 1, 2, 255}, MediaType: "image/png"}},
			provider.Part{Image: &provider.Image{Data: []byte{7}}},
			provider.Part{Image: &provider.Image{}})},
		"bad utf8 text":   {u(provider.Part{Text: "a\xffb"})},
		"bad utf8 input":  {a(use("1", "t", "\xff"))},
		"bad utf8 result": {u(res("1", "\xfe", false))},
	}
}

// The direct encoder writes what the JSON one writes, and fails where it
// fails.
func TestEncodeEntryMatchesJSON(t *testing.T) {
	for name, msgs := range entryCases() {
		for _, dispatchID := range []string{"", "d-1", "d\xff"} {
			got, gotErr := encodeEntry(dispatchID, msgs)
			want, wantErr := encodeEntryJSON(dispatchID, msgs)
			if (gotErr != nil) != (wantErr != nil) {
				t.Fatalf("%s %q: error %v, want %v", name, dispatchID, gotErr, wantErr)
			}
			if !proto.Equal(got, want) {
				t.Errorf("%s %q:\n got %v\nwant %v", name, dispatchID, got, want)
			}
		}
	}
}

// The direct decoder reads what the JSON one reads, and reads every entry
// encodeEntry writes itself.
func TestDecodeEntryMatchesJSON(t *testing.T) {
	for name, msgs := range entryCases() {
		v, err := encodeEntryJSON("d-1", msgs)
		if err != nil {
			continue // not encodable
		}
		if _, ok := decodeEntryValue(v); !ok {
			t.Errorf("%s: the direct decoder refused an entry encodeEntry writes", name)
		}
		sameDecode(t, name, v)
	}
	parse := func(s string) *structpb.Value {
		v := &structpb.Value{}
		if err := protojson.Unmarshal([]byte(s), v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	msg := func(c string) string { return `{"version":1,"messages":[{"role":"user","content":` + c + `}]}` }
	for _, s := range []string{
		`{"version":1}`,
		`{"version":1,"messages":[]}`,
		`{"version":1.0,"dispatch_id":"x","messages":null}`,
		`{"version":2,"messages":[]}`,
		`{"version":1.5}`,
		`{"messages":[]}`,
		`{"version":"1"}`,
		`{"version":1,"dispatch_id":3}`,
		`{"Version":1}`,
		`{"version":1,"extra":{"a":1}}`,
		`[1]`,
		`"x"`,
		`{"version":1,"messages":{}}`,
		`{"version":1,"messages":[null]}`,
		`{"version":1,"messages":[{"role":"user"}]}`,
		`{"version":1,"messages":[{"role":"system","content":{}}]}`,
		`{"version":1,"messages":[{"role":"USER","content":{}}]}`,
		`{"version":1,"messages":[{"role":"user","content":{},"x":1}]}`,
		msg(`{}`),
		msg(`{"blocks":null}`),
		msg(`{"blocks":[]}`),
		msg(`{"blocks":[{}]}`),
		msg(`{"blocks":[{"text":{}}]}`),
		msg(`{"blocks":[{"text":{"text":"a"},"image":{"url":"u"}}]}`),
		msg(`{"blocks":[{"text":{"text":1}}]}`),
		msg(`{"blocks":[{"text":{"text":"a","x":1}}]}`),
		msg(`{"blocks":[{"text":null}]}`),
		msg(`{"blocks":[{"tool_use":{"id":"1","name":"t"}}]}`),
		msg(`{"blocks":[{"toolUse":{"id":"1","name":"t"}}]}`),
		msg(`{"blocks":[{"toolUse":{"id":"1","name":"t","input":null}}]}`),
		msg(`{"blocks":[{"toolUse":{"id":"1","name":"t","input":[1]}}]}`),
		msg(`{"blocks":[{"toolResult":{"toolUseId":"1","isError":false}}]}`),
		msg(`{"blocks":[{"toolResult":{"toolUseId":"1","isError":"yes"}}]}`),
		msg(`{"blocks":[{"tool_result":{"tool_use_id":"1","is_error":true}}]}`),
		msg(`{"blocks":[{"image":{"data":"AAEC/w=="}}]}`),
		msg(`{"blocks":[{"image":{"data":"AAEC_w"}}]}`),
		msg(`{"blocks":[{"image":{"data":""}}]}`),
		msg(`{"blocks":[{"image":{"data":"AA==","url":"u"}}]}`),
		msg(`{"blocks":[{"image":{"mediaType":"image/png"}}]}`),
		msg(`{"blocks":[{"image":{"url":"u","media_type":"image/png"}}]}`),
		msg(`{"blocks":[{"custom":{"contentType":"a/b","data":{"k":1}}}]}`),
	} {
		sameDecode(t, s, parse(s))
	}
}

func sameDecode(t *testing.T, name string, v *structpb.Value) {
	t.Helper()
	got, gotErr := decodeEntry(v)
	want, wantErr := decodeEntryJSON(v)
	if (gotErr != nil) != (wantErr != nil) {
		t.Errorf("%s: error %v, want %v", name, gotErr, wantErr)
		return
	}
	if !sameMessages(got, want) {
		t.Errorf("%s:\n got %s\nwant %s", name, dump(got), dump(want))
	}
}

// sameMessages compares messages, tool inputs as JSON values (protojson
// spaces its output at random).
func sameMessages(a, b []provider.Message) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Role != b[i].Role || len(a[i].Parts) != len(b[i].Parts) {
			return false
		}
		for j := range a[i].Parts {
			p, q := a[i].Parts[j], b[i].Parts[j]
			if (p.ToolUse == nil) != (q.ToolUse == nil) {
				return false
			}
			if p.ToolUse != nil {
				var x, y any
				if json.Unmarshal(p.ToolUse.Input, &x) != nil || json.Unmarshal(q.ToolUse.Input, &y) != nil || !reflect.DeepEqual(x, y) {
					return false
				}
				if p.ToolUse.ID != q.ToolUse.ID || p.ToolUse.Name != q.ToolUse.Name {
					return false
				}
				p.ToolUse, q.ToolUse = nil, nil
			}
			if p.Image != nil && q.Image != nil && len(p.Image.Data) == 0 && len(q.Image.Data) == 0 {
				p.Image, q.Image = &provider.Image{URL: p.Image.URL, MediaType: p.Image.MediaType}, &provider.Image{URL: q.Image.URL, MediaType: q.Image.MediaType}
			}
			if !reflect.DeepEqual(p, q) {
				return false
			}
		}
	}
	return true
}

func dump(msgs []provider.Message) string {
	b, _ := json.Marshal(msgs)
	return string(b)
}
