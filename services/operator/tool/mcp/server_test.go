package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// The test binary doubles as a stdio MCP server: run with
// serverModeEnv=1 it serves newTestServer on stdin/stdout and exits; with
// serverModeEnv=crash it writes to stderr and exits 3 before speaking MCP.
const serverModeEnv = "NEURON_TEST_MCP_SERVER"

// secretEnv is set in the test process; a stdio server must not see it.
const secretEnv = "SECRET_FOR_TEST"

func TestMain(m *testing.M) {
	switch os.Getenv(serverModeEnv) {
	case "":
		os.Exit(m.Run())
	case "1":
		srv := newTestServer(new(atomic.Int64))
		if err := srv.Run(context.Background(), &sdk.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "test server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "crash":
		fmt.Fprintln(os.Stderr, "starting test server")
		fmt.Fprintln(os.Stderr, "fatal: config file /etc/neuron-test.json is missing")
		os.Exit(3)
	default:
		fmt.Fprintln(os.Stderr, "unknown", serverModeEnv)
		os.Exit(2)
	}
}

type addArgs struct {
	A int `json:"a"`
	B int `json:"b"`
}

type echoArgs struct {
	Message string `json:"message" jsonschema:"the text to echo"`
}

type noArgs struct{}

// longToolName is an MCP tool name too long for the registry once
// prefixed.
var longToolName = strings.Repeat("x", 70)

// textResult is a result with one text item.
func textResult(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

// newTestServer builds the MCP server of the tests; addCalls counts the
// calls of "add" that reached it. PageSize 2 makes tools/list paginate.
func newTestServer(addCalls *atomic.Int64) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "test-server", Version: "v0.0.1"}, &sdk.ServerOptions{PageSize: 2})
	sdk.AddTool(s, &sdk.Tool{Name: "add", Description: "Add two integers."},
		func(_ context.Context, _ *sdk.CallToolRequest, in addArgs) (*sdk.CallToolResult, any, error) {
			addCalls.Add(1)
			return textResult(strconv.Itoa(in.A + in.B)), nil, nil
		})
	sdk.AddTool(s, &sdk.Tool{Name: "fail", Description: "Always fails."},
		func(context.Context, *sdk.CallToolRequest, noArgs) (*sdk.CallToolResult, any, error) {
			return nil, nil, errors.New("disk is full")
		})
	sdk.AddTool(s, &sdk.Tool{Name: "echo", Description: "Echo a message.", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *sdk.CallToolRequest, in echoArgs) (*sdk.CallToolResult, any, error) {
			return textResult(in.Message), nil, nil
		})
	sdk.AddTool(s, &sdk.Tool{Name: "env", Title: "Environment probe"},
		func(context.Context, *sdk.CallToolRequest, noArgs) (*sdk.CallToolResult, any, error) {
			_, hasPath := os.LookupEnv("PATH")
			return textResult(fmt.Sprintf("secret=%q visible=%q path=%t", os.Getenv(secretEnv), os.Getenv("VISIBLE"), hasPath)), nil, nil
		})
	s.AddTool(&sdk.Tool{Name: "stats", Description: "Structured output only.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{}, StructuredContent: map[string]any{"count": 3, "ok": true}}, nil
		})
	s.AddTool(&sdk.Tool{Name: "media", Description: "Mixed content.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{
				&sdk.TextContent{Text: "here you go"},
				&sdk.ImageContent{MIMEType: "image/png", Data: []byte("12345")},
				&sdk.EmbeddedResource{Resource: &sdk.ResourceContents{URI: "file:///a.txt", MIMEType: "text/plain", Text: "alpha"}},
			}, StructuredContent: map[string]any{"ignored": true}}, nil
		})
	s.AddTool(&sdk.Tool{Name: "mute", Description: "Fails without a message.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{}, IsError: true}, nil
		})
	sdk.AddTool(s, &sdk.Tool{Name: "files.read", Description: "A name with a dot."},
		func(context.Context, *sdk.CallToolRequest, noArgs) (*sdk.CallToolResult, any, error) {
			return textResult("read ok"), nil, nil
		})
	sdk.AddTool(s, &sdk.Tool{Name: longToolName, Description: "A long name."},
		func(context.Context, *sdk.CallToolRequest, noArgs) (*sdk.CallToolResult, any, error) {
			return textResult("long ok"), nil, nil
		})
	sdk.AddTool(s, &sdk.Tool{Name: "sleep", Description: "Waits until canceled."},
		func(ctx context.Context, _ *sdk.CallToolRequest, _ noArgs) (*sdk.CallToolResult, any, error) {
			<-ctx.Done()
			return nil, nil, ctx.Err()
		})
	return s
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}
