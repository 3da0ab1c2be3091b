package agents_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/agents"
	orchserve "github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/state"
)

// behaviour answers one operator call.
type behaviour func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error)

// fakeOperator answers per agent and records every input.
type fakeOperator struct {
	operatorv1.UnimplementedOperatorServiceServer
	mu     sync.Mutex
	agents map[string]behaviour
	calls  []*operatorv1.OperatorInput
}

func startFake(t *testing.T, agents map[string]behaviour) (*fakeOperator, string) {
	f := &fakeOperator{agents: agents}
	return f, harness.ServeFake(t, "operator", func(s *grpcserver.Server) { operatorv1.RegisterOperatorServiceServer(s, f) })
}

func (f *fakeOperator) Execute(ctx context.Context, req *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	in := req.GetInput()
	f.mu.Lock()
	f.calls = append(f.calls, proto.CloneOf(in))
	b := f.agents[in.GetDispatch().GetAgentId()]
	f.mu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("fake operator: no behaviour for agent %q", in.GetDispatch().GetAgentId())
	}
	out, err := b(ctx, in)
	if err != nil {
		return nil, err
	}
	return &operatorv1.ExecuteResponse{Output: out}, nil
}

func (f *fakeOperator) inputs(agent string) []*operatorv1.OperatorInput {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*operatorv1.OperatorInput
	for _, in := range f.calls {
		if in.GetDispatch().GetAgentId() == agent {
			out = append(out, in)
		}
	}
	return out
}

func done(in *operatorv1.OperatorInput, text string, effects ...*typesv1.Effect) *operatorv1.OperatorOutput {
	for i, e := range effects {
		e.IdempotencyKey = fmt.Sprintf("%s/effect/%d", in.GetDispatch().GetDispatchId(), i)
	}
	return &operatorv1.OperatorOutput{
		Message:    content.Text(text),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.Zero), TurnsUsed: 1},
		Effects:    effects,
	}
}

func answer(text string) behaviour {
	return func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		return done(in, text), nil
	}
}

func delegate(agent string) *typesv1.Effect {
	return &typesv1.Effect{Kind: &typesv1.Effect_Delegate{Delegate: &typesv1.Delegate{AgentId: agent, Message: content.Text("go")}}}
}

// delegateOnce delegates to agent on its first call and answers on the
// re-invocation with the result.
func delegateOnce(agent string) behaviour {
	return func(_ context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
		if _, ok := in.GetMetadata().GetFields()["delegations"]; ok {
			return done(in, "done"), nil
		}
		return done(in, "delegating", delegate(agent)), nil
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func startState(t *testing.T) string {
	return harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: harness.Quiet(), Listener: lis, Backend: state.BackendMemory})
	})
}

// orch is an orchestrator under test with its clients.
type orch struct {
	addr   string
	agents agentv1.AgentServiceClient
	orch   orchestratorv1.OrchestratorServiceClient
	stop   func()
}

// startOrch runs an orchestrator (bbolt journal in dir) over the State
// service at stateAddr, seeded from registry (YAML).
func startOrch(t *testing.T, dir, stateAddr, registry string) *orch {
	t.Helper()
	return startOrchOn(t, nil, dir, stateAddr, registry)
}

// backends runs test on the bbolt journal and on Temporal (a dev server
// of its own; skipped where none can be started).
func backends(t *testing.T, test func(t *testing.T, dev *testenv.TemporalDev)) {
	t.Run("bolt", func(t *testing.T) { test(t, nil) })
	t.Run("temporal", func(t *testing.T) { test(t, testenv.Temporal(t)) })
}

// startOrchOn is startOrch on Temporal dev, or on the journal when dev
// is nil.
func startOrchOn(t *testing.T, dev *testenv.TemporalDev, dir, stateAddr, registry string) *orch {
	t.Helper()
	file := filepath.Join(dir, "agents.yaml")
	if err := os.WriteFile(file, []byte(registry), 0o600); err != nil {
		t.Fatal(err)
	}
	stopCtx, stopRun := context.WithCancel(context.Background())
	t.Cleanup(stopRun)
	returned := make(chan struct{})
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		defer close(returned)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(stopCtx, cancel)()
		cfg := orchserve.Config{
			Server: grpcserver.Config{Name: "orchestrator", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:    harness.Quiet(), Listener: lis, Agents: file,
			State:   grpcclient.Config{Target: stateAddr},
			Backend: orchserve.BackendBolt, DataDir: filepath.Join(dir, "journal"), LockTimeout: time.Second,
		}
		if dev != nil {
			cfg.Backend = orchserve.BackendTemporal
			cfg.Temporal = orchserve.Temporal{Address: dev.Address, Namespace: dev.Namespace,
				TaskQueue: "neuron-" + strings.ReplaceAll(t.Name(), "/", "-"), HeartbeatTimeout: 2 * time.Second}
		}
		return orchserve.Run(ctx, cfg)
	})
	cc := harness.Dial(t, addr)
	return &orch{addr: addr, agents: agentv1.NewAgentServiceClient(cc), orch: orchestratorv1.NewOrchestratorServiceClient(cc),
		stop: func() { stopRun(); <-returned }}
}

// waitSeeded returns agent name once the orchestrator's background
// seeding has stored it (a safety bound, not an assertion on speed).
func waitSeeded(t *testing.T, o *orch, name string) *agentv1.GetAgentResponse {
	t.Helper()
	ctx := ctxT(t)
	for {
		resp, err := o.agents.GetAgent(ctx, &agentv1.GetAgentRequest{Name: name})
		if err == nil {
			return resp
		}
		if status.Code(err) != codes.NotFound {
			t.Fatalf("GetAgent %s: %v", name, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("agent %s was not seeded: %v", name, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func opRoute(addr string) *agentv1.Route {
	return &agentv1.Route{Target: &agentv1.Route_Operator{Operator: &agentv1.OperatorRoute{Address: addr}}}
}

func fastRetry() *agentv1.RetryPolicy { return &agentv1.RetryPolicy{MaxAttempts: 1} }

func create(t *testing.T, o *orch, name string, d *agentv1.AgentDefinition) *agentv1.Agent {
	t.Helper()
	resp, err := o.agents.CreateAgent(ctxT(t), &agentv1.CreateAgentRequest{Agent: &agentv1.Agent{Name: name, Definition: d}})
	if err != nil {
		t.Fatalf("CreateAgent %s: %v", name, err)
	}
	return resp.GetAgent()
}

func dispatch(ctx context.Context, o *orch, agent string) (*orchestratorv1.DispatchResponse, error) {
	return o.orch.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: agent,
		Input: &operatorv1.OperatorInput{Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER, Message: content.Text("hello")}})
}

// TestDispatchDefinedAgent: an agent created through AgentService is
// dispatched with its definition: its instructions, model, limits and
// tools reach the operator.
func TestDispatchDefinedAgent(t *testing.T) {
	ctx := ctxT(t)
	fake, opAddr := startFake(t, map[string]behaviour{"helper": answer("hi")})
	o := startOrch(t, t.TempDir(), startState(t), "agents: [{id: placeholder, operator: 127.0.0.1:1}]\n")
	_, err := dispatch(ctx, o, "helper")
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "helper") {
		t.Fatalf("Dispatch of an undefined agent: %v, want NOT_FOUND naming it", err)
	}
	create(t, o, "helper", &agentv1.AgentDefinition{
		Instructions: "You are terse.",
		Model: &agentv1.ModelSettings{Name: "claude-haiku-4-5", Temperature: proto.Float64(0.3),
			ReasoningEffort: agentv1.ReasoningEffort_REASONING_EFFORT_HIGH},
		Limits: &agentv1.Limits{MaxTurns: proto.Uint32(3)},
		Tools: &agentv1.Tools{Builtin: []string{"read"}, Effects: []string{"write_memory"},
			McpServers: []*agentv1.McpServer{{Name: "files", Transport: &agentv1.McpServer_Stdio{Stdio: &agentv1.StdioTransport{Command: "mcp-files", Args: []string{"--ro"}}}}}},
		Memory:          &agentv1.MemorySettings{SessionHistory: proto.Bool(false)},
		ContextStrategy: agentv1.ContextStrategy_CONTEXT_STRATEGY_TRUNCATE,
		Route:           opRoute(opAddr), Retry: fastRetry(),
	})
	resp, err := dispatch(ctx, o, "helper")
	if err != nil {
		t.Fatal(err)
	}
	if got := content.TextOf(resp.GetOutput().GetMessage()); got != "hi" {
		t.Errorf("output %q, want hi", got)
	}
	ins := fake.inputs("helper")
	if len(ins) != 1 {
		t.Fatalf("the operator got %d calls of helper, want 1", len(ins))
	}
	cfg := ins[0].GetConfig()
	if cfg.GetInstructions() != "You are terse." || cfg.GetModel() != "claude-haiku-4-5" || cfg.GetMaxTurns() != 3 ||
		strings.Join(cfg.GetAllowedTools().GetNames(), ",") != "read,write_memory" {
		t.Errorf("the operator got config %v, want the definition's instructions, model, max_turns and tools", cfg)
	}
	if p := cfg.GetModelParameters(); p.GetTemperature() != 0.3 || p.GetReasoningEffort() != operatorv1.ReasoningEffort_REASONING_EFFORT_HIGH {
		t.Errorf("the operator got model parameters %v, want temperature 0.3 and reasoning effort HIGH", p)
	}
	if m := cfg.GetMcpServers(); len(m) != 1 || m[0].GetName() != "files" || m[0].GetStdio().GetCommand() != "mcp-files" ||
		strings.Join(m[0].GetStdio().GetArgs(), " ") != "--ro" {
		t.Errorf("the operator got MCP servers %v, want the definition's files server", m)
	}
	if cfg.SessionHistory == nil || cfg.GetSessionHistory() || cfg.GetContextStrategy() != operatorv1.ContextStrategy_CONTEXT_STRATEGY_TRUNCATE {
		t.Errorf("the operator got session_history %v and context_strategy %v, want false and TRUNCATE (the definition's)", cfg.SessionHistory, cfg.GetContextStrategy())
	}
}

func hasSessionHistory(m *agentv1.MemorySettings) bool { return m != nil && m.SessionHistory != nil }

// TestDefinitionMemoryAndContext: each of a definition's context
// strategies reaches OperatorConfig as the same strategy, and its
// session_history setting as set; a definition setting neither leaves
// both unset (the operator's defaults).
func TestDefinitionMemoryAndContext(t *testing.T) {
	for _, cs := range []agentv1.ContextStrategy{agentv1.ContextStrategy_CONTEXT_STRATEGY_COMPACT, agentv1.ContextStrategy_CONTEXT_STRATEGY_TRUNCATE, agentv1.ContextStrategy_CONTEXT_STRATEGY_NONE} {
		a, err := agents.ToAgent(&agentv1.Agent{Name: "a", Definition: &agentv1.AgentDefinition{
			Route: opRoute("127.0.0.1:1"), ContextStrategy: cs, Memory: &agentv1.MemorySettings{SessionHistory: proto.Bool(true)},
		}})
		if err != nil {
			t.Fatal(err)
		}
		cfg := a.Apply(&operatorv1.OperatorInput{}).GetConfig()
		if cfg.GetContextStrategy().String() != cs.String() || cfg.SessionHistory == nil || !cfg.GetSessionHistory() {
			t.Errorf("definition %v, session_history true: OperatorConfig %v, want the same strategy and session_history true", cs, cfg)
		}
		if back := agents.FromAgent(a).GetDefinition(); back.GetContextStrategy() != cs || !hasSessionHistory(back.GetMemory()) {
			t.Errorf("FromAgent of %v: %v, want the strategy and session_history kept", cs, back)
		}
	}
	a, err := agents.ToAgent(&agentv1.Agent{Name: "a", Definition: &agentv1.AgentDefinition{Route: opRoute("127.0.0.1:1")}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg := a.Apply(&operatorv1.OperatorInput{}).GetConfig(); cfg != nil && cfg.SessionHistory != nil || cfg.GetContextStrategy() != operatorv1.ContextStrategy_CONTEXT_STRATEGY_UNSPECIFIED {
		t.Errorf("a definition without memory or context settings: OperatorConfig %v, want both unset", cfg)
	}
	// The YAML import's spelling, and a misspelt strategy.
	reg, err := orchestrator.ParseRegistry([]byte("agents: [{id: imported, operator: x, session_history: false, context_strategy: truncate}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	y, _ := reg.Lookup("imported")
	if d := agents.FromAgent(y).GetDefinition(); !hasSessionHistory(d.GetMemory()) || d.GetMemory().GetSessionHistory() ||
		d.GetContextStrategy() != agentv1.ContextStrategy_CONTEXT_STRATEGY_TRUNCATE {
		t.Errorf("YAML session_history: false, context_strategy: truncate: definition %v, want both", d)
	}
	if _, err := orchestrator.ParseRegistry([]byte("agents: [{id: imported, operator: x, context_strategy: shrink}]\n")); err == nil ||
		!strings.Contains(err.Error(), "context_strategy") || !strings.Contains(err.Error(), "truncate") {
		t.Errorf("YAML context_strategy: shrink: %v, want an error naming the field and the choices", err)
	}
	// An invocation's own settings win over the definition's.
	a.Defaults.ContextStrategy, a.Defaults.SessionHistory = operatorv1.ContextStrategy_CONTEXT_STRATEGY_NONE, proto.Bool(false)
	in := &operatorv1.OperatorInput{Config: &operatorv1.OperatorConfig{SessionHistory: proto.Bool(true), ContextStrategy: operatorv1.ContextStrategy_CONTEXT_STRATEGY_COMPACT}}
	if cfg := a.Apply(in).GetConfig(); !cfg.GetSessionHistory() || cfg.GetContextStrategy() != operatorv1.ContextStrategy_CONTEXT_STRATEGY_COMPACT {
		t.Errorf("an input setting both: OperatorConfig %v, want its own values", cfg)
	}
}

// TestAllowlist: delegating to an agent outside the delegation allowlist
// fails the workflow with FAILED_PRECONDITION naming both agents; one in
// it runs.
func TestAllowlist(t *testing.T) { backends(t, testAllowlist) }

func testAllowlist(t *testing.T, dev *testenv.TemporalDev) {
	ctx := ctxT(t)
	fake, opAddr := startFake(t, map[string]behaviour{
		"boss":    delegateOnce("outside"),
		"manager": delegateOnce("worker"),
		"worker":  answer("work"),
		"outside": answer("should not run"),
	})
	o := startOrchOn(t, dev, t.TempDir(), startState(t), "agents: [{id: placeholder, operator: 127.0.0.1:1}]\n")
	for _, n := range []string{"worker", "outside"} {
		create(t, o, n, &agentv1.AgentDefinition{Route: opRoute(opAddr), Retry: fastRetry()})
	}
	allow := &agentv1.Delegation{AllowedAgents: []string{"worker"}}
	create(t, o, "boss", &agentv1.AgentDefinition{Route: opRoute(opAddr), Retry: fastRetry(), Delegation: allow})
	create(t, o, "manager", &agentv1.AgentDefinition{Route: opRoute(opAddr), Retry: fastRetry(), Delegation: allow})

	_, err := dispatch(ctx, o, "boss")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"boss"`) || !strings.Contains(err.Error(), `"outside"`) {
		t.Errorf("boss delegating to outside: %v, want FAILED_PRECONDITION naming boss and outside", err)
	}
	if n := len(fake.inputs("outside")); n != 0 {
		t.Errorf("outside ran %d times, want 0", n)
	}
	if _, err := dispatch(ctx, o, "manager"); err != nil {
		t.Errorf("manager delegating to worker (allowed): %v", err)
	}
	if n := len(fake.inputs("worker")); n != 1 {
		t.Errorf("worker ran %d times, want 1", n)
	}
}

// TestWorkflowKeepsItsRevision: an agent changed while a workflow of it
// runs: the workflow's later steps of that agent use the revision it
// started with; a new dispatch uses the new one.
func TestWorkflowKeepsItsRevision(t *testing.T) { backends(t, testWorkflowKeepsItsRevision) }

func testWorkflowKeepsItsRevision(t *testing.T, dev *testenv.TemporalDev) {
	ctx := ctxT(t)
	childCalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fake, opAddr := startFake(t, map[string]behaviour{
		"root": delegateOnce("child"),
		"child": func(ctx context.Context, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error) {
			once.Do(func() { close(childCalled) })
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return done(in, "child done"), nil
		},
	})
	o := startOrchOn(t, dev, t.TempDir(), startState(t), "agents: [{id: placeholder, operator: 127.0.0.1:1}]\n")
	create(t, o, "child", &agentv1.AgentDefinition{Route: opRoute(opAddr), Retry: fastRetry()})
	v1 := create(t, o, "root", &agentv1.AgentDefinition{Route: opRoute(opAddr), Retry: fastRetry(), Model: &agentv1.ModelSettings{Name: "claude-sonnet-4-5"}})

	errc := make(chan error, 1)
	go func() {
		_, err := dispatch(ctx, o, "root")
		errc <- err
	}()
	select {
	case <-childCalled:
	case err := <-errc:
		t.Fatalf("the workflow ended before its child ran: %v", err)
	}
	if _, err := o.agents.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{ExpectedRevision: v1.GetRevision(), Agent: &agentv1.Agent{Name: "root",
		Definition: &agentv1.AgentDefinition{Route: opRoute(opAddr), Retry: fastRetry(), Model: &agentv1.ModelSettings{Name: "claude-haiku-4-5"}}}}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	var models []string
	for _, in := range fake.inputs("root") {
		models = append(models, in.GetConfig().GetModel())
	}
	if strings.Join(models, ",") != "claude-sonnet-4-5,claude-sonnet-4-5" {
		t.Errorf("the workflow's two steps of root ran with models %v, want the starting revision's claude-sonnet-4-5 both times", models)
	}
	if _, err := dispatch(ctx, o, "root"); err != nil {
		t.Fatal(err)
	}
	ins := fake.inputs("root")
	if got := ins[len(ins)-2].GetConfig().GetModel(); got != "claude-haiku-4-5" {
		t.Errorf("a new dispatch of root ran with model %q, want the new revision's claude-haiku-4-5", got)
	}
}

// TestFileAgentComesBack: an agent of the --agents file that is missing
// from State after the seeding (deleted, or State replaced by an empty
// one) is created again at its next dispatch, as a restart would.
func TestFileAgentComesBack(t *testing.T) {
	ctx := ctxT(t)
	_, opAddr := startFake(t, map[string]behaviour{"seeded": answer("back")})
	o := startOrch(t, t.TempDir(), startState(t), fmt.Sprintf("agents: [{id: seeded, operator: %q}]\n", opAddr))
	first := waitSeeded(t, o, "seeded")
	if _, err := o.agents.DeleteAgent(ctx, &agentv1.DeleteAgentRequest{Name: "seeded"}); err != nil {
		t.Fatal(err)
	}
	if resp, err := dispatch(ctx, o, "seeded"); err != nil || content.TextOf(resp.GetOutput().GetMessage()) != "back" {
		t.Fatalf("Dispatch of the deleted file agent: %v, %v; want it seeded again and run", resp, err)
	}
	again, err := o.agents.GetAgent(ctx, &agentv1.GetAgentRequest{Name: "seeded"})
	if err != nil || again.GetAgent().GetRevision() <= first.GetAgent().GetRevision() {
		t.Errorf("GetAgent after the dispatch: %v, %v; want it defined again at a new revision", again, err)
	}
}

// TestSharedAndDurable: two orchestrators on one State service see the
// same definitions; they survive a restart; restarting with the same
// --agents file does not overwrite an agent changed since it was seeded.
func TestSharedAndDurable(t *testing.T) {
	ctx := ctxT(t)
	_, opAddr := startFake(t, map[string]behaviour{"mine": answer("from b"), "seeded": answer("seeded")})
	stateAddr := startState(t)
	registry := fmt.Sprintf("agents: [{id: seeded, operator: %q, system_addendum: from the file}]\n", opAddr)
	dirA := t.TempDir()
	a := startOrch(t, dirA, stateAddr, registry)
	b := startOrch(t, t.TempDir(), stateAddr, registry)

	mine := create(t, a, "mine", &agentv1.AgentDefinition{Route: opRoute(opAddr), Retry: fastRetry(), Description: "defined on a"})
	got, err := b.agents.GetAgent(ctx, &agentv1.GetAgentRequest{Name: "mine"})
	if err != nil || got.GetAgent().GetRevision() != mine.GetRevision() {
		t.Fatalf("GetAgent on the other orchestrator: %v, %v; want revision %d", got, err, mine.GetRevision())
	}
	if resp, err := dispatch(ctx, b, "mine"); err != nil || content.TextOf(resp.GetOutput().GetMessage()) != "from b" {
		t.Fatalf("Dispatch on the other orchestrator: %v, %v", resp, err)
	}

	seeded := waitSeeded(t, a, "seeded")
	if seeded.GetAgent().GetDefinition().GetSystemAddendum() != "from the file" {
		t.Fatalf("seeded agent: %v, want the file's definition", seeded.GetAgent())
	}
	changed := proto.CloneOf(seeded.GetAgent())
	changed.Definition.SystemAddendum = "changed through the API"
	if _, err := a.agents.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{Agent: changed, ExpectedRevision: seeded.GetAgent().GetRevision()}); err != nil {
		t.Fatal(err)
	}

	a.stop()
	b.stop()
	a = startOrch(t, dirA, stateAddr, registry)
	for _, n := range []string{"mine", "seeded"} {
		if _, err := a.agents.GetAgent(ctx, &agentv1.GetAgentRequest{Name: n}); err != nil {
			t.Errorf("GetAgent %s after a restart: %v", n, err)
		}
	}
	after, err := a.agents.GetAgent(ctx, &agentv1.GetAgentRequest{Name: "seeded"})
	if err != nil {
		t.Fatal(err)
	}
	if got := after.GetAgent().GetDefinition().GetSystemAddendum(); got != "changed through the API" {
		t.Errorf("after a restart with the same --agents file the seeded agent says %q, want the change made through the API kept", got)
	}
}
