package orchestrator_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/state"
)

// TestRecallAcrossSessions is issue 25's done-when: an agent saves a fact
// in one session (write_memory, applied by the orchestrator to the State
// service) and, in a later session, recalls it with search_memory by
// meaning, in other words than it was saved in. Real services in process:
// State on bbolt with the test embedder, the operator with the memory
// tools, the orchestrator; the scripted model plays the agent.
func TestRecallAcrossSessions(t *testing.T) {
	dataDir := t.TempDir()
	stateAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: quiet(), Listener: lis, Backend: state.BackendBolt, DataDir: dataDir, Embedder: embed.Test{}})
	})
	st := statev1.NewStateServiceClient(dial(t, stateAddr))
	opAddr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg := operator.DefaultConfig()
		cfg.Server = grpcserver.Config{Name: "operator", Dev: true, ShutdownTimeout: 2 * time.Second}
		cfg.Log, cfg.Listener = quiet(), lis
		cfg.Model = "scripted"
		cfg.Tools = []string{"search_memory", "read_memory"}
		cfg.Workspace = t.TempDir()
		cfg.State = grpcclient.Config{Target: stateAddr}
		return operator.Run(ctx, cfg)
	})
	assistant := script(nil,
		map[string]any{"contains": "Remember", "turns": []any{
			map[string]any{"tool_calls": []any{call("write_memory", map[string]any{"scope": "global", "key": "user/fact-1", "value": "The user's car is blue."})}},
			map[string]any{"text": "Noted."},
		}},
		map[string]any{"contains": "What colour", "turns": []any{
			map[string]any{"tool_calls": []any{call("search_memory", map[string]any{"query": "what colour is my vehicle?"})}},
			map[string]any{"text": "Recalled."},
		}},
	)
	o := startOrch(t, t.TempDir(), registryYAML(t, map[string]any{
		"id": "assistant", "operator": opAddr, "metadata": assistant,
		"allowed_tools": []any{"write_memory", "search_memory", "read_memory"},
		"memory_scopes": []any{"session", "global"},
	}), stateAddr, orchOptions{})
	ctx := ctxT(t)

	r1, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "assistant", Input: userInput("Remember: my car is blue.", "session-1")})
	if err != nil {
		t.Fatal(err)
	}
	if got := content.TextOf(r1.GetOutput().GetMessage()); got != "Noted." {
		t.Fatalf("first session answered %q", got)
	}
	// Not findable by the later question's words: only by meaning.
	kw, err := st.Search(ctx, &statev1.SearchRequest{Scope: scope.Global(), Query: "what colour is my vehicle?"})
	if err != nil {
		t.Fatal(err)
	}
	if len(kw.GetResults()) != 0 {
		t.Fatalf("keyword search found %v; the test needs a question that shares no word with the fact", kw.GetResults())
	}

	r2, err := o.client.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "assistant", Input: userInput("What colour is my car?", "session-2")})
	if err != nil {
		t.Fatal(err)
	}
	if got := content.TextOf(r2.GetOutput().GetMessage()); got != "Recalled." {
		t.Fatalf("second session answered %q", got)
	}
	// The tool result the model saw, in session-2's stored conversation.
	page, err := st.List(ctx, &statev1.ListRequest{Scope: scope.Session("session-2"), Prefix: "conversation/", IncludeValues: true, PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	for _, it := range page.GetItems() {
		b, _ := protojson.Marshal(it.GetValue())
		seen.Write(b)
	}
	for _, want := range []string{`scope: global  key: \"user/fact-1\"`, "The user's car is blue.", "by meaning and words"} {
		if !strings.Contains(seen.String(), want) {
			t.Errorf("session-2's conversation lacks %q: the search did not recall the fact\n%s", want, seen.String())
		}
	}
	if strings.Contains(seen.String(), "Remember: my car is blue") {
		t.Error("session-2 saw session-1's conversation; the fact must come from memory")
	}
}

// TestMemoryScopesNarrowOnly: an agent's memory_scopes reach its
// invocations; a dispatch's own can narrow them, never widen them.
func TestMemoryScopesNarrowOnly(t *testing.T) {
	reg, err := orchestrator.ParseRegistry(registryYAML(t,
		map[string]any{"id": "wide", "operator": "127.0.0.1:1", "memory_scopes": []any{"session", "global"}},
		map[string]any{"id": "own", "operator": "127.0.0.1:1"},
	))
	if err != nil {
		t.Fatal(err)
	}
	apply := func(id string, asked ...string) []string {
		a, err := reg.Lookup(id)
		if err != nil {
			t.Fatal(err)
		}
		return a.Apply(&operatorv1.OperatorInput{Config: &operatorv1.OperatorConfig{MemoryScopes: asked}}).GetConfig().GetMemoryScopes()
	}
	for _, c := range []struct {
		id    string
		asked []string
		want  []string
	}{
		{"wide", nil, []string{"session", "global"}},
		{"wide", []string{"global", "agent"}, []string{"global"}},
		{"own", nil, nil},
		{"own", []string{"global", "custom:x", "session"}, []string{"session"}},
	} {
		if got := apply(c.id, c.asked...); !slices.Equal(got, c.want) {
			t.Errorf("%s asked %v: memory_scopes %v; want %v", c.id, c.asked, got, c.want)
		}
	}
	if _, err := orchestrator.ParseRegistry(registryYAML(t, map[string]any{"id": "bad", "operator": "127.0.0.1:1", "memory_scopes": []any{"everything"}})); err == nil || !strings.Contains(err.Error(), "memory_scopes[0]") {
		t.Errorf("an unknown scope name: %v; want an error naming memory_scopes[0]", err)
	}
}
