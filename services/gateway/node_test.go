package gateway_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/services/gateway"
)

// nodeModules is where scripts/client-deps.sh npm ci's the Node interop
// clients (services/gateway/testdata/node/package-lock.json), outside the
// repository.
func nodeModules() string {
	cache := os.Getenv("NEURON_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "neuron")
	}
	return filepath.Join(cache, "gateway-node", "node_modules")
}

// nodeDeps returns node and the modules directory, running
// scripts/client-deps.sh first when the modules are missing; it skips,
// with the reason, only where node or the modules cannot be had.
func nodeDeps(t *testing.T) (node, modules string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH: the Node interop test needs Node.js (and npm for scripts/client-deps.sh)")
	}
	modules = nodeModules()
	have := func() bool {
		for _, m := range []string{"@a2a-js/sdk", "@modelcontextprotocol/sdk"} {
			if _, err := os.Stat(filepath.Join(modules, m, "package.json")); err != nil {
				return false
			}
		}
		return true
	}
	if !have() {
		_, file, _, _ := runtime.Caller(0)
		out, err := exec.Command("bash", filepath.Join(filepath.Dir(file), "..", "..", "scripts", "client-deps.sh")).CombinedOutput()
		t.Logf("scripts/client-deps.sh: %v\n%s", err, out)
	}
	if !have() {
		t.Skipf("@a2a-js/sdk and @modelcontextprotocol/sdk are not in %s and scripts/client-deps.sh could not npm ci them (npm missing or the registry unreachable)", modules)
	}
	return node, modules
}

// runNode runs testdata/node/<script> with args and decodes the one JSON
// object it prints.
func runNode(t *testing.T, ctx context.Context, script string, out any, args ...string) {
	t.Helper()
	node, modules := nodeDeps(t)
	cmd := exec.CommandContext(ctx, node, append([]string{filepath.Join("testdata", "node", script)}, args...)...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "NODE_NO_WARNINGS=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\nstdout: %s\nstderr: %s", script, err, b, stderr.String())
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("node %s printed %q: %v\nstderr: %s", script, b, err, stderr.String())
	}
}

// writePolicy writes a gateway auth policy whose principal "client"
// (token) may use every endpoint, and returns its path.
func writePolicy(t *testing.T, token string) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"principals": []any{
		map[string]any{"name": "client", "tokens": []string{token}, "allow": []string{"/a2a.v1.A2AService/*", "/neuron.gateway.HTTP/*"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// nodeA2A is what testdata/node/a2a.cjs prints.
type nodeA2A struct {
	Card struct {
		Name, ProtocolVersion, PreferredTransport string
	}
	Send, Get struct {
		ID, ContextID, State, Answer string
	}
	Stream struct {
		TaskID, ContextID string
		Events            []string
		Answer            string
	}
}

// nodeMCP is what testdata/node/mcp.cjs prints.
type nodeMCP struct {
	Server     string
	Tools      []string
	IsError    bool
	Structured map[string]any
	Text       string
	Progress   int
}

// The official JavaScript A2A SDK (@a2a-js/sdk 0.3.x) reads an agent's
// card, sends a message, streams one in the same context and gets the
// task back; the official MCP TypeScript client lists the tools and
// calls an agent's. Both carry a bearer token of the gateway's policy
// (security on), as a production client does.
func TestNodeInterop(t *testing.T) {
	t.Parallel()
	nodeDeps(t) // skip before starting the services when node is missing
	policy := writePolicy(t, clientToken)
	s := startStack(t, stackOptions{gateway: func(c *gateway.Config) {
		c.Server.Dev, c.Server.Plaintext, c.Server.AuthPolicy = false, true, policy
		c.Orchestrator.Dev, c.State.Dev = true, true
	}}, echoAgent("echo"), echoAgent("other"))
	ctx := ctxFor(t, 2*time.Minute)

	t.Run("a2a", func(t *testing.T) {
		var got nodeA2A
		// The SDK resolves the card path against the URL given, so the agent
		// URL ends in a slash.
		runNode(t, ctx, "a2a.cjs", &got, s.httpURL+"/a2a/echo/", clientToken)
		if got.Card.Name != "echo" || got.Card.ProtocolVersion != gateway.A2AProtocolVersion || got.Card.PreferredTransport != "JSONRPC" {
			t.Errorf("card = %+v, want echo, protocol %s, JSONRPC", got.Card, gateway.A2AProtocolVersion)
		}
		if got.Send.State != "completed" || !strings.Contains(got.Send.Answer, "You said: hello from node") {
			t.Errorf("message/send = %+v, want completed with the echo", got.Send)
		}
		if gateway.SessionOf(got.Send.ID) != got.Send.ContextID {
			t.Errorf("task %q is not of its context %q", got.Send.ID, got.Send.ContextID)
		}
		ev := strings.Join(got.Stream.Events, " ")
		if !strings.HasPrefix(ev, "task status-update:working artifact-update") || !strings.HasSuffix(ev, "status-update:completed:final") {
			t.Errorf("message/stream events = %s, want task, working, the answer's chunks, completed (final)", ev)
		}
		if !strings.Contains(got.Stream.Answer, "You said: and a stream") {
			t.Errorf("streamed answer = %q", got.Stream.Answer)
		}
		if got.Get.ID != got.Send.ID || got.Get.State != "completed" || got.Get.Answer != got.Send.Answer {
			t.Errorf("tasks/get = %+v, want the sent task %+v", got.Get, got.Send)
		}
		if got.Stream.ContextID != got.Send.ContextID || got.Stream.TaskID == got.Send.ID {
			t.Errorf("the stream's task %q in context %q: want a new task in the send's context %q", got.Stream.TaskID, got.Stream.ContextID, got.Send.ContextID)
		}
	})

	t.Run("mcp", func(t *testing.T) {
		var got nodeMCP
		runNode(t, ctx, "mcp.cjs", &got, s.httpURL+"/mcp", clientToken, "echo")
		if got.Server != "neuron-gateway" {
			t.Errorf("server = %q", got.Server)
		}
		want := []string{gateway.ToolDecide, "echo", "other", gateway.ToolStateSearch}
		if strings.Join(got.Tools, ",") != strings.Join(want, ",") {
			t.Errorf("tools = %v, want %v", got.Tools, want)
		}
		if got.IsError || got.Structured["status"] != "completed" || !strings.Contains(got.Structured["answer"].(string), "You said: hello over mcp") {
			t.Errorf("echo tool: error %v, result %v %q", got.IsError, got.Structured, got.Text)
		}
		if id, _ := got.Structured["workflow_id"].(string); gateway.SessionOf(id) == "" {
			t.Errorf("workflow_id %q is not a gateway task id", id)
		}
		if got.Progress == 0 {
			t.Error("no progress notifications reached the client")
		}
	})
}
