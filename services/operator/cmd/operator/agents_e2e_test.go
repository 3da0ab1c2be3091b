package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// mcpStartsEnv names a file the stdio MCP server (this test binary, see
// serveStdioMCP) appends a line to each time it starts.
const mcpStartsEnv = "NEURON_TEST_MCP_STARTS"

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// fakeChat is a local Chat Completions server that records every request
// body. It answers a user message "call TOOL" with a call of TOOL, a tool
// result with "done: RESULT", anything else with "hello".
type fakeChat struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (f *fakeChat) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

// bodiesSince returns the request bodies from the n-th on.
func (f *fakeChat) bodiesSince(n int) []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.bodies[n:]...)
}

func (f *fakeChat) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&body) != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	msgs, _ := body["messages"].([]any)
	last, _ := msgs[len(msgs)-1].(map[string]any)
	text, _ := last["content"].(string)
	var msg string
	switch {
	case last["role"] == "tool":
		b, _ := json.Marshal("done: " + text)
		msg = `{"role":"assistant","content":` + string(b) + `}`
	case strings.HasPrefix(text, "call "):
		name := strings.TrimPrefix(text, "call ")
		args := `{"a":2,"b":40}`
		if strings.HasSuffix(name, "__upper") {
			args = `{"text":"hello"}`
		}
		a, _ := json.Marshal(args)
		msg = `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"` + name + `","arguments":` + string(a) + `}}]}`
	default:
		msg = `{"role":"assistant","content":"hello"}`
	}
	finish := "stop"
	if strings.Contains(msg, "tool_calls") {
		finish = "tool_calls"
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4.1-mini","choices":[{"index":0,"message":%s,"finish_reason":%q}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`, msg, finish)
}

// agentOperator is one operator process serving many agents.
type agentOperator struct {
	client    operatorv1.OperatorServiceClient
	chat      *fakeChat
	anthropic *atomic.Int64 // requests that reached the fake Anthropic API
	upper     *atomic.Int64 // calls of the HTTP MCP server's tool
	badAuth   *atomic.Int64 // requests to it without the credential
	webURL    string
	self      string // this test binary: the allowed stdio MCP server
	falseCmd  string // an allowed command that exits at once
	starts    string // file the stdio MCP server records its starts in
	dir       string // the operator's working directory
	stderr    *syncBuffer
}

// startAgentOperator starts the real binary with a Chat Completions
// model served by fakeChat, an Anthropic model served by a fake that
// counts requests, no built-in tools, and an MCP policy allowing this
// test binary and /bin/false as stdio servers and one local HTTP MCP
// server reached with a credential the operator holds.
func startAgentOperator(t *testing.T) *agentOperator {
	t.Helper()
	bin := buildOperator(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	falseCmd, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false command here")
	}
	o := &agentOperator{chat: &fakeChat{}, anthropic: &atomic.Int64{}, upper: &atomic.Int64{}, badAuth: &atomic.Int64{},
		self: self, falseCmd: falseCmd, dir: t.TempDir(), stderr: &syncBuffer{}}
	o.starts = filepath.Join(o.dir, "starts")
	chat := httptest.NewServer(o.chat)
	t.Cleanup(chat.Close)
	anth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.anthropic.Add(1)
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"no"}}`, http.StatusBadRequest)
	}))
	t.Cleanup(anth.Close)

	web := sdk.NewServer(&sdk.Implementation{Name: "web", Version: "v0.0.1"}, nil)
	sdk.AddTool(web, &sdk.Tool{Name: "upper", Description: "Upper-case a text."},
		func(_ context.Context, _ *sdk.CallToolRequest, in upperArgs) (*sdk.CallToolResult, any, error) {
			o.upper.Add(1)
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: strings.ToUpper(in.Text)}}}, nil, nil
		})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return web }, nil)
	ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer web-token" {
			o.badAuth.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ws.Close)
	o.webURL = ws.URL + "/mcp"
	u, _ := url.Parse(ws.URL)

	creds := writeFile(t, o.dir, "creds.json", `{"credentials":{"webtoken":{"headers":{"Authorization":"Bearer web-token"}}}}`)
	addr := freeAddr(t)
	cmd := exec.Command(bin, "--dev", "--addr", addr, "--log-format", "text", "--workspace", t.TempDir(),
		"--tools", "", "--model", "gpt-4.1-mini",
		"--openai-key-file", writeFile(t, o.dir, "okey", "sk-test-key\n"), "--openai-base-url", chat.URL+"/v1",
		"--anthropic-key-file", writeFile(t, o.dir, "akey", "sk-ant-test\n"), "--anthropic-base-url", anth.URL,
		"--model-retries", "0",
		"--mcp-stdio-allow", self+","+falseCmd, "--mcp-http-allow", u.Host, "--mcp-credentials", creds)
	cmd.Dir = o.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "OPERATOR_SECRET=s3cret"} // no keys from the test's environment
	cmd.Stderr = o.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
	})
	waitServing(t, conn)
	o.client = operatorv1.NewOperatorServiceClient(conn)
	return o
}

func (o *agentOperator) execute(t *testing.T, msg string, cfg *operatorv1.OperatorConfig) (*operatorv1.OperatorOutput, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := o.client.Execute(ctx, &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{
		Message: content.Text(msg), Config: cfg,
	}})
	return resp.GetOutput(), err
}

// mustExecute runs an invocation that must complete with want.
func (o *agentOperator) mustExecute(t *testing.T, msg string, cfg *operatorv1.OperatorConfig, want string) {
	t.Helper()
	out, err := o.execute(t, msg, cfg)
	if err != nil {
		t.Fatalf("Execute: %v\n%s", err, o.stderr.String())
	}
	if out.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_COMPLETE || content.TextOf(out.GetMessage()) != want {
		t.Fatalf("output %v, want %q\n%s", out, want, o.stderr.String())
	}
}

// calcServer is the stdio MCP server (this test binary) as an agent
// definition brings it.
func (o *agentOperator) calcServer() *operatorv1.McpServer {
	return &operatorv1.McpServer{Name: "calc", Transport: &operatorv1.McpServer_Stdio{Stdio: &operatorv1.McpStdio{
		Command: o.self,
		Env:     map[string]string{mcpServerEnv: "1", mcpStartsEnv: o.starts},
	}}}
}

func (o *agentOperator) startCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(o.starts)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func systemPrompt(body map[string]any) string {
	msgs, _ := body["messages"].([]any)
	if len(msgs) == 0 {
		return ""
	}
	m, _ := msgs[0].(map[string]any)
	if m["role"] != "system" {
		return ""
	}
	s, _ := m["content"].(string)
	return s
}

// TestOneOperatorManyAgents: one operator process serves agents that
// differ in instructions, MCP servers and model parameters, each carried
// by the invocation's OperatorConfig.
func TestOneOperatorManyAgents(t *testing.T) {
	o := startAgentOperator(t)

	t.Run("instructions per invocation", func(t *testing.T) {
		n := o.chat.calls()
		o.mustExecute(t, "hi", &operatorv1.OperatorConfig{Instructions: new("You are agent A.")}, "hello")
		o.mustExecute(t, "hi", &operatorv1.OperatorConfig{Instructions: new("You are agent B."), SystemAddendum: new("Be brief.")}, "hello")
		o.mustExecute(t, "hi", nil, "hello")
		bodies := o.chat.bodiesSince(n)
		if len(bodies) != 3 {
			t.Fatalf("%d model calls, want 3", len(bodies))
		}
		got := []string{systemPrompt(bodies[0]), systemPrompt(bodies[1]), systemPrompt(bodies[2])}
		if got[0] != "You are agent A." || got[1] != "You are agent B.\n\nBe brief." || !strings.HasPrefix(got[2], "You are a helpful agent.") {
			t.Fatalf("system prompts %q: want each invocation's own instructions (the addendum appended), then the process default", got)
		}
	})

	t.Run("MCP server per invocation, pooled", func(t *testing.T) {
		before := o.startCount(t)
		for range 3 {
			o.mustExecute(t, "call calc__add", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{o.calcServer()}}, "done: 42")
		}
		if n := o.startCount(t) - before; n != 1 {
			t.Fatalf("the stdio MCP server was started %d times over 3 invocations, want once (pooled)\n%s", n, o.stderr.String())
		}
		// Without the definition, the agent has no such tool.
		out, err := o.execute(t, "call calc__add", nil)
		if err != nil {
			t.Fatal(err)
		}
		if recs := out.GetMetadata().GetSubDispatches(); len(recs) != 1 || recs[0].GetSuccess() || !strings.Contains(recs[0].GetError(), "Unknown tool") {
			t.Fatalf("an invocation without the MCP server could call its tool: %v", recs)
		}
	})

	t.Run("a server that died is started again by a later invocation", func(t *testing.T) {
		o.mustExecute(t, "call calc__add", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{o.calcServer()}}, "done: 42")
		b, err := os.ReadFile(o.starts)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Fields(string(b))
		pid, err := strconv.Atoi(lines[len(lines)-1])
		if err != nil {
			t.Fatal(err)
		}
		before := o.startCount(t)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The invocation right after the kill may still find the dead
		// connection: its tool call then fails (the model sees the
		// error) and marks it broken. The next one gets a new server.
		cfg := &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{o.calcServer()}}
		var last string
		for range 2 {
			out, err := o.execute(t, "call calc__add", cfg)
			if err != nil {
				t.Fatalf("Execute: %v\n%s", err, o.stderr.String())
			}
			if last = content.TextOf(out.GetMessage()); last == "done: 42" {
				break
			}
		}
		if last != "done: 42" {
			t.Fatalf("after the server died: %q, want a new server answering", last)
		}
		if n := o.startCount(t) - before; n != 1 {
			t.Fatalf("the server was started %d times after it died, want once", n)
		}
	})

	t.Run("HTTP MCP server with a credential the operator holds", func(t *testing.T) {
		web := &operatorv1.McpServer{Name: "web", Transport: &operatorv1.McpServer_Http{Http: &operatorv1.McpHttp{Url: o.webURL, CredentialRef: "webtoken"}}}
		o.mustExecute(t, "call web__upper", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{web}}, "done: HELLO")
		if o.upper.Load() != 1 || o.badAuth.Load() != 0 {
			t.Fatalf("upper calls %d, unauthenticated requests %d", o.upper.Load(), o.badAuth.Load())
		}
	})

	t.Run("a server that fails to start fails only its invocation", func(t *testing.T) {
		broken := &operatorv1.McpServer{Name: "broken", Transport: &operatorv1.McpServer_Stdio{Stdio: &operatorv1.McpStdio{Command: o.falseCmd}}}
		for range 2 { // refused again, not cached as started
			_, err := o.execute(t, "call broken__x", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{broken}})
			if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), `"broken"`) ||
				!strings.Contains(status.Convert(err).Message(), "config.mcp_servers[0]") {
				t.Fatalf("err %v, want UNAVAILABLE naming the server and the field", err)
			}
		}
		o.mustExecute(t, "call calc__add", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{o.calcServer()}}, "done: 42")
		o.mustExecute(t, "hi", nil, "hello")
	})

	t.Run("model parameters reach the provider", func(t *testing.T) {
		n := o.chat.calls()
		schema, err := structpb.NewStruct(map[string]any{"type": "object", "properties": map[string]any{"answer": map[string]any{"type": "string"}}})
		if err != nil {
			t.Fatal(err)
		}
		o.mustExecute(t, "hi", &operatorv1.OperatorConfig{ModelParameters: &operatorv1.ModelParameters{
			Temperature: new(0.3), MaxOutputTokens: new(uint32(55)),
			ReasoningEffort: operatorv1.ReasoningEffort_REASONING_EFFORT_LOW, OutputSchema: schema,
		}}, "hello")
		b := o.chat.bodiesSince(n)[0]
		rf, _ := b["response_format"].(map[string]any)
		js, _ := rf["json_schema"].(map[string]any)
		if b["temperature"] != 0.3 || b["max_completion_tokens"] != 55.0 || b["reasoning_effort"] != "low" || rf["type"] != "json_schema" || js["schema"] == nil {
			t.Fatalf("request body %v: the model parameters did not arrive", b)
		}
	})

	t.Run("a parameter the provider cannot honour is refused", func(t *testing.T) {
		_, err := o.execute(t, "hi", &operatorv1.OperatorConfig{Model: new("claude-sonnet-4-5"), ModelParameters: &operatorv1.ModelParameters{Temperature: new(1.5)}})
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, "temperature") || !strings.Contains(msg, "anthropic") {
			t.Fatalf("err %v, want INVALID_ARGUMENT naming temperature and anthropic", err)
		}
		if n := o.anthropic.Load(); n != 0 {
			t.Fatalf("the refused request reached the provider %d times", n)
		}
		bad, _ := structpb.NewStruct(map[string]any{"type": 5})
		_, err = o.execute(t, "hi", &operatorv1.OperatorConfig{ModelParameters: &operatorv1.ModelParameters{OutputSchema: bad}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "output_schema") {
			t.Fatalf("invalid output schema: err %v, want INVALID_ARGUMENT naming output_schema", err)
		}
	})
}

// TestAgentDefinitionCannotExceedPolicy: a definition that tries to
// start an arbitrary command, reach a host the deployment does not
// allow, smuggle a loader variable into an allowed command, use a
// credential the deployment does not hold or enable a tool the
// deployment disabled is refused with a status naming it, before any
// server is started or any model is called.
func TestAgentDefinitionCannotExceedPolicy(t *testing.T) {
	o := startAgentOperator(t)
	stdio := func(cmd string, args []string, env map[string]string) *operatorv1.McpServer {
		return &operatorv1.McpServer{Name: "x", Transport: &operatorv1.McpServer_Stdio{Stdio: &operatorv1.McpStdio{Command: cmd, Args: args, Env: env}}}
	}
	httpSrv := func(u, ref string) *operatorv1.McpServer {
		return &operatorv1.McpServer{Name: "x", Transport: &operatorv1.McpServer_Http{Http: &operatorv1.McpHttp{Url: u, CredentialRef: ref}}}
	}
	pwned := filepath.Join(o.dir, "pwned")
	for _, tc := range []struct {
		name string
		cfg  *operatorv1.OperatorConfig
		code codes.Code
		want []string
	}{
		{"arbitrary command", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{stdio("/bin/sh", []string{"-c", "touch " + pwned}, nil)}},
			codes.PermissionDenied, []string{"config.mcp_servers[0].stdio.command", `"/bin/sh"`, "--mcp-stdio-allow"}},
		{"host not allowed", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{httpSrv("http://169.254.169.254/latest/meta-data", "")}},
			codes.PermissionDenied, []string{"config.mcp_servers[0].http.url", "169.254.169.254", "--mcp-http-allow"}},
		{"loader variable into an allowed command", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{stdio(o.self, nil, map[string]string{"LD_PRELOAD": pwned})}},
			codes.PermissionDenied, []string{"config.mcp_servers[0].stdio.env", "LD_PRELOAD"}},
		{"credential the deployment does not hold", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{httpSrv(o.webURL, "stolen")}},
			codes.FailedPrecondition, []string{"config.mcp_servers[0].http.credential_ref", `"stolen"`, "does not hold"}},
		{"secret in the URL", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{httpSrv(strings.Replace(o.webURL, "http://", "http://u:p@", 1), "")}},
			codes.InvalidArgument, []string{"config.mcp_servers[0].http.url", "credential_ref"}},
		{"disabled tool", &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{Names: []string{"bash"}}},
			codes.PermissionDenied, []string{"config.allowed_tools", `"bash"`, "disabled"}},
		{"unknown tool", &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{Names: []string{"teleport"}}},
			codes.InvalidArgument, []string{"config.allowed_tools", `"teleport"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls, starts := o.chat.calls(), o.startCount(t)
			_, err := o.execute(t, "call x__anything", tc.cfg)
			msg := status.Convert(err).Message()
			if status.Code(err) != tc.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Fatalf("message %q does not name %s", msg, w)
				}
			}
			if o.chat.calls() != calls || o.startCount(t) != starts {
				t.Fatalf("a refused definition reached the model or started a server")
			}
			if _, err := os.Stat(pwned); err == nil {
				t.Fatalf("the refused command ran")
			}
		})
	}
	// The operator still serves.
	o.mustExecute(t, "hi", nil, "hello")
}
