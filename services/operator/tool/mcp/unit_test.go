package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

func hash8(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:8]
}

type stubTool struct{ name string }

func (s stubTool) Spec() tool.Spec {
	return tool.Spec{Name: s.name, Schema: json.RawMessage(`{"type":"object"}`)}
}
func (stubTool) Call(context.Context, json.RawMessage) (string, error) { return "", nil }

func TestToolName(t *testing.T) {
	server32 := strings.Repeat("s", 32)
	cases := []struct{ server, tool, want string }{
		{"fs", "read_file", "fs__read_file"},
		{"fs", "read-file", "fs__read-file"},
		{"fs", "a_b", "fs__a_b"},
		{"fs", "a.b", "fs__a_b-" + hash8("a.b")},
		{"fs", "files.read", "fs__files_read-" + hash8("files.read")},
		{"fs", "lire_é", "fs__lire___-" + hash8("lire_é")},
		{"fs", "a b/c", "fs__a_b_c-" + hash8("a b/c")},
		{"fs", strings.Repeat("x", 60), "fs__" + strings.Repeat("x", 60)},
		{"fs", strings.Repeat("x", 61), "fs__" + strings.Repeat("x", 51) + "-" + hash8(strings.Repeat("x", 61))},
		{server32, strings.Repeat("y", 40), server32 + "__" + strings.Repeat("y", 21) + "-" + hash8(strings.Repeat("y", 40))},
	}
	reg := tool.NewRegistry()
	for _, tc := range cases {
		got := ToolName(tc.server, tc.tool)
		if got != tc.want {
			t.Errorf("ToolName(%q, %q) = %q, want %q", tc.server, tc.tool, got, tc.want)
		}
		if got != ToolName(tc.server, tc.tool) {
			t.Errorf("ToolName(%q, %q) is not deterministic", tc.server, tc.tool)
		}
		// Every name is acceptable to the registry.
		if err := reg.Register(stubTool{got}); err != nil {
			t.Errorf("Register(%q): %v", got, err)
		}
	}
}

func TestParseConfig(t *testing.T) {
	good := `{"servers":[
		{"name":"fs","command":["/usr/bin/mcp-fs","--root","/data"],"env":["HOME=/home/op","EMPTY="],"timeout":"30s","read_only":["read_file"]},
		{"name":"web","url":"https://127.0.0.1:9000/mcp","headers":{"Authorization":"Bearer ${TOKEN}"}}
	]}`
	got, err := ParseConfig([]byte(good))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	want := []Server{
		{Name: "fs", Command: []string{"/usr/bin/mcp-fs", "--root", "/data"}, Env: []string{"HOME=/home/op", "EMPTY="},
			Timeout: 30 * time.Second, ReadOnly: []string{"read_file"}},
		{Name: "web", URL: "https://127.0.0.1:9000/mcp", Headers: map[string]string{"Authorization": "Bearer ${TOKEN}"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseConfig =\n%#v\nwant\n%#v", got, want)
	}
	if got, err := ParseConfig([]byte(` {"servers": []} `)); err != nil || len(got) != 0 {
		t.Errorf("empty list: %v, %v", got, err)
	}

	bad := []struct{ name, json, want string }{
		{"empty input", ``, `must be a JSON object`},
		{"null", `null`, `must be a JSON object`},
		{"array", `[]`, `must be a JSON object`},
		{"no servers", `{}`, `missing the "servers" list`},
		{"null servers", `{"servers":null}`, `missing the "servers" list`},
		{"unknown top-level field", `{"servers":[],"extra":1}`, `unknown field "extra"`},
		{"unknown server field", `{"servers":[{"name":"a","url":"http://x","token":"t"}]}`, `unknown field "token"`},
		{"trailing data", `{"servers":[]} {}`, `unexpected data after the top-level object`},
		{"syntax error", `{"servers":[}`, `invalid character`},
		{"wrong type", `{"servers":[{"name":"a","command":"/bin/x"}]}`, `cannot unmarshal`},
		{"both transports", `{"servers":[{"name":"a","command":["x"],"url":"http://x"}]}`, `servers[0]: MCP server "a": set either command or url, not both`},
		{"no transport", `{"servers":[{"name":"a"}]}`, `set command (stdio server) or url`},
		{"empty name", `{"servers":[{"url":"http://x"}]}`, `MCP server name is empty`},
		{"name with __", `{"servers":[{"name":"a__b","url":"http://x"}]}`, `contains "__"`},
		{"name ending in _", `{"servers":[{"name":"a_","url":"http://x"}]}`, `ends with '_'`},
		{"name with a dot", `{"servers":[{"name":"a.b","url":"http://x"}]}`, `has '.' at byte 1`},
		{"long name", `{"servers":[{"name":"` + strings.Repeat("n", 33) + `","url":"http://x"}]}`, `is 33 bytes; the limit is 32`},
		{"empty program", `{"servers":[{"name":"a","command":[""]}]}`, `command has an empty program`},
		{"env without =", `{"servers":[{"name":"a","command":["x"],"env":["NOEQ"]}]}`, `env[0] is not KEY=VALUE`},
		{"env without key", `{"servers":[{"name":"a","command":["x"],"env":["A=1","=v"]}]}`, `env[1] is not KEY=VALUE`},
		{"env for url", `{"servers":[{"name":"a","url":"http://x","env":["A=1"]}]}`, `env applies only to a command server`},
		{"headers for command", `{"servers":[{"name":"a","command":["x"],"headers":{"A":"b"}}]}`, `headers and an HTTP client apply only to a url server`},
		{"ftp url", `{"servers":[{"name":"a","url":"ftp://x/mcp"}]}`, `url must be an absolute http or https URL`},
		{"relative url", `{"servers":[{"name":"a","url":"/mcp"}]}`, `url must be an absolute http or https URL`},
		{"reserved header", `{"servers":[{"name":"a","url":"http://x","headers":{"accept":"*/*"}}]}`, `header "accept" is set by the MCP transport`},
		{"bad header name", `{"servers":[{"name":"a","url":"http://x","headers":{"X Key":"v"}}]}`, `header name "X Key" is not a valid HTTP header name`},
		{"header value with newline", `{"servers":[{"name":"a","url":"http://x","headers":{"Authorization":"Bearer s3cr3t\nX: y"}}]}`, `the value of header "Authorization" contains CR, LF or NUL`},
		{"duplicate header", `{"servers":[{"name":"a","url":"http://x","headers":{"authorization":"1","Authorization":"2"}}]}`, `headers "Authorization" and "authorization" are the same header`},
		{"bad timeout", `{"servers":[{"name":"a","url":"http://x","timeout":"soon"}]}`, `timeout "soon" is not a duration`},
		{"negative timeout", `{"servers":[{"name":"a","url":"http://x","timeout":"-1s"}]}`, `negative timeout -1s`},
		{"empty read_only", `{"servers":[{"name":"a","url":"http://x","read_only":[""]}]}`, `read_only has an empty tool name`},
		{"duplicate names", `{"servers":[{"name":"a","url":"http://x"},{"name":"b","url":"http://y"},{"name":"a","command":["z"]}]}`, `servers[0] and servers[2] are both named "a"`},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.json))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, errs.InvalidArgument) {
				t.Errorf("err = %v, want errs.InvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v\nwant it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("a header value leaked into the error: %v", err)
			}
		})
	}
}

func TestFormatResult(t *testing.T) {
	size := int64(10)
	cases := []struct {
		name string
		res  *sdk.CallToolResult
		want string
	}{
		{"nil", nil, ""},
		{"empty", &sdk.CallToolResult{}, ""},
		{"texts", &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "a"}, &sdk.TextContent{Text: "b\n"}}}, "a\nb\n"},
		{"image and audio", &sdk.CallToolResult{Content: []sdk.Content{
			&sdk.ImageContent{MIMEType: "image/jpeg", Data: make([]byte, 1234)},
			&sdk.AudioContent{Data: []byte("ab")},
		}}, "[image: image/jpeg, 1234 bytes]\n[audio: unknown type, 2 bytes]"},
		{"resource links", &sdk.CallToolResult{Content: []sdk.Content{
			&sdk.ResourceLink{URI: "file:///x.md", Name: "x.md", MIMEType: "text/markdown", Size: &size},
			&sdk.ResourceLink{URI: "https://e.com/y"},
		}}, "[resource link: file:///x.md (x.md, text/markdown)]\n[resource link: https://e.com/y]"},
		{"embedded resources", &sdk.CallToolResult{Content: []sdk.Content{
			&sdk.EmbeddedResource{Resource: &sdk.ResourceContents{URI: "file:///b.bin", MIMEType: "application/octet-stream", Blob: []byte{1, 2, 3}}},
			&sdk.EmbeddedResource{Resource: &sdk.ResourceContents{URI: "file:///t.txt", Text: "line"}},
			&sdk.EmbeddedResource{},
		}}, "[resource: file:///b.bin, application/octet-stream, 3 bytes]\n[resource: file:///t.txt, unknown type]\nline\n[resource]"},
		{"unsupported", &sdk.CallToolResult{Content: []sdk.Content{&sdk.ToolUseContent{ID: "1", Name: "x"}}}, "[unsupported content]"},
		{"structured only", &sdk.CallToolResult{StructuredContent: map[string]any{"b": []int{1, 2}, "a": "x"}}, `{"a":"x","b":[1,2]}`},
		{"structured with a summary", &sdk.CallToolResult{
			Content:           []sdk.Content{&sdk.ImageContent{MIMEType: "image/png", Data: []byte{1}}},
			StructuredContent: []any{1, "two"},
		}, "[image: image/png, 1 bytes]\n[1,\"two\"]"},
		{"structured with text", &sdk.CallToolResult{
			Content:           []sdk.Content{&sdk.TextContent{Text: "3 files"}},
			StructuredContent: map[string]any{"count": 3},
		}, "3 files"},
	}
	for _, tc := range cases {
		if got := FormatResult(tc.res); got != tc.want {
			t.Errorf("%s: FormatResult = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestStderrLog(t *testing.T) {
	log, logs := newLogger()
	s := newStderrLog(log)
	long := strings.Repeat("z", maxStderrLine+100)
	for _, p := range []string{"first li", "ne\r\nsecond\n", long + "\n", "unfinished"} {
		if n, err := s.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	s.flush()
	out := logs.String()
	for _, w := range []string{
		`line="first line"`,
		`line=second`,
		`line="` + strings.Repeat("z", maxStderrLine) + ` [line truncated]"`,
		`line=unfinished`,
	} {
		if !strings.Contains(out, w) {
			t.Errorf("logs lack %.80q", w)
		}
	}
	if n := strings.Count(out, "MCP server stderr"); n != 4 {
		t.Errorf("%d lines logged, want 4", n)
	}
	tail := s.tail()
	if want := strings.Repeat("z", stderrTailLen-len("\nunfinished")) + "\nunfinished"; tail != want {
		t.Errorf("tail = %.60q... (%d bytes), want %d bytes", tail, len(tail), len(want))
	}
}
