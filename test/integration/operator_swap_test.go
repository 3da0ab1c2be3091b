package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/testenv"
	envconformance "github.com/secbear/neuron/pkg/conformance/environment"
	conformance "github.com/secbear/neuron/pkg/conformance/operator"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/scope"
)

// operatorService is the OperatorService's name in grpc.health.v1.
const operatorService = "layer0.operator.v1.OperatorService"

// pyOperatorBreaker is the Python operator's --circuit-breaker in these
// tests.
const pyOperatorBreaker = 4

// startPyOperator runs the Python OperatorService of testdata/pyoperator
// (stubs generated from proto/ into a temporary directory), with extra
// arguments, or skips the test when Python's grpcio or protoc is missing
// (scripts/client-deps.sh installs them).
func startPyOperator(t *testing.T, extra ...string) *proc {
	t.Helper()
	root := repoRoot(t)
	stubs, missing := testenv.PythonStubs(t, root)
	if missing != "" {
		t.Skip(missing)
	}
	dir := t.TempDir()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "PYTHONPATH=" + stubs, "PYTHONDONTWRITEBYTECODE=1"}
	server := filepath.Join(root, "test", "integration", "testdata", "pyoperator", "operator_server.py")
	argv := append([]string{testenv.Python, server, "--addr", "127.0.0.1:0", "--circuit-breaker", "4"}, extra...)
	return startProc(t, "operator (python)", slices.Clip(argv), env)
}

// TestPythonOperatorConformance runs the operator conformance suite
// against the Python OperatorService, a second implementation of the
// contract that shares no code with services/operator.
func TestPythonOperatorConformance(t *testing.T) {
	py := startPyOperator(t)
	conn := dial(t, py.addr)
	waitHealthy(t, conn, operatorService)
	conformance.Run(t, conformance.Target{Conn: conn, CircuitBreaker: pyOperatorBreaker})
}

// fakeChatModel is an OpenAI-compatible Chat Completions server for the
// Python operator: a request whose last message is not a tool result is
// answered with one write_memory call of key and value (workflow scope),
// one after a tool result with the text answer. It counts the requests
// and remembers whether each offered the write_memory tool.
type fakeChatModel struct {
	key    string
	value  any
	answer string

	mu       sync.Mutex
	calls    int
	noTool   int
	problems []string
}

func (f *fakeChatModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
		Tools []struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		f.problems = append(f.problems, r.Method+" "+r.URL.Path)
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		f.problems = append(f.problems, fmt.Sprintf("request body: %v", err))
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	if !slices.ContainsFunc(req.Tools, func(t struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}) bool {
		return t.Function.Name == "write_memory"
	}) {
		f.noTool++
	}
	msg := map[string]any{"role": "assistant", "content": f.answer}
	finish := "stop"
	if req.Messages[len(req.Messages)-1].Role != "tool" {
		args, _ := json.Marshal(map[string]any{"key": f.key, "value": f.value, "scope": "workflow"})
		msg = map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
			"id": fmt.Sprintf("call_%d", f.calls), "type": "function",
			"function": map[string]any{"name": "write_memory", "arguments": string(args)},
		}}}
		finish = "tool_calls"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": "chatcmpl-fake", "object": "chat.completion", "model": "fake-local",
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
		"usage":   map[string]any{"prompt_tokens": 30, "completion_tokens": 6, "total_tokens": 36},
	})
}

// TestMixedOperatorWorkflow runs the real binaries (State, the Go
// operator, the orchestrator) and the Python operator: the orchestrator
// dispatches "lead" to the Go operator (scripted), which writes memory
// and delegates to "pyagent", served by the Python operator, whose own
// loop asks an OpenAI-compatible server (fakeChatModel) and declares a
// write_memory effect. The workflow completes with both writes applied
// exactly once: each key in State at the revision the orchestrator
// reported, and unchanged after the same Dispatch is repeated (Dispatch
// is idempotent by workflow id).
func TestMixedOperatorWorkflow(t *testing.T) {
	bins := binaries(t)
	dir := t.TempDir()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir}
	wf := "it-mixed-" + randomHex(t, 4)
	model := &fakeChatModel{key: "figures/python", value: map[string]any{"q3": 41.5, "by": "python"}, answer: "The Python agent stored the figures."}
	fake := httptest.NewServer(model)
	t.Cleanup(fake.Close)

	py := startPyOperator(t, "--model-base-url", fake.URL+"/v1", "--model", "fake-local")
	st := startProc(t, "state", []string{bins["state"], "--dev", "--addr", "127.0.0.1:0", "--backend", "memory"}, env)
	goOp := startProc(t, "operator (go)", []string{bins["operator"], "--dev", "--addr", "127.0.0.1:0", "--model", "scripted",
		"--tools", "read", "--workspace", filepath.Join(dir, "workspace"), "--state-addr", st.addr}, env)

	leadValue := "the lead's plan"
	lead := map[string]any{"scripted": map[string]any{
		"turns": []any{
			map[string]any{"text": "Planning; the Python agent stores the figures.", "tool_calls": []any{
				map[string]any{"name": "write_memory", "arguments": map[string]any{"key": "plan/lead", "value": leadValue, "scope": "workflow"}},
				map[string]any{"name": "delegate", "arguments": map[string]any{"agent_id": "pyagent", "message": "Store the Q3 figures."}},
			}},
			map[string]any{"text": "Delegated."},
		},
		"cases": []any{map[string]any{"contains": "Results of delegated tasks", "turns": []any{map[string]any{"text": "Lead done: the figures are stored."}}}},
	}}
	reg, err := json.Marshal(map[string]any{"agents": []any{
		map[string]any{"id": "lead", "operator": goOp.addr, "max_turns": 4, "metadata": lead},
		map[string]any{"id": "pyagent", "operator": py.addr, "max_turns": 4},
	}})
	if err != nil {
		t.Fatal(err)
	}
	agents := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(agents, reg, 0o644); err != nil {
		t.Fatal(err)
	}
	orch := startProc(t, "orchestrator", []string{bins["orchestrator"], "--dev", "--addr", "127.0.0.1:0",
		"--agents", agents, "--state-addr", st.addr, "--data-dir", filepath.Join(dir, "orchestrator")}, env)
	oc := orchestratorv1.NewOrchestratorServiceClient(dial(t, orch.addr))
	sc := statev1.NewStateServiceClient(dial(t, st.addr))

	req := &orchestratorv1.DispatchRequest{AgentId: "lead", WorkflowId: wf, Input: &operatorv1.OperatorInput{
		Message: content.Text("Plan Q3 and store the figures."), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER,
	}}
	ctx, cancel := context.WithTimeout(t.Context(), workflowTimeout)
	defer cancel()
	resp, err := oc.Dispatch(ctx, req)
	if err != nil {
		t.Fatalf("Dispatch: %v", err)
	}
	if got := content.TextOf(resp.GetOutput().GetMessage()); got != "Lead done: the figures are stored." {
		t.Errorf("the workflow answered %q (exit %v), want the lead's answer after the delegation", got, resp.GetOutput().GetExitReason())
	}
	revisions := map[uint64]bool{}
	keys := map[string]bool{}
	for _, e := range resp.GetEffects() {
		if !e.GetApplied() || keys[e.GetIdempotencyKey()] {
			t.Errorf("effect %q applied=%v (%s), or listed twice", e.GetIdempotencyKey(), e.GetApplied(), e.GetDetail())
		}
		keys[e.GetIdempotencyKey()] = true
		if m := writtenDetail.FindStringSubmatch(e.GetDetail()); m != nil {
			rev, _ := strconv.ParseUint(m[1], 10, 64)
			revisions[rev] = true
		}
	}
	if len(revisions) != 2 || len(resp.GetEffects()) != 3 {
		t.Fatalf("effect outcomes %v: want 3 (the lead's write and delegation, the Python agent's write), two of them writes", resp.GetEffects())
	}
	read := func() map[string]uint64 {
		t.Helper()
		got := map[string]uint64{}
		for key, want := range map[string]any{"plan/lead": leadValue, model.key: model.value} {
			r, err := sc.Read(ctx, &statev1.ReadRequest{Scope: scope.Workflow(wf), Key: key})
			if err != nil {
				t.Fatalf("State Read %q: %v", key, err)
			}
			if v, _ := structpb.NewValue(want); !proto.Equal(r.GetValue(), v) {
				t.Errorf("State holds %v under %q, want %v", r.GetValue(), key, v)
			}
			if !revisions[r.GetRevision()] {
				t.Errorf("State holds %q at revision %d, not one the orchestrator reported applying (%v): written more than once", key, r.GetRevision(), revisions)
			}
			got[key] = r.GetRevision()
		}
		return got
	}
	before := read()

	again, err := oc.Dispatch(ctx, req)
	if err != nil {
		t.Fatalf("the same Dispatch again: %v", err)
	}
	if !proto.Equal(again.GetOutput().GetMessage(), resp.GetOutput().GetMessage()) {
		t.Errorf("the repeated Dispatch answered %v, want the first answer %v", again.GetOutput().GetMessage(), resp.GetOutput().GetMessage())
	}
	if after := read(); !maps.Equal(before, after) {
		t.Errorf("revisions %v after the repeated Dispatch, %v before: an effect was applied again", after, before)
	}
	model.mu.Lock()
	defer model.mu.Unlock()
	if model.calls != 2 || model.noTool != 0 || len(model.problems) > 0 {
		t.Errorf("the model server got %d requests (%d without the write_memory tool; problems %v), want 2 (the tool call, then the answer)", model.calls, model.noTool, model.problems)
	}
}

// environmentService is the EnvironmentService's name in
// grpc.health.v1.
const environmentService = "layer0.environment.v1.EnvironmentService"

// TestSwapEnvironmentToLocal runs the real binaries with agentID routed
// to an environment service: first on the process backend (each
// invocation a sandboxed one-shot operator process), then, while the
// State service, the operator and the orchestrator keep running, the
// environment service is stopped and the same binary takes its address
// with the local backend, which only forwards each Run to the running
// operator service. The memory-writing workflow passes before and after,
// and so does the environment conformance suite, with resource limits
// enforced on the process backend and refused on the local one.
func TestSwapEnvironmentToLocal(t *testing.T) {
	bins := binaries(t)
	dir := t.TempDir()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir}
	st := startProc(t, "state", []string{bins["state"], "--dev", "--addr", "127.0.0.1:0", "--backend", "memory"}, env)
	op := startProc(t, "operator", []string{bins["operator"], "--dev", "--addr", "127.0.0.1:0", "--model", "scripted",
		"--tools", "read", "--workspace", filepath.Join(dir, "workspace"), "--state-addr", st.addr}, env)
	process := startProc(t, "environment (process)", []string{bins["environment"], "--dev", "--addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "environment"), "--operator-binary", bins["operator"], "--operator-args", "--tools read"}, env)
	envAddr := process.addr
	agents := filepath.Join(dir, "agents.yaml")
	reg := fmt.Appendf(nil, "agents:\n  - id: %s\n    environment: %q\n    max_turns: 4\n", agentID, envAddr)
	if err := os.WriteFile(agents, reg, 0o644); err != nil {
		t.Fatal(err)
	}
	orch := startProc(t, "orchestrator", []string{bins["orchestrator"], "--dev", "--addr", "127.0.0.1:0",
		"--agents", agents, "--state-addr", st.addr, "--data-dir", filepath.Join(dir, "orchestrator")}, env)
	oc := orchestratorv1.NewOrchestratorServiceClient(dial(t, orch.addr))
	sc := statev1.NewStateServiceClient(dial(t, st.addr))

	sandboxed := newMemoryWorkflow(t, "process-backend")
	sandboxed.run(t, oc, sc)
	t.Logf("workflow %s ran through the environment service's process backend at %s", sandboxed.id, envAddr)
	t.Run("ProcessConformance", func(t *testing.T) {
		envconformance.Run(t, envconformance.Target{Conn: dial(t, envAddr), Unsupported: []string{"gvisor", "microvm", "wasm"}, EnforcesLimits: true})
	})

	process.stopClean(t)
	local := startProc(t, "environment (local)", []string{bins["environment"], "--dev", "--addr", envAddr,
		"--backend", "local", "--operator-addr", op.addr}, env)
	if local.addr != envAddr {
		t.Fatalf("the local environment serves at %s, want the old address %s", local.addr, envAddr)
	}
	for _, p := range []*proc{st, op, orch} {
		if s := p.state(); s != "running" {
			t.Fatalf("%s stopped while the environment service was swapped: %s", p.name, s)
		}
	}
	waitHealthy(t, dial(t, envAddr), environmentService)
	forwarded := newMemoryWorkflow(t, "local-backend")
	forwarded.run(t, oc, sc)
	t.Logf("after the swap, workflow %s ran through the local backend forwarding to the operator at %s", forwarded.id, op.addr)
	t.Run("LocalConformance", func(t *testing.T) {
		envconformance.Run(t, envconformance.Target{Conn: dial(t, envAddr), Unsupported: []string{"process", "container", "gvisor", "microvm", "wasm"}})
	})
}
