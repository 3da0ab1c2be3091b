package tool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
)

const objectSchema = `{"type":"object"}`

// fakeTool is a runnable tool whose Call is a function.
type fakeTool struct {
	spec tool.Spec
	call func(ctx context.Context, in json.RawMessage) (string, error)
}

func (f *fakeTool) Spec() tool.Spec { return f.spec }

func (f *fakeTool) Call(ctx context.Context, in json.RawMessage) (string, error) {
	if f.call == nil {
		return string(in), nil
	}
	return f.call(ctx, in)
}

func newTool(name, schema string, call func(context.Context, json.RawMessage) (string, error)) *fakeTool {
	return &fakeTool{spec: tool.Spec{Name: name, Description: "the " + name + " tool", Schema: json.RawMessage(schema)}, call: call}
}

// fakeEffect is an effect tool whose Declare is a function.
type fakeEffect struct {
	spec    tool.Spec
	declare func(dc tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, string, error)
}

func (f *fakeEffect) Spec() tool.Spec { return f.spec }

func (f *fakeEffect) Declare(dc tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, string, error) {
	return f.declare(dc, in)
}

func mustRegister(t *testing.T, r *tool.Registry, tools ...tool.Tool) {
	t.Helper()
	for _, tl := range tools {
		if err := r.Register(tl); err != nil {
			t.Fatalf("Register(%q): %v", tl.Spec().Name, err)
		}
	}
}

func TestRegisterName(t *testing.T) {
	tests := []struct {
		name    string
		wantErr string
	}{
		{name: "read"},
		{name: "Read_file-2"},
		{name: strings.Repeat("a", 64)},
		{name: "", wantErr: "tool name is empty: invalid argument"},
		{name: strings.Repeat("a", 65), wantErr: `tool name "` + strings.Repeat("a", 65) + `" is 65 bytes; the limit is 64: invalid argument`},
		{name: "read file", wantErr: `tool name "read file" has ' ' at byte 4; names use only letters, digits, '_' and '-': invalid argument`},
		{name: "read.file", wantErr: `tool name "read.file" has '.' at byte 4; names use only letters, digits, '_' and '-': invalid argument`},
		{name: "lire/écrire", wantErr: `tool name "lire/écrire" has '/' at byte 4; names use only letters, digits, '_' and '-': invalid argument`},
		{name: "é", wantErr: `tool name "é" has 'Ã' at byte 0; names use only letters, digits, '_' and '-': invalid argument`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tool.NewRegistry().Register(newTool(tt.name, objectSchema, nil))
			checkErr(t, err, tt.wantErr, errs.InvalidArgument)
		})
	}
}

// checkErr asserts err is nil when want is "", else that its message is
// exactly want and it wraps kind.
func checkErr(t *testing.T, err error, want string, kind *errs.Kind) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("err = %v, want nil", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("err = nil, want %q", want)
	}
	if err.Error() != want {
		t.Errorf("err =\n%s\nwant\n%s", err, want)
	}
	if !errors.Is(err, kind) {
		t.Errorf("errors.Is(err, %v) = false", kind)
	}
}

func TestRegisterDuplicate(t *testing.T) {
	r := tool.NewRegistry()
	mustRegister(t, r, newTool("read", objectSchema, nil))
	err := r.Register(newTool("read", objectSchema, nil))
	checkErr(t, err, `tool "read" is already registered: invalid argument`, errs.InvalidArgument)
	err = r.RegisterEffect(&fakeEffect{spec: tool.Spec{Name: "read", Schema: json.RawMessage(objectSchema)}})
	checkErr(t, err, `tool "read" is already registered: invalid argument`, errs.InvalidArgument)
	if got := r.Names(); len(got) != 1 {
		t.Errorf("Names() = %q, want one tool", got)
	}
}

func TestRegisterSpec(t *testing.T) {
	tests := []struct {
		name    string
		spec    tool.Spec
		wantErr string
	}{
		{name: "minimal", spec: tool.Spec{Schema: json.RawMessage(objectSchema)}},
		{name: "local ref", spec: tool.Spec{Schema: json.RawMessage(`{"type":"object","$defs":{"p":{"type":"string"}},"properties":{"a":{"$ref":"#/$defs/p"}}}`)}},
		{name: "read-only with timeout", spec: tool.Spec{Schema: json.RawMessage(objectSchema), Tier: tool.ReadOnly, Timeout: time.Second}},
		{name: "no schema", spec: tool.Spec{}, wantErr: `tool "t" has no input schema: invalid argument`},
		{name: "blank schema", spec: tool.Spec{Schema: json.RawMessage(" \n")}, wantErr: `tool "t" has no input schema: invalid argument`},
		{
			name:    "not JSON",
			spec:    tool.Spec{Schema: json.RawMessage(`{"type":`)},
			wantErr: `tool "t": schema is not valid JSON: unexpected EOF: invalid argument`,
		},
		{
			name:    "array",
			spec:    tool.Spec{Schema: json.RawMessage(`[]`)},
			wantErr: `tool "t": schema must be a JSON object with "type": "object": invalid argument`,
		},
		{
			name:    "boolean schema",
			spec:    tool.Spec{Schema: json.RawMessage(`true`)},
			wantErr: `tool "t": schema must be a JSON object with "type": "object": invalid argument`,
		},
		{
			name:    "string type",
			spec:    tool.Spec{Schema: json.RawMessage(`{"type":"string"}`)},
			wantErr: `tool "t": schema must be a JSON object with "type": "object": invalid argument`,
		},
		{
			name:    "no type",
			spec:    tool.Spec{Schema: json.RawMessage(`{"properties":{}}`)},
			wantErr: `tool "t": schema must be a JSON object with "type": "object": invalid argument`,
		},
		{
			name:    "remote ref",
			spec:    tool.Spec{Schema: json.RawMessage(`{"type":"object","properties":{"a":{"$ref":"https://example.com/x.json"}}}`)},
			wantErr: `tool "t": schema does not compile: loading https://example.com/x.json: schemas must be self-contained; https://example.com/x.json cannot be loaded: invalid argument`,
		},
		{
			name:    "file ref",
			spec:    tool.Spec{Schema: json.RawMessage(`{"type":"object","properties":{"a":{"$ref":"file:///etc/passwd"}}}`)},
			wantErr: `tool "t": schema does not compile: loading file:///etc/passwd: schemas must be self-contained; file:///etc/passwd cannot be loaded: invalid argument`,
		},
		{
			name:    "bad regexp",
			spec:    tool.Spec{Schema: json.RawMessage(`{"type":"object","properties":{"a":{"pattern":"("}}}`)},
			wantErr: "prefix:" + `tool "t": schema does not compile: `,
		},
		{
			name:    "invalid keyword value",
			spec:    tool.Spec{Schema: json.RawMessage(`{"type":"object","properties":{"a":{"type":5}}}`)},
			wantErr: `tool "t": schema does not compile: at /properties/a: "type" is 5; want a type name or a list of them: invalid argument`,
		},
		{
			name:    "unknown type name",
			spec:    tool.Spec{Schema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"strng"}}}`)},
			wantErr: `tool "t": schema does not compile: at /properties/a: "type" "strng" is not a JSON Schema type; use one of array, boolean, integer, null, number, object, string: invalid argument`,
		},
		{
			name:    "negative count",
			spec:    tool.Spec{Schema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"array","items":{"maxLength":-1}}}}`)},
			wantErr: `tool "t": schema does not compile: at /properties/a/items: "maxLength" is -1; want a non-negative integer: invalid argument`,
		},
		{
			name:    "dangling local ref",
			spec:    tool.Spec{Schema: json.RawMessage(`{"type":"object","properties":{"a":{"$ref":"#/$defs/nope"}}}`)},
			wantErr: "prefix:" + `tool "t": schema does not compile: `,
		},
		{
			name:    "unsupported draft",
			spec:    tool.Spec{Schema: json.RawMessage(`{"$schema":"http://json-schema.org/draft-04/schema#","type":"object"}`)},
			wantErr: `tool "t": schema: "$schema" "http://json-schema.org/draft-04/schema#" is not supported; write draft 2020-12 ("https://json-schema.org/draft/2020-12/schema") or draft-07 ("http://json-schema.org/draft-07/schema#"), or leave "$schema" out: invalid argument`,
		},
		{name: "draft-07", spec: tool.Spec{Schema: json.RawMessage(`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","definitions":{"p":{"type":"string"}},"properties":{"a":{"$ref":"#/definitions/p"}}}`)}},
		{name: "bad tier", spec: tool.Spec{Schema: json.RawMessage(objectSchema), Tier: 7}, wantErr: `tool "t" has unknown tier 7: invalid argument`},
		{name: "negative timeout", spec: tool.Spec{Schema: json.RawMessage(objectSchema), Timeout: -time.Second}, wantErr: `tool "t" has a negative timeout -1s: invalid argument`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec
			spec.Name = "t"
			err := tool.NewRegistry().Register(&fakeTool{spec: spec})
			if prefix, ok := strings.CutPrefix(tt.wantErr, "prefix:"); ok {
				if err == nil || !strings.HasPrefix(err.Error(), prefix) || !errors.Is(err, errs.InvalidArgument) {
					t.Fatalf("err = %v, want prefix %q wrapping InvalidArgument", err, prefix)
				}
				return
			}
			checkErr(t, err, tt.wantErr, errs.InvalidArgument)
		})
	}
}

func TestRegisterNil(t *testing.T) {
	r := tool.NewRegistry()
	checkErr(t, r.Register(nil), "tool is nil: invalid argument", errs.InvalidArgument)
	checkErr(t, r.RegisterEffect(nil), "effect tool is nil: invalid argument", errs.InvalidArgument)
}

func TestLookup(t *testing.T) {
	r := tool.NewRegistry()
	mustRegister(t, r, &fakeTool{spec: tool.Spec{Name: "read", Description: "reads", Schema: json.RawMessage("{ \"type\" : \"object\" }"), Tier: tool.ReadOnly, Timeout: time.Second}})
	if err := r.RegisterEffect(&fakeEffect{spec: tool.Spec{Name: "signal", Schema: json.RawMessage(objectSchema)}}); err != nil {
		t.Fatal(err)
	}
	e, ok := r.Lookup("read")
	if !ok || e.Effect || e.Spec.Name != "read" || e.Spec.Description != "reads" || e.Spec.Tier != tool.ReadOnly ||
		e.Spec.Timeout != time.Second || string(e.Spec.Schema) != objectSchema {
		t.Errorf("Lookup(read) = %+v, %v", e, ok)
	}
	e.Spec.Schema[0] = 'X' // the caller's copy
	if e, _ := r.Lookup("read"); string(e.Spec.Schema) != objectSchema {
		t.Errorf("schema changed through a Lookup result: %s", e.Spec.Schema)
	}
	if e, ok := r.Lookup("signal"); !ok || !e.Effect {
		t.Errorf("Lookup(signal) = %+v, %v; want an effect tool", e, ok)
	}
	if _, ok := r.Lookup("bash"); ok {
		t.Error("Lookup(bash) found an unregistered tool")
	}
}

func TestSpecs(t *testing.T) {
	r := tool.NewRegistry()
	mustRegister(t, r, newTool("write", objectSchema, nil), newTool("read", objectSchema, nil), newTool("edit", objectSchema, nil))
	tests := []struct {
		name     string
		allowed  []string
		restrict bool
		want     []string
		wantErr  string
	}{
		{name: "all", want: []string{"edit", "read", "write"}},
		{name: "all ignores allowed", allowed: []string{"read"}, want: []string{"edit", "read", "write"}},
		{name: "restricted to none", restrict: true, want: []string{}},
		{name: "restricted to empty list", allowed: []string{}, restrict: true, want: []string{}},
		{name: "restricted", allowed: []string{"write", "read", "write"}, restrict: true, want: []string{"read", "write"}},
		{
			name: "unknown", allowed: []string{"read", "bash"}, restrict: true,
			wantErr: `allowed tool "bash" is not registered (registered tools: edit, read, write): invalid argument`,
		},
		{
			name: "unknowns", allowed: []string{"web", "read", "bash", "web"}, restrict: true,
			wantErr: `allowed tools "bash", "web" are not registered (registered tools: edit, read, write): invalid argument`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			specs, err := r.Specs(tt.allowed, tt.restrict)
			checkErr(t, err, tt.wantErr, errs.InvalidArgument)
			if tt.wantErr != "" {
				return
			}
			got := []string{}
			for _, s := range specs {
				got = append(got, s.Name)
				want := provider.ToolSpec{Name: s.Name, Description: "the " + s.Name + " tool", InputSchema: json.RawMessage(objectSchema)}
				if s.Description != want.Description || string(s.InputSchema) != objectSchema {
					t.Errorf("spec = %+v, want %+v", s, want)
				}
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("names = %q, want %q", got, tt.want)
			}
		})
	}
	if specs, err := tool.NewRegistry().Specs([]string{"read"}, true); err == nil || specs != nil ||
		err.Error() != `allowed tool "read" is not registered (registered tools: none): invalid argument` {
		t.Errorf("empty registry: Specs = %v, %v", specs, err)
	}
}

const readSchema = `{
  "type": "object",
  "properties": {
    "path": {"type": "string", "description": "File path."},
    "offset": {"type": "integer", "minimum": 1},
    "mode": {"enum": ["a", "b"]},
    "n": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    "o": {"type": "object", "properties": {"x": {"$ref": "#/$defs/x"}}, "required": ["x"], "additionalProperties": false},
    "a~b/c": {"type": "boolean"}
  },
  "$defs": {"x": {"type": "string", "minLength": 2}},
  "required": ["path"],
  "additionalProperties": false
}`

// readSchemaCompact is readSchema as the model sees it after malformed
// JSON (keys sorted).
const readSchemaCompact = `{"$defs":{"x":{"minLength":2,"type":"string"}},"additionalProperties":false,"properties":{"a~b/c":{"type":"boolean"},"mode":{"enum":["a","b"]},"n":{"anyOf":[{"type":"integer"},{"type":"null"}]},"o":{"additionalProperties":false,"properties":{"x":{"$ref":"#/$defs/x"}},"required":["x"],"type":"object"},"offset":{"minimum":1,"type":"integer"},"path":{"description":"File path.","type":"string"}},"required":["path"],"type":"object"}`

func TestValidate(t *testing.T) {
	r := tool.NewRegistry()
	mustRegister(t, r, newTool("read", readSchema, nil))
	tests := []struct {
		name    string
		input   string
		want    string // the normalized input on success
		wantErr string
	}{
		{name: "valid", input: ` {"path": "a.txt", "offset": 3} `, want: `{"path": "a.txt", "offset": 3}`},
		{name: "big integer", input: `{"path":"a","offset":123456789012345678901234567890}`, want: `{"path":"a","offset":123456789012345678901234567890}`},
		{name: "escaped key", input: `{"path":"a","a~b/c":true}`, want: `{"path":"a","a~b/c":true}`},
		{
			name:  "empty input is {}",
			input: ``,
			wantErr: `invalid input for tool "read"; fix it and call the tool again:
- at /path: missing required property "path"; schema: {"description":"File path.","type":"string"}`,
		},
		{
			name:  "missing required",
			input: `{"offset": 2}`,
			wantErr: `invalid input for tool "read"; fix it and call the tool again:
- at /path: missing required property "path"; schema: {"description":"File path.","type":"string"}`,
		},
		{
			name:  "wrong type",
			input: `{"path": 5}`,
			wantErr: `invalid input for tool "read"; fix it and call the tool again:
- at /path: got number, want string; schema: {"description":"File path.","type":"string"}`,
		},
		{
			name:  "not an integer",
			input: `{"path": "a", "offset": 1.5}`,
			wantErr: `invalid input for tool "read"; fix it and call the tool again:
- at /offset: got number, want integer; schema: {"minimum":1,"type":"integer"}`,
		},
		{
			name:  "additional property",
			input: `{"path": "a", "foo": 1}`,
			wantErr: `invalid input for tool "read"; fix it and call the tool again:
- at /foo: property "foo" is not allowed; allowed properties: "a~b/c", "mode", "n", "o", "offset", "path"`,
		},
		{
			name:  "nested and escaped",
			input: `{"path": "a", "o": {"x": "1", "y/z": 2}, "a~b/c": 1}`,
			wantErr: `invalid input for tool "read" (3 problems); fix them and call the tool again:
- at /a~0b~1c: got number, want boolean; schema: {"type":"boolean"}
- at /o/x: minLength: got 1 character, want at least 2; schema: {"minLength":2,"type":"string"}
- at /o/y~1z: property "y/z" is not allowed; allowed properties: "x"`,
		},
		{
			name:  "many problems",
			input: `{"path": 5, "foo": 1, "offset": "x", "mode": "c", "n": "s", "o": {"y": 1}}`,
			wantErr: `invalid input for tool "read" (7 problems); fix them and call the tool again:
- at /foo: property "foo" is not allowed; allowed properties: "a~b/c", "mode", "n", "o", "offset", "path"
- at /mode: value must be one of "a", "b"; schema: {"enum":["a","b"]}
- at /n: matches none of the alternatives in anyOf; schema: {"anyOf":[{"type":"integer"},{"type":"null"}]}
- at /o/x: missing required property "x"; schema: {"$ref":"#/$defs/x"}
- at /o/y: property "y" is not allowed; allowed properties: "x"
- at /offset: got string, want integer; schema: {"minimum":1,"type":"integer"}
- at /path: got number, want string; schema: {"description":"File path.","type":"string"}`,
		},
		{
			name:    "malformed: trailing comma",
			input:   `{"path": "a.txt",}`,
			wantErr: `invalid input for tool "read": the arguments are not valid JSON: invalid character '}' looking for beginning of object key string (line 1, column 18, byte 17), near "{\"path\": \"a.txt\",}". Send one JSON object that matches the tool's input schema: ` + readSchemaCompact,
		},
		{
			name:    "malformed: missing comma on line 3",
			input:   "{\n  \"path\": \"a\"\n  \"offset\": 1}",
			wantErr: `invalid input for tool "read": the arguments are not valid JSON: invalid character '"' after object key:value pair (line 3, column 3, byte 18), near "{\n  \"path\": \"a\"\n  \"offset\": 1}". Send one JSON object that matches the tool's input schema: ` + readSchemaCompact,
		},
		{
			name:    "malformed: cut off",
			input:   `{"path": "a`,
			wantErr: `invalid input for tool "read": the arguments are not valid JSON: unexpected end of JSON input, the JSON is cut off (line 1, column 12, byte 11), near "{\"path\": \"a". Send one JSON object that matches the tool's input schema: ` + readSchemaCompact,
		},
		{
			name:    "malformed: two objects",
			input:   `{"path":"a"} {"path":"b"}`,
			wantErr: `invalid input for tool "read": the arguments are not valid JSON: unexpected data after the first JSON value (line 1, column 13, byte 12), near "{\"path\":\"a\"} {\"path\":\"b\"}". Send one JSON object that matches the tool's input schema: ` + readSchemaCompact,
		},
		{
			name:    "malformed: snippet is cut",
			input:   `{"path": "` + strings.Repeat("x", 40) + `" "offset": 1, "mode": "` + strings.Repeat("y", 40) + `"}`,
			wantErr: `invalid input for tool "read": the arguments are not valid JSON: invalid character '"' after object key:value pair (line 1, column 53, byte 52), near …"xxxxxxxxxxxxxxxxxxxxxx\" \"offset\": 1, \"mode\": \"yy"…. Send one JSON object that matches the tool's input schema: ` + readSchemaCompact,
		},
		{
			name:  "array",
			input: `[1]`,
			wantErr: `invalid input for tool "read"; fix it and call the tool again:
- at (root): got array, want object; schema: ` + readSchemaCompact,
		},
		{
			name:  "object inside a string",
			input: `"{\"path\": \"a\"}"`,
			wantErr: `invalid input for tool "read"; fix it and call the tool again:
- at (root): got string, want object; schema: ` + readSchemaCompact + `
The arguments are a JSON string that holds an object; send the object itself, not a string.`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Validate("read", json.RawMessage(tt.input))
			checkErr(t, err, tt.wantErr, errs.InvalidArgument)
			if tt.wantErr != "" {
				var ve *tool.ValidationError
				if !errors.As(err, &ve) || ve.Tool != "read" {
					t.Errorf("err is %T, want *tool.ValidationError for read", err)
				}
				return
			}
			if string(got) != tt.want {
				t.Errorf("Validate = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestValidationErrorFields(t *testing.T) {
	r := tool.NewRegistry()
	mustRegister(t, r, newTool("read", readSchema, nil))
	_, err := r.Validate("read", json.RawMessage(`{"foo": 1, "offset": "x"}`))
	var ve *tool.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err = %v, want *ValidationError", err)
	}
	want := []tool.Problem{
		{Pointer: "/foo", Message: `property "foo" is not allowed`, Allowed: []string{"a~b/c", "mode", "n", "o", "offset", "path"}},
		{Pointer: "/offset", Message: "got string, want integer", Schema: `{"minimum":1,"type":"integer"}`},
		{Pointer: "/path", Message: `missing required property "path"`, Schema: `{"description":"File path.","type":"string"}`},
	}
	if ve.Malformed || fmt.Sprint(ve.Problems) != fmt.Sprint(want) {
		t.Errorf("Problems = %+v (malformed %v), want %+v", ve.Problems, ve.Malformed, want)
	}
	_, err = r.Validate("read", json.RawMessage(`{`))
	if !errors.As(err, &ve) || !ve.Malformed || len(ve.Problems) != 1 || ve.Problems[0].Pointer != "" {
		t.Errorf("malformed: %+v", ve)
	}
}

func TestValidateBounded(t *testing.T) {
	var props, input []string
	for i := range 20 {
		props = append(props, fmt.Sprintf(`"p%02d":{"type":"string","description":%q}`, i, strings.Repeat("long words ", 40)))
		input = append(input, fmt.Sprintf(`"p%02d":%d`, i, i))
	}
	r := tool.NewRegistry()
	mustRegister(t, r, newTool("big", `{"type":"object","properties":{`+strings.Join(props, ",")+`}}`, nil))
	_, err := r.Validate("big", json.RawMessage("{"+strings.Join(input, ",")+"}"))
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	if len(msg) > 2000 {
		t.Errorf("message is %d bytes, want a bounded message:\n%s", len(msg), msg)
	}
	for _, want := range []string{
		`invalid input for tool "big" (20 problems)`,
		// the descriptions make the fragment too long: they are dropped
		"\n- at /p00: got number, want string; schema: {\"type\":\"string\"}\n",
		"\n- at /p07: got number, want string",
		"\n- and 12 more",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "/p08") {
		t.Errorf("message lists more than 8 problems:\n%s", msg)
	}

	// A fragment too long even without annotations is cut.
	enum := make([]string, 40)
	for i := range enum {
		enum[i] = fmt.Sprintf("%q", fmt.Sprintf("value-%02d", i))
	}
	mustRegister(t, r, newTool("enum", `{"type":"object","properties":{"e":{"enum":[`+strings.Join(enum, ",")+`]}}}`, nil))
	_, err = r.Validate("enum", json.RawMessage(`{"e":"x"}`))
	if err == nil {
		t.Fatal("no error")
	}
	want := `; schema: {"enum":["value-00","value-01",`
	if msg := err.Error(); !strings.Contains(msg, want) || !strings.HasSuffix(msg, "…") || len(msg) > 1500 {
		t.Errorf("message (%d bytes) lacks %q or the cut mark:\n%s", len(msg), want, msg)
	}
}

func TestValidateUnknownTool(t *testing.T) {
	r := tool.NewRegistry()
	mustRegister(t, r, newTool("read", objectSchema, nil), newTool("edit", objectSchema, nil))
	_, err := r.Validate("bash", json.RawMessage(`{}`))
	checkErr(t, err, `unknown tool "bash"; available tools: edit, read`, errs.NotFound)
}

func TestCall(t *testing.T) {
	r := tool.NewRegistry()
	mustRegister(t, r,
		newTool("echo", `{"type":"object","properties":{"s":{"type":"string"}},"required":["s"]}`, func(_ context.Context, in json.RawMessage) (string, error) {
			var args struct{ S string }
			if err := json.Unmarshal(in, &args); err != nil {
				return "", err
			}
			return args.S, nil
		}),
		newTool("fail", objectSchema, func(context.Context, json.RawMessage) (string, error) {
			return "", errors.New("no such file: a.txt")
		}),
		newTool("partial", objectSchema, func(context.Context, json.RawMessage) (string, error) {
			return "line 1\nline 2\n", errors.New("exit status 1")
		}),
		newTool("silent-fail", objectSchema, func(context.Context, json.RawMessage) (string, error) {
			return "", errors.New("")
		}),
		newTool("binary", objectSchema, func(context.Context, json.RawMessage) (string, error) {
			return "a\xffb\xc3", nil
		}),
		newTool("input", objectSchema, nil),
	)
	if err := r.RegisterEffect(&fakeEffect{spec: tool.Spec{Name: "signal", Schema: json.RawMessage(objectSchema)}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, tool, input string
		want              string
		wantErr           bool
	}{
		{name: "ok", tool: "echo", input: `{"s":"hi"}`, want: "hi"},
		{name: "empty input", tool: "input", input: ``, want: "{}"},
		{name: "tool error", tool: "fail", input: `{}`, want: "no such file: a.txt", wantErr: true},
		{name: "output and error", tool: "partial", input: `{}`, want: "line 1\nline 2\n\nexit status 1", wantErr: true},
		{name: "empty error", tool: "silent-fail", input: `{}`, want: `tool "silent-fail" failed without a message`, wantErr: true},
		{name: "invalid UTF-8", tool: "binary", input: `{}`, want: "a\uFFFDb\uFFFD"},
		{
			name: "validation", tool: "echo", input: `{"s":1}`, wantErr: true,
			want: "invalid input for tool \"echo\"; fix it and call the tool again:\n- at /s: got number, want string; schema: {\"type\":\"string\"}",
		},
		{name: "unknown", tool: "bash", input: `{}`, want: `unknown tool "bash"; available tools: binary, echo, fail, input, partial, signal, silent-fail`, wantErr: true},
		{name: "effect tool", tool: "signal", input: `{}`, want: `tool "signal" declares an effect and is not run by Call; this is an operator bug`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := r.Call(context.Background(), tt.tool, json.RawMessage(tt.input))
			if o.Content != tt.want || o.IsError != tt.wantErr || o.Truncated {
				t.Errorf("Call = %+v, want content %q, error %v", o, tt.want, tt.wantErr)
			}
			if o.Duration <= 0 {
				t.Errorf("Duration = %v", o.Duration)
			}
		})
	}
}

func TestCallTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	r := tool.NewRegistry(tool.WithDefaultTimeout(20 * time.Millisecond))
	mustRegister(t, r,
		// honours its context
		newTool("wait", objectSchema, func(ctx context.Context, _ json.RawMessage) (string, error) {
			<-ctx.Done()
			return "", ctx.Err()
		}),
		// ignores its context; Call must return all the same
		newTool("stuck", objectSchema, func(context.Context, json.RawMessage) (string, error) {
			<-release
			return "late", nil
		}),
		&fakeTool{spec: tool.Spec{Name: "own", Schema: json.RawMessage(objectSchema), Timeout: 30 * time.Millisecond},
			call: func(ctx context.Context, _ json.RawMessage) (string, error) {
				deadline, _ := ctx.Deadline()
				if d := time.Until(deadline); d > 30*time.Millisecond || d < 10*time.Millisecond {
					return "", fmt.Errorf("deadline in %v, want about 30ms", d)
				}
				<-ctx.Done()
				return "partial output", ctx.Err()
			}},
	)
	tests := []struct{ tool, want string }{
		{"wait", `tool "wait" exceeded its timeout of 20ms and was canceled`},
		{"stuck", `tool "stuck" exceeded its timeout of 20ms and was canceled`},
		{"own", "partial output\n\n" + `tool "own" exceeded its timeout of 30ms and was canceled`},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			start := time.Now()
			o := r.Call(context.Background(), tt.tool, nil)
			if o.Content != tt.want || !o.IsError {
				t.Errorf("Call = %+v, want error %q", o, tt.want)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("Call took %v", el)
			}
		})
	}
}

func TestCallCanceled(t *testing.T) {
	r := tool.NewRegistry()
	started := make(chan struct{})
	mustRegister(t, r, newTool("wait", objectSchema, func(ctx context.Context, _ json.RawMessage) (string, error) {
		close(started)
		<-ctx.Done()
		return "", ctx.Err()
	}))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	o := r.Call(ctx, "wait", nil)
	want := `tool "wait" was canceled: the invocation ended before it finished`
	if o.Content != want || !o.IsError {
		t.Errorf("Call = %+v, want error %q", o, want)
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("ctx.Err() = %v", ctx.Err())
	}
	o = r.Call(ctx, "wait", nil)
	want = `tool "wait" was not run: the invocation was canceled`
	if o.Content != want || !o.IsError {
		t.Errorf("Call after cancel = %+v, want error %q", o, want)
	}
}

func TestCallPanic(t *testing.T) {
	r := tool.NewRegistry()
	mustRegister(t, r, newTool("boom", objectSchema, func(context.Context, json.RawMessage) (string, error) {
		var m map[string]int
		m["secret-token"]++ // assignment to a nil map
		return "", nil
	}))
	o := r.Call(context.Background(), "boom", nil)
	want := `tool "boom" failed with an internal error (it crashed)`
	if o.Content != want || !o.IsError {
		t.Errorf("Call = %+v, want error %q", o, want)
	}
}

func TestCallPanicLogged(t *testing.T) {
	var buf bytes.Buffer
	r := tool.NewRegistry(tool.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	mustRegister(t, r, newTool("boom", objectSchema, func(context.Context, json.RawMessage) (string, error) { panic("kaput") }))
	if o := r.Call(context.Background(), "boom", nil); !o.IsError || strings.Contains(o.Content, "kaput") {
		t.Errorf("Call = %+v: want an error without the panic value", o)
	}
	for _, want := range []string{`msg="tool panicked" tool=boom panic=kaput stack=`, "registry_test.go"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestCallTruncation(t *testing.T) {
	tests := []struct {
		name          string
		max           int
		out           string
		want          string
		wantTruncated bool
		wantOrig      int
	}{
		{name: "fits", max: 10, out: "0123456789", want: "0123456789", wantOrig: 10},
		{name: "cut", max: 10, out: "0123456789abc", want: "0123456789\n[output truncated: showing first 10 of 13 bytes]", wantTruncated: true, wantOrig: 13},
		{name: "rune boundary", max: 10, out: "012345678é_", want: "012345678\n[output truncated: showing first 9 of 12 bytes]", wantTruncated: true, wantOrig: 12},
		{name: "default 64KiB", out: strings.Repeat("x", 1<<20), want: strings.Repeat("x", 65536) + "\n[output truncated: showing first 65536 of 1048576 bytes]", wantTruncated: true, wantOrig: 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tool.NewRegistry(tool.WithMaxOutputBytes(tt.max))
			mustRegister(t, r, newTool("big", objectSchema, func(context.Context, json.RawMessage) (string, error) { return tt.out, nil }))
			o := r.Call(context.Background(), "big", nil)
			if o.Content != tt.want || o.Truncated != tt.wantTruncated || o.OriginalBytes != tt.wantOrig || o.IsError {
				got := o.Content
				if len(got) > 100 {
					got = "…" + got[len(got)-100:]
				}
				t.Errorf("Call = %q truncated %v orig %d, want truncated %v orig %d", got, o.Truncated, o.OriginalBytes, tt.wantTruncated, tt.wantOrig)
			}
		})
	}
}

func TestCallConcurrent(t *testing.T) {
	r := tool.NewRegistry()
	mustRegister(t, r, newTool("echo", objectSchema, nil))
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			in := fmt.Sprintf(`{"i":%d}`, i)
			if o := r.Call(context.Background(), "echo", json.RawMessage(in)); o.Content != in {
				t.Errorf("Call = %+v, want %s", o, in)
			}
		})
		if i == 8 {
			mustRegister(t, r, newTool("late", objectSchema, nil))
		}
	}
	wg.Wait()
}

func TestDeclare(t *testing.T) {
	ack := "Signal sent."
	r := tool.NewRegistry()
	mustRegister(t, r, newTool("read", objectSchema, nil))
	schema := json.RawMessage(`{"type":"object","properties":{"workflow_id":{"type":"string"}},"required":["workflow_id"]}`)
	register := func(name string, declare func(tool.DeclareContext, json.RawMessage) (*typesv1.Effect, string, error)) {
		if err := r.RegisterEffect(&fakeEffect{spec: tool.Spec{Name: name, Schema: schema}, declare: declare}); err != nil {
			t.Fatal(err)
		}
	}
	signal := func(key string) *typesv1.Effect {
		return &typesv1.Effect{IdempotencyKey: key, Kind: &typesv1.Effect_Signal{Signal: &typesv1.SignalEffect{
			WorkflowId: "wf", Payload: &typesv1.SignalPayload{SignalType: "go"},
		}}}
	}
	register("signal", func(dc tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, string, error) {
		if string(in) != `{"workflow_id":"wf"}` {
			return nil, "", fmt.Errorf("input %s", in)
		}
		return signal(dc.IdempotencyKey), ack, nil
	})
	register("wrong-key", func(tool.DeclareContext, json.RawMessage) (*typesv1.Effect, string, error) {
		return signal("other"), ack, nil
	})
	register("nil", func(tool.DeclareContext, json.RawMessage) (*typesv1.Effect, string, error) { return nil, "", nil })
	register("refuse", func(tool.DeclareContext, json.RawMessage) (*typesv1.Effect, string, error) {
		return nil, "", tool.Errorf(errs.InvalidArgument, "no session")
	})
	register("boom", func(tool.DeclareContext, json.RawMessage) (*typesv1.Effect, string, error) { panic("boom") })

	dc := tool.DeclareContext{SessionID: "s", IdempotencyKey: "d1/0"}
	tests := []struct {
		name, tool, input string
		wantErr           string
		kind              *errs.Kind
	}{
		{name: "ok", tool: "signal", input: ` {"workflow_id":"wf"} `},
		{name: "validation", tool: "signal", input: `{}`, kind: errs.InvalidArgument,
			wantErr: "invalid input for tool \"signal\"; fix it and call the tool again:\n- at /workflow_id: missing required property \"workflow_id\"; schema: {\"type\":\"string\"}"},
		{name: "tool error", tool: "refuse", input: `{"workflow_id":"wf"}`, wantErr: "no session", kind: errs.InvalidArgument},
		{name: "wrong key", tool: "wrong-key", input: `{"workflow_id":"wf"}`, kind: errs.Internal,
			wantErr: `tool "wrong-key" declared an effect with idempotency key "other", want "d1/0"`},
		{name: "nil effect", tool: "nil", input: `{"workflow_id":"wf"}`, wantErr: `tool "nil" declared no effect`, kind: errs.Internal},
		{name: "panic", tool: "boom", input: `{"workflow_id":"wf"}`, wantErr: `tool "boom" failed with an internal error (it crashed)`, kind: errs.Internal},
		{name: "runnable", tool: "read", input: `{}`, wantErr: `tool "read" runs and declares no effect; use Call`, kind: errs.InvalidArgument},
		{name: "unknown", tool: "x", input: `{}`, wantErr: `unknown tool "x"; available tools: boom, nil, read, refuse, signal, wrong-key`, kind: errs.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eff, gotAck, err := r.Declare(dc, tt.tool, json.RawMessage(tt.input))
			checkErr(t, err, tt.wantErr, tt.kind)
			if tt.wantErr != "" {
				if eff != nil || gotAck != "" {
					t.Errorf("Declare = %v, %q with an error", eff, gotAck)
				}
				return
			}
			if !proto.Equal(eff, signal("d1/0")) || gotAck != ack {
				t.Errorf("Declare = %v, %q", eff, gotAck)
			}
		})
	}
}

func TestErrorf(t *testing.T) {
	err := tool.Errorf(errs.NotFound, "file %q not found", "a.txt")
	checkErr(t, err, `file "a.txt" not found`, errs.NotFound)
	if errors.Is(err, errs.InvalidArgument) {
		t.Error("Errorf wraps the wrong kind")
	}
}

// TestValidateKeywords checks that each kind of violation is reported at
// the pointer of the offending value in the input and names the rule, for
// the keywords tool schemas use beyond readSchema's.
func TestValidateKeywords(t *testing.T) {
	tests := []struct {
		name, schema, input string
		want                []string // "pointer: message", sorted
	}{
		{
			name:   "array items by index",
			schema: `{"type":"object","properties":{"edits":{"type":"array","maxItems":2,"items":{"type":"object","properties":{"line":{"type":"integer","minimum":1}},"required":["line"]}}}}`,
			input:  `{"edits":[{"line":1},{"line":0},{},{"line":"x"}]}`,
			want: []string{
				"/edits: maxItems: got 4 items, want at most 2",
				"/edits/1/line: minimum: got 0, want at least 1",
				`/edits/2/line: missing required property "line"`,
				"/edits/3/line: got string, want integer",
			},
		},
		{
			name:   "strings",
			schema: `{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-z]+$","maxLength":3}}}`,
			input:  `{"id":"Abcd"}`,
			want:   []string{"/id: maxLength: got 4 characters, want at most 3", `/id: pattern: the string does not match "^[a-z]+$"`},
		},
		{
			name:   "numbers",
			schema: `{"type":"object","properties":{"a":{"exclusiveMaximum":10},"b":{"multipleOf":0.5},"c":{"const":3}}}`,
			input:  `{"a":10,"b":1.25,"c":3.5}`,
			want:   []string{"/a: exclusiveMaximum: got 10, want less than 10", "/b: multipleOf: got 1.25, want a multiple of 0.5", "/c: value must be 3"},
		},
		{
			name:   "oneOf twice and not",
			schema: `{"type":"object","properties":{"v":{"oneOf":[{"type":"integer"},{"type":"number"}]},"w":{"not":{"type":"null"}}}}`,
			input:  `{"v":2,"w":null}`,
			want:   []string{"/v: matches more than one alternative in oneOf (alternatives 0 and 1); it must match exactly one", `/w: must not match the schema under "not"`},
		},
		{
			name:   "draft-07 tuple and ref siblings",
			schema: `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","definitions":{"s":{"type":"string"}},"properties":{"p":{"type":"array","items":[{"$ref":"#/definitions/s"},{"type":"integer"}],"additionalItems":false}}}`,
			input:  `{"p":[1,"x",true]}`,
			want:   []string{"/p/0: got number, want string", "/p/1: got string, want integer", "/p/2: no value is allowed here"},
		},
		{
			name:   "dependentRequired and uniqueItems",
			schema: `{"type":"object","properties":{"tags":{"type":"array","uniqueItems":true}},"dependentRequired":{"start":["end"]}}`,
			input:  `{"start":1,"tags":["a","b","a"]}`,
			want:   []string{`/end: missing required property "end" (required when "start" is given)`, "/tags: uniqueItems: items 0 and 2 are equal"},
		},
		{
			name:   "unevaluatedProperties through allOf",
			schema: `{"type":"object","allOf":[{"properties":{"a":{"type":"string"}}}],"properties":{"b":{"type":"string"}},"unevaluatedProperties":false}`,
			input:  `{"a":"x","b":"y","c":1}`,
			want:   []string{`/c: property "c" is not allowed`},
		},
		{
			name:   "number out of range",
			schema: `{"type":"object"}`,
			input:  `{"n":[1e400]}`,
			want:   []string{"/n/0: number 1e400 is out of range; numbers must fit a 64-bit float"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tool.NewRegistry()
			mustRegister(t, r, newTool("k", tt.schema, nil))
			_, err := r.Validate("k", json.RawMessage(tt.input))
			var ve *tool.ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, errs.InvalidArgument) {
				t.Fatalf("err = %v, want a *ValidationError wrapping InvalidArgument", err)
			}
			var got []string
			for _, p := range ve.Problems {
				got = append(got, p.Pointer+": "+p.Message)
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("problems:\n%s\nwant\n%s\nmessage:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"), err)
			}
		})
	}
}

// TestValidateAcceptsValid checks that explain's keywords do not refuse
// what the schemas allow: valid inputs for the schemas of
// TestValidateKeywords pass.
func TestValidateAcceptsValid(t *testing.T) {
	tests := []struct{ schema, input string }{
		{`{"type":"object","properties":{"edits":{"type":"array","maxItems":2,"items":{"type":"object","properties":{"line":{"type":"integer","minimum":1}},"required":["line"]}}}}`, `{"edits":[{"line":1},{"line":2.0}]}`},
		{`{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-z]+$","maxLength":3}}}`, `{"id":"abc"}`},
		{`{"type":"object","properties":{"a":{"exclusiveMaximum":10},"b":{"multipleOf":0.5},"c":{"const":3}}}`, `{"a":9.99,"b":1.5,"c":3.0}`},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","definitions":{"s":{"type":"string"}},"properties":{"p":{"type":"array","items":[{"$ref":"#/definitions/s"},{"type":"integer"}],"additionalItems":false}}}`, `{"p":["x",1]}`},
		{`{"type":"object","allOf":[{"properties":{"a":{"type":"string"}}}],"properties":{"b":{"type":"string"}},"unevaluatedProperties":false}`, `{"a":"x","b":"y"}`},
	}
	for _, tt := range tests {
		r := tool.NewRegistry()
		mustRegister(t, r, newTool("k", tt.schema, nil))
		if _, err := r.Validate("k", json.RawMessage(tt.input)); err != nil {
			t.Errorf("Validate(%s) against %s: %v", tt.input, tt.schema, err)
		}
	}
}
