package operator

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/services/operator/provider"
)

// A history entry is one invocation's turns, stored as a JSON value:
//
//	{"version": 1, "dispatch_id": "d-7", "messages": [
//	  {"role": "user", "content": <layer0.types.v1.Content in protojson>}, ...]}
//
// The value travels as a structpb.Value. encodeEntry and decodeEntry
// build and read that value directly; encodeEntryJSON and decodeEntryJSON
// go through JSON text (encoding/json for the entry, protojson for each
// Content) and are the reference: the direct forms hand them every value
// whose shape they do not know for certain (a string that is not UTF-8,
// a field they do not expect), so that what is accepted, rejected and
// returned stays exactly theirs. Going through JSON cost about as much
// CPU as a model call for an entry of eight messages.

// historyEntry is the stored form of one invocation's turns.
type historyEntry struct {
	Version    int               `json:"version"`
	DispatchID string            `json:"dispatch_id,omitempty"`
	Messages   []json.RawMessage `json:"messages"`
}

type storedMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// encodeEntry builds the WriteMemory value for the turns of one invocation.
func encodeEntry(dispatchID string, msgs []provider.Message) (*structpb.Value, error) {
	if !utf8.ValidString(dispatchID) {
		return encodeEntryJSON(dispatchID, msgs)
	}
	fields := map[string]*structpb.Value{"version": structpb.NewNumberValue(historyVersion)}
	if dispatchID != "" {
		fields["dispatch_id"] = structpb.NewStringValue(dispatchID)
	}
	if len(msgs) == 0 {
		fields["messages"] = structpb.NewNullValue() // as encoding/json writes no messages
	} else {
		list := make([]*structpb.Value, len(msgs))
		for i, m := range msgs {
			c, ok := contentValue(m.Parts)
			if !ok {
				return encodeEntryJSON(dispatchID, msgs)
			}
			list[i] = structValue(map[string]*structpb.Value{"role": structpb.NewStringValue(m.Role.String()), "content": c})
		}
		fields["messages"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	}
	return structValue(fields), nil
}

// contentValue is toContent(parts) as protojson writes it, as a value:
// {"blocks": [...]} with each block's set fields under their JSON names,
// {} without blocks. ok is false for a string that is not UTF-8, which
// protojson refuses.
func contentValue(parts []provider.Part) (*structpb.Value, bool) {
	var blocks []*structpb.Value
	for _, p := range parts {
		var kind string
		f := map[string]*structpb.Value{}
		switch {
		case p.ToolUse != nil:
			kind = "toolUse"
			in, ok := inputValueOK(p.ToolUse.Input)
			if !ok || !putString(f, "id", p.ToolUse.ID) || !putString(f, "name", p.ToolUse.Name) {
				return nil, false
			}
			f["input"] = in
		case p.ToolResult != nil:
			kind = "toolResult"
			if !putString(f, "toolUseId", p.ToolResult.ToolUseID) || !putString(f, "content", p.ToolResult.Content) {
				return nil, false
			}
			if p.ToolResult.IsError {
				f["isError"] = structpb.NewBoolValue(true)
			}
		case p.Image != nil:
			kind = "image"
			if p.Image.URL != "" {
				if !putString(f, "url", p.Image.URL) {
					return nil, false
				}
			} else {
				// The oneof is set even when empty: protojson writes it.
				f["data"] = structpb.NewStringValue(base64.StdEncoding.EncodeToString(p.Image.Data))
				if !putString(f, "mediaType", p.Image.MediaType) {
					return nil, false
				}
			}
		default:
			if p.Text == "" {
				continue
			}
			kind = "text"
			if !putString(f, "text", p.Text) {
				return nil, false
			}
		}
		blocks = append(blocks, structValue(map[string]*structpb.Value{kind: structValue(f)}))
	}
	fields := map[string]*structpb.Value{}
	if len(blocks) > 0 {
		fields["blocks"] = structpb.NewListValue(&structpb.ListValue{Values: blocks})
	}
	return structValue(fields), true
}

// putString sets f[name] to s unless s is empty (protojson leaves out a
// field at its zero value); false if s is not UTF-8.
func putString(f map[string]*structpb.Value, name, s string) bool {
	if s == "" {
		return true
	}
	if !utf8.ValidString(s) {
		return false
	}
	f[name] = structpb.NewStringValue(s)
	return true
}

// inputValueOK is inputValue, false when its "_raw" string would not be
// UTF-8 (what the model sent is stored whatever it is, if it can be).
func inputValueOK(raw json.RawMessage) (*structpb.Value, bool) {
	if v, err := jsonValue(raw); err == nil {
		if _, ok := v.GetKind().(*structpb.Value_StructValue); ok {
			return v, true
		}
	}
	if !utf8.Valid(raw) {
		return nil, false
	}
	return inputValue(raw), true
}

func structValue(f map[string]*structpb.Value) *structpb.Value {
	return structpb.NewStructValue(&structpb.Struct{Fields: f})
}

// decodeEntry reads a stored entry back into messages.
func decodeEntry(v *structpb.Value) ([]provider.Message, error) {
	if msgs, ok := decodeEntryValue(v); ok {
		return msgs, nil
	}
	return decodeEntryJSON(v)
}

// decodeEntryValue reads an entry of the shape encodeEntry writes; ok is
// false for anything else, valid or not, which decodeEntryJSON decides.
func decodeEntryValue(v *structpb.Value) ([]provider.Message, bool) {
	e := v.GetStructValue()
	if e == nil {
		return nil, false
	}
	var list []*structpb.Value
	for k, f := range e.GetFields() {
		switch k {
		case "version":
			if n, ok := f.GetKind().(*structpb.Value_NumberValue); !ok || n.NumberValue != historyVersion {
				return nil, false
			}
		case "dispatch_id":
			if _, ok := f.GetKind().(*structpb.Value_StringValue); !ok {
				return nil, false
			}
		case "messages":
			switch m := f.GetKind().(type) {
			case *structpb.Value_ListValue:
				list = m.ListValue.GetValues()
			case *structpb.Value_NullValue:
			default:
				return nil, false
			}
		default:
			// encoding/json would match a key such as "Version" to a
			// field, without regard to case.
			return nil, false
		}
	}
	if _, ok := e.GetFields()["version"]; !ok {
		return nil, false
	}
	msgs := make([]provider.Message, 0, len(list))
	for _, m := range list {
		msg, ok := decodeMessageValue(m)
		if !ok {
			return nil, false
		}
		msgs = append(msgs, msg)
	}
	return msgs, true
}

func decodeMessageValue(v *structpb.Value) (provider.Message, bool) {
	m := v.GetStructValue()
	if m == nil || len(m.GetFields()) != 2 {
		return provider.Message{}, false
	}
	var msg provider.Message
	switch strings.ToLower(m.GetFields()["role"].GetStringValue()) {
	case "user":
		msg.Role = provider.User
	case "assistant":
		msg.Role = provider.Assistant
	default:
		return provider.Message{}, false
	}
	c := m.GetFields()["content"].GetStructValue()
	if c == nil {
		return provider.Message{}, false
	}
	var blocks []*structpb.Value
	for k, f := range c.GetFields() {
		l, ok := f.GetKind().(*structpb.Value_ListValue)
		if k != "blocks" || !ok {
			return provider.Message{}, false
		}
		blocks = l.ListValue.GetValues()
	}
	msg.Parts = make([]provider.Part, 0, len(blocks))
	for _, b := range blocks {
		p, ok := decodeBlockValue(b)
		if !ok {
			return provider.Message{}, false
		}
		msg.Parts = append(msg.Parts, p)
	}
	return msg, true
}

// decodeBlockValue reads one content block as toParts maps it: a text,
// tool use, tool result or image block with its fields under their JSON
// names, each of its type.
func decodeBlockValue(v *structpb.Value) (provider.Part, bool) {
	b := v.GetStructValue()
	if b == nil || len(b.GetFields()) != 1 {
		return provider.Part{}, false
	}
	for kind, bv := range b.GetFields() {
		f := bv.GetStructValue()
		if f == nil {
			return provider.Part{}, false
		}
		r := fieldReader{fields: f.GetFields(), ok: true}
		switch kind {
		case "text":
			p := provider.Part{Text: r.str("text")}
			return p, r.done()
		case "toolUse":
			u := &provider.ToolUse{ID: r.str("id"), Name: r.str("name"), Input: json.RawMessage(`{}`)}
			if in, ok := r.take("input"); ok {
				if _, null := in.GetKind().(*structpb.Value_NullValue); null || in.GetKind() == nil {
					return provider.Part{}, false
				}
				u.Input = valueJSON(in)
			}
			return provider.Part{ToolUse: u}, r.done()
		case "toolResult":
			t := &provider.ToolResult{ToolUseID: r.str("toolUseId"), Content: r.str("content"), IsError: r.boolean("isError")}
			return provider.Part{ToolResult: t}, r.done()
		case "image":
			img := &provider.Image{URL: r.str("url"), MediaType: r.str("mediaType")}
			if d, ok := r.take("data"); ok {
				s, isStr := d.GetKind().(*structpb.Value_StringValue)
				if !isStr || img.URL != "" {
					return provider.Part{}, false
				}
				data, err := base64.StdEncoding.DecodeString(s.StringValue)
				if err != nil {
					return provider.Part{}, false
				}
				img.Data = data
			} else if img.URL == "" {
				return provider.Part{}, false
			}
			return provider.Part{Image: img}, r.done()
		}
	}
	return provider.Part{}, false
}

// fieldReader takes the fields of a block, each of the type asked for;
// done reports whether every field was taken, each with its type.
type fieldReader struct {
	fields map[string]*structpb.Value
	taken  int
	ok     bool
}

func (r *fieldReader) take(name string) (*structpb.Value, bool) {
	v, ok := r.fields[name]
	if ok {
		r.taken++
	}
	return v, ok
}

func (r *fieldReader) str(name string) string {
	v, ok := r.take(name)
	if !ok {
		return ""
	}
	s, isStr := v.GetKind().(*structpb.Value_StringValue)
	if !isStr {
		r.ok = false
		return ""
	}
	return s.StringValue
}

func (r *fieldReader) boolean(name string) bool {
	v, ok := r.take(name)
	if !ok {
		return false
	}
	b, isBool := v.GetKind().(*structpb.Value_BoolValue)
	if !isBool {
		r.ok = false
		return false
	}
	return b.BoolValue
}

func (r *fieldReader) done() bool { return r.ok && r.taken == len(r.fields) }

// encodeEntryJSON is encodeEntry through JSON text: the reference.
func encodeEntryJSON(dispatchID string, msgs []provider.Message) (*structpb.Value, error) {
	e := historyEntry{Version: historyVersion, DispatchID: dispatchID}
	for _, m := range msgs {
		c, err := protojson.Marshal(toContent(m.Parts))
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(storedMessage{Role: m.Role.String(), Content: c})
		if err != nil {
			return nil, err
		}
		e.Messages = append(e.Messages, b)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	return jsonValue(b)
}

// decodeEntryJSON is decodeEntry through JSON text: the reference, and
// what decides every entry decodeEntryValue does not know.
func decodeEntryJSON(v *structpb.Value) ([]provider.Message, error) {
	b, err := protojson.Marshal(v)
	if err != nil {
		return nil, err
	}
	var e historyEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, err
	}
	if e.Version != historyVersion {
		return nil, fmt.Errorf("entry version %d, want %d", e.Version, historyVersion)
	}
	msgs := make([]provider.Message, 0, len(e.Messages))
	for i, raw := range e.Messages {
		var sm storedMessage
		if err := json.Unmarshal(raw, &sm); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		var role provider.Role
		switch strings.ToLower(sm.Role) {
		case "user":
			role = provider.User
		case "assistant":
			role = provider.Assistant
		default:
			return nil, fmt.Errorf("message %d: unknown role %q", i, sm.Role)
		}
		c := &typesv1.Content{}
		if err := protojson.Unmarshal(sm.Content, c); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		msgs = append(msgs, provider.Message{Role: role, Parts: toParts(c, nil)})
	}
	return msgs, nil
}
