package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// serveMCPArg, after "--" among this test binary's arguments, makes it a
// stdio MCP server with one tool, shout (TestMCPServerProcess): the
// operator starts its MCP servers with a clean environment, so an
// argument says it, not a variable.
const serveMCPArg = "serve-shout-mcp"

// TestMCPServerProcess is not a test: run as
// `neuron.test -test.run=^TestMCPServerProcess$ -- serve-shout-mcp` it
// serves the shout tool on stdin/stdout; otherwise it does nothing.
func TestMCPServerProcess(t *testing.T) {
	if os.Args[len(os.Args)-1] != serveMCPArg {
		t.Skip("a helper process for TestAgentsThroughUp, not a test")
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "shout", Version: "v0.0.1"}, nil)
	sdk.AddTool(s, &sdk.Tool{Name: "shout", Description: "Shout the text."},
		func(_ context.Context, _ *sdk.CallToolRequest, in struct {
			Text string `json:"text"`
		}) (*sdk.CallToolResult, any, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "MCP-" + strings.ToUpper(in.Text)}}}, nil, nil
		})
	if err := s.Run(context.Background(), &sdk.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "stdio MCP server:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// chatServer is an OpenAI-compatible /chat/completions endpoint that
// answers every request with one text naming the marker it finds in the
// system prompt, and remembers the system prompts it was sent.
type chatServer struct {
	mu      sync.Mutex
	systems []string
}

var markerRE = regexp.MustCompile(`MARKER-[A-Z]+`)

func (s *chatServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var system string
	for _, m := range req.Messages {
		if m.Role == "system" || m.Role == "developer" {
			system += string(m.Content)
		}
	}
	s.mu.Lock()
	s.systems = append(s.systems, system)
	s.mu.Unlock()
	answer := "no marker"
	if m := markerRE.FindString(system); m != "" {
		answer = "answering as " + m
	}
	// An agent with the shout tool calls it once, then answers with what
	// it returned.
	var shout, result string
	for _, tl := range req.Tools {
		if strings.HasSuffix(tl.Function.Name, "__shout") {
			shout = tl.Function.Name
		}
	}
	for _, m := range req.Messages {
		if m.Role == "tool" {
			result = string(m.Content)
		}
	}
	switch {
	case shout != "" && result == "":
		call := fmt.Sprintf(`{"id":"call_1","type":"function","function":{"name":%q,"arguments":"{\"text\":\"ahoy\"}"}}`, shout)
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":[%s]},\"finish_reason\":null}]}\n\n", req.Model, strings.Replace(call, `{"id"`, `{"index":0,"id"`, 1))
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n", req.Model)
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[%s]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`, req.Model, call)
		return
	case shout != "":
		answer = "the tool said " + result
	}
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":%q},\"finish_reason\":null}]}\n\n", req.Model, answer)
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", req.Model)
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"total_tokens\":13}}\n\n", req.Model)
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`, req.Model, answer)
}

func (s *chatServer) systemsSeen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.systems...)
}

// TestAgentsThroughUp: a user defines agents with nothing but the CLI,
// one operator serves them with their own instructions against an
// OpenAI-compatible server, and the definitions survive a restart of
// everything; neuron up keeps its demo agents in step with each start
// and leaves alone the one the user took over.
func TestAgentsThroughUp(t *testing.T) {
	t.Parallel()
	model := &chatServer{}
	srv := httptest.NewServer(model)
	t.Cleanup(srv.Close)
	setup := newUpSetup(t)
	realModel := []string{"OPENAI_BASE_URL=" + srv.URL + "/v1"} // an OpenAI-compatible server: any model name
	// The operator may start this test binary as an MCP server, nothing else.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	realArgs := []string{"--isolation", "none", "--model", "test-model", "--mcp-stdio-allow", self}

	// First start: the scripted model; the demo agents are defined for it.
	up := startUpIn(t, setup, nil, "--isolation", "none")
	orch := []string{"--addr", setup.orchestrator}
	cli := func(args ...string) result {
		t.Helper()
		return neuron(ctxFor(t), t, append(args, orch...)...)
	}
	r := cli("agents", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "assistant") || !strings.Contains(r.stdout, "researcher") {
		t.Fatalf("the demo agents are not listed:\n%s", r)
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "agents.yaml")
	defs := fmt.Sprintf(`# two agents of the user's own, on the operator of neuron up
name: pirate
definition:
  description: Talks like a pirate.
  instructions: You are a pirate. MARKER-PIRATE
  tools: {builtin: []}
  limits: {maxTurns: 2}
  route: {operator: {address: %[1]s}}
---
name: butler
definition:
  instructions: You are a butler. MARKER-BUTLER
  tools: {builtin: []}
  route: {operator: {address: %[1]s}}
---
name: shouter
definition:
  instructions: You shout through your tool. MARKER-SHOUTER
  tools:
    builtin: []
    mcpServers:
    - name: loud
      stdio: {command: %[2]q, args: ["-test.run=^TestMCPServerProcess$", "--", %[3]q]}
  route: {operator: {address: %[1]s}}
`, setup.operator, self, serveMCPArg)
	if err := os.WriteFile(file, []byte(defs), 0o600); err != nil {
		t.Fatal(err)
	}
	r = cli("agents", "apply", "-f", file)
	if r.code != 0 || !strings.Contains(r.stdout, "agent pirate created (revision") || !strings.Contains(r.stdout, "agent butler created (revision") ||
		!strings.Contains(r.stdout, "agent shouter created (revision") {
		t.Fatalf("apply:\n%s", r)
	}
	// The user takes the researcher over: without the label, it is theirs.
	r = cli("agents", "get", "researcher")
	if r.code != 0 || !strings.Contains(r.stdout, "neuron.dev/managed-by: neuron-up") {
		t.Fatalf("get researcher:\n%s", r)
	}
	mine := strings.Replace(r.stdout, "neuron.dev/managed-by: neuron-up", "owner: me", 1)
	if err := os.WriteFile(file, []byte(mine), 0o600); err != nil {
		t.Fatal(err)
	}
	if r = cli("agents", "apply", "-f", file); r.code != 0 || !strings.Contains(r.stdout, "agent researcher updated") {
		t.Fatalf("apply of the researcher:\n%s", r)
	}
	before := cli("agents", "list", "--json")
	if before.code != 0 {
		t.Fatalf("list --json:\n%s", before)
	}
	up.stop(t)

	// Second start: a real (OpenAI-compatible) model. Everything the user
	// defined is still there; the demo assistant follows the new model.
	up = startUpIn(t, setup, realModel, realArgs...)
	out := up.output()
	if !strings.Contains(out, "agent assistant: updated to this start's route and model") {
		t.Errorf("neuron up did not bring the demo assistant in step:\n%s", out)
	}
	if !strings.Contains(out, "agent researcher: defined by you") {
		t.Errorf("neuron up does not say it left the user's researcher alone:\n%s", out)
	}
	r = cli("agents", "get", "researcher")
	if r.code != 0 || !strings.Contains(r.stdout, "owner: me") {
		t.Errorf("the user's researcher changed on restart:\n%s", r)
	}
	for _, name := range []string{"pirate", "butler"} {
		var wantRev string
		for _, l := range strings.Split(before.stdout, "\n") {
			if strings.Contains(l, `"name":"`+name+`"`) {
				wantRev = regexp.MustCompile(`"revision":"?(\d+)`).FindStringSubmatch(l)[1]
			}
		}
		r = cli("agents", "get", name, "--json")
		if r.code != 0 || !strings.Contains(r.stdout, `"revision":"`+wantRev+`"`) {
			t.Errorf("%s after the restart: want revision %s:\n%s", name, wantRev, r)
		}
	}

	r = cli("run", "pirate", "hello")
	if r.code != 0 || !strings.Contains(r.stdout, "answering as MARKER-PIRATE") {
		t.Fatalf("run pirate:\n%s", r)
	}
	r = cli("run", "butler", "hello")
	if r.code != 0 || !strings.Contains(r.stdout, "answering as MARKER-BUTLER") {
		t.Fatalf("run butler:\n%s", r)
	}
	r = cli("run", "shouter", "hello")
	if r.code != 0 || !strings.Contains(r.stdout, `the tool said "MCP-AHOY"`) {
		t.Fatalf("run shouter (its own MCP server's tool):\n%s", r)
	}

	// Restart everything: the agents run again as they did.
	up.stop(t)
	up = startUpIn(t, setup, realModel, realArgs...)
	if r = cli("run", "shouter", "hello"); r.code != 0 || !strings.Contains(r.stdout, `the tool said "MCP-AHOY"`) {
		t.Fatalf("run shouter after the restart:\n%s", r)
	}
	if r = cli("run", "pirate", "hello"); r.code != 0 || !strings.Contains(r.stdout, "answering as MARKER-PIRATE") {
		t.Fatalf("run pirate after the restart:\n%s", r)
	}
	var pirate, butler int
	for _, s := range model.systemsSeen() {
		if strings.Contains(s, "MARKER-PIRATE") {
			pirate++
		}
		if strings.Contains(s, "MARKER-BUTLER") {
			butler++
		}
		if strings.Contains(s, "MARKER-PIRATE") && strings.Contains(s, "MARKER-BUTLER") {
			t.Errorf("one system prompt holds both agents' instructions: %s", s)
		}
	}
	if pirate == 0 || butler == 0 {
		t.Errorf("the model saw pirate's instructions %d times and butler's %d times, want both", pirate, butler)
	}

	// A change applies to the next run; delete makes the agent unknown.
	if err := os.WriteFile(file, []byte(strings.Replace(defs, "MARKER-PIRATE", "MARKER-CAPTAIN", 1)), 0o600); err != nil { // shouter too
		t.Fatal(err)
	}
	r = cli("agents", "apply", "-f", file)
	if r.code != 0 || !strings.Contains(r.stdout, "agent pirate updated") || !strings.Contains(r.stdout, "agent butler unchanged") ||
		!strings.Contains(r.stdout, "agent shouter unchanged") {
		t.Fatalf("apply of the change:\n%s", r)
	}
	if r = cli("run", "pirate", "hello"); r.code != 0 || !strings.Contains(r.stdout, "answering as MARKER-CAPTAIN") {
		t.Fatalf("run pirate after the change:\n%s", r)
	}
	if r = cli("agents", "delete", "butler"); r.code != 0 {
		t.Fatalf("delete:\n%s", r)
	}
	if r = cli("run", "butler", "hello"); r.code != exitStatusBase+5 || !strings.Contains(r.stderr, "neuron agents list") {
		t.Fatalf("run of a deleted agent: want NOT_FOUND with the hint:\n%s", r)
	}
}
