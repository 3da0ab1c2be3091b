package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// mcpServerEnv makes this test binary a stdio MCP server (TestMain).
const mcpServerEnv = "NEURON_TEST_OPERATOR_MCP"

type addArgs struct {
	A int `json:"a"`
	B int `json:"b"`
}

type upperArgs struct {
	Text string `json:"text"`
}

// serveStdioMCP serves "add" on stdin/stdout until the client leaves.
func serveStdioMCP() int {
	if f := os.Getenv(mcpStartsEnv); f != "" {
		// agents_e2e_test.go counts the starts of this server.
		if err := appendLine(f, strconv.Itoa(os.Getpid())); err != nil {
			fmt.Fprintln(os.Stderr, "recording the start:", err)
			return 1
		}
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "calc", Version: "v0.0.1"}, nil)
	sdk.AddTool(s, &sdk.Tool{Name: "add", Description: "Add two integers."},
		func(_ context.Context, _ *sdk.CallToolRequest, in addArgs) (*sdk.CallToolResult, any, error) {
			// The operator starts stdio servers with a clean environment.
			if os.Getenv("OPERATOR_SECRET") != "" {
				return nil, nil, fmt.Errorf("the operator's environment leaked into the MCP server")
			}
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: strconv.Itoa(in.A + in.B)}}}, nil, nil
		})
	if err := s.Run(context.Background(), &sdk.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "stdio MCP server:", err)
		return 1
	}
	return 0
}

// TestMCPThroughBinary runs the real operator with --mcp-config naming a
// stdio MCP server (this test binary) and a streamable HTTP one (served
// here, behind a bearer token), and drives their tools through
// ExecuteStream with the scripted model: results come back from both, and
// input that breaks a server's schema is refused by the operator before
// the server sees it.
func TestMCPThroughBinary(t *testing.T) {
	bin := buildOperator(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	var upperCalls, badAuth atomic.Int64
	web := sdk.NewServer(&sdk.Implementation{Name: "web", Version: "v0.0.1"}, nil)
	sdk.AddTool(web, &sdk.Tool{Name: "upper", Description: "Upper-case a text."},
		func(_ context.Context, _ *sdk.CallToolRequest, in upperArgs) (*sdk.CallToolResult, any, error) {
			upperCalls.Add(1)
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: strings.ToUpper(in.Text)}}}, nil, nil
		})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return web }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer web-token" {
			badAuth.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer ts.Close()

	cfg, err := json.Marshal(map[string]any{"servers": []map[string]any{
		{"name": "calc", "command": []string{self}, "env": []string{mcpServerEnv + "=1"}},
		{"name": "web", "url": ts.URL + "/mcp", "headers": map[string]string{"Authorization": "Bearer web-token"}, "read_only": []string{"upper"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "mcp.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}

	addr := freeAddr(t)
	cmd := exec.Command(bin, "--dev", "--model", "scripted", "--addr", addr, "--workspace", t.TempDir(),
		"--log-format", "text", "--mcp-config", cfgPath)
	cmd.Env = append(os.Environ(), "OPERATOR_SECRET=s3cret")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)

	script := `{"turns":[
	  {"tool_calls":[
	    {"name":"calc__add","arguments":{"a":2,"b":40}},
	    {"name":"web__upper","arguments":{"text":"hello"}},
	    {"name":"calc__add","arguments":{"a":"two","b":40}}]},
	  {"text":"done"}]}`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := operatorv1.NewOperatorServiceClient(conn).ExecuteStream(ctx, &operatorv1.ExecuteStreamRequest{
		Input: &operatorv1.OperatorInput{Message: content.Text("use the MCP tools"), Metadata: scriptMeta(t, script)},
	})
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]*operatorv1.ToolCallFinished{}
	var out *operatorv1.OperatorOutput
	for {
		ev, err := stream.Recv()
		if err != nil {
			if out == nil {
				t.Fatalf("stream ended without an output: %v\n%s", err, stderr.String())
			}
			break
		}
		if f := ev.GetToolCallFinished(); f != nil {
			results[f.GetToolUseId()] = f
		}
		if o := ev.GetOutput(); o != nil {
			out = o
		}
	}
	if out.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_COMPLETE || content.TextOf(out.GetMessage()) != "done" {
		t.Fatalf("output %v\n%s", out, stderr.String())
	}
	check := func(id, name, want string, isErr bool) {
		t.Helper()
		r := results[id]
		if r == nil || r.GetName() != name || r.GetIsError() != isErr || !strings.Contains(r.GetResult(), want) {
			t.Fatalf("%s: result %v, want %s %q (error %v)\n%s", id, r, name, want, isErr, stderr.String())
		}
	}
	check("call_0_0", "calc__add", "42", false)
	check("call_0_1", "web__upper", "HELLO", false)
	// The MCP server's input schema, enforced by the operator's registry.
	check("call_0_2", "calc__add", "/a", true)
	if n := upperCalls.Load(); n != 1 {
		t.Fatalf("web__upper reached the server %d times, want 1", n)
	}
	if n := badAuth.Load(); n != 0 {
		t.Fatalf("%d requests reached the HTTP MCP server without the configured header", n)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
	}
}
