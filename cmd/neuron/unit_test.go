package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/orchestrator"
)

// testCLI is a cli writing to buffers, with an empty environment.
func testCLI() (*cli, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	return &cli{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}, &out, &errOut
}

func TestReport(t *testing.T) {
	retryable := errs.ToStatus(fmt.Errorf("the model timed out: %w", errs.Retryable)).Err()
	for _, tc := range []struct {
		name string
		err  error
		code int
		line string
	}{
		{"ok", nil, 0, ""},
		{"help", flag.ErrHelp, 0, ""},
		{"usage", usageErrorf("state get", "name a scope"), 2, "neuron state get: name a scope (see 'neuron state get --help')\n"},
		{"exit code only", &exitError{code: 3}, 3, ""},
		{"exit with message", &exitError{code: 1, msg: "up: no state binary"}, 1, "neuron: up: no state binary\n"},
		{"not found", &rpcError{service: "orchestrator", addr: "a:1", err: status.Error(codes.NotFound, "agent \"x\" is unknown")},
			15, "neuron: NOT_FOUND: agent \"x\" is unknown\n"},
		{"command hint wins", &rpcError{service: "orchestrator", addr: "a:1", hints: map[codes.Code]string{codes.NotFound: "try list"},
			err: status.Error(codes.NotFound, "gone")}, 15, "neuron: NOT_FOUND: gone; try list\n"},
		{"refused", &rpcError{service: "orchestrator", addr: "127.0.0.1:9", err: status.Error(codes.Unavailable,
			"connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:9: connect: connection refused\"")},
			24, "neuron: UNAVAILABLE: cannot reach the orchestrator at 127.0.0.1:9: connection refused; is `neuron up` running? (or point --addr at the orchestrator)\n"},
		{"retryable operator", &rpcError{service: "orchestrator", addr: "a:1", err: retryable},
			24, "neuron: UNAVAILABLE: the model timed out: retryable; the operator failed in a way a retry may fix: run it again\n"},
		{"multi-line message", &rpcError{service: "state", addr: "a:1", err: status.Error(codes.InvalidArgument, "bad\nkey")},
			13, "neuron: INVALID_ARGUMENT: bad key; check the arguments (--help lists them)\n"},
		{"other", errors.New("disk full"), 1, "neuron: disk full\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, errOut := testCLI()
			if got := c.report(tc.err); got != tc.code {
				t.Errorf("exit code %d, want %d", got, tc.code)
			}
			if errOut.String() != tc.line {
				t.Errorf("stderr %q, want %q", errOut.String(), tc.line)
			}
		})
	}
}

func TestExitCodeFor(t *testing.T) {
	// The operator's one-shot scheme: 10 + the gRPC code.
	for c, want := range map[codes.Code]int{codes.Canceled: 11, codes.NotFound: 15, codes.ResourceExhausted: 18, codes.Unavailable: 24} {
		if got := exitCodeFor(c); got != want {
			t.Errorf("%v: %d, want %d", c, got, want)
		}
	}
	if codeName(codes.FailedPrecondition) != "FAILED_PRECONDITION" || codeName(codes.Code(99)) != "CODE_99" {
		t.Errorf("codeName: %q %q", codeName(codes.FailedPrecondition), codeName(codes.Code(99)))
	}
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  []string
		json bool
		addr string
	}{
		{[]string{"assistant", "do it", "--json"}, []string{"assistant", "do it"}, true, ""},
		{[]string{"--json", "assistant", "--addr", "h:1", "do", "it"}, []string{"assistant", "do", "it"}, true, "h:1"},
		{[]string{"assistant", "--", "--json", "x"}, []string{"assistant", "--json", "x"}, false, ""},
		{nil, nil, false, ""},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		j := fs.Bool("json", false, "")
		a := fs.String("addr", "", "")
		pos, err := parseArgs(fs, "run", tc.args)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if strings.Join(pos, "|") != strings.Join(tc.pos, "|") || *j != tc.json || *a != tc.addr {
			t.Errorf("%q: pos %q json %v addr %q; want %q %v %q", tc.args, pos, *j, *a, tc.pos, tc.json, tc.addr)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	_, err := parseArgs(fs, "run", []string{"a", "--nope"})
	var ue *usageError
	if !errors.As(err, &ue) || ue.cmd != "run" {
		t.Errorf("unknown flag: %v, want a usage error of run", err)
	}
}

func TestScopeFlags(t *testing.T) {
	for _, tc := range []struct {
		flags scopeFlags
		want  *typesv1.Scope
		err   string
	}{
		{scopeFlags{session: "s1"}, scope.Session("s1"), ""},
		{scopeFlags{workflow: "w"}, scope.Workflow("w"), ""},
		{scopeFlags{workflow: "w", agent: "a"}, scope.Agent("w", "a"), ""},
		{scopeFlags{global: true}, scope.Global(), ""},
		{scopeFlags{custom: "team"}, scope.Custom("team"), ""},
		{scopeFlags{}, nil, "name a scope"},
		{scopeFlags{agent: "a"}, nil, "--agent needs --workflow"},
		{scopeFlags{global: true, session: "s"}, nil, "name one scope, not --session and --global"},
	} {
		got, err := tc.flags.scope("state get")
		if tc.err != "" {
			var ue *usageError
			if !errors.As(err, &ue) || !strings.Contains(ue.msg, tc.err) {
				t.Errorf("%+v: error %v, want a usage error containing %q", tc.flags, err, tc.err)
			}
			continue
		}
		if err != nil || !proto.Equal(got, tc.want) {
			t.Errorf("%+v: %v, %v; want %v", tc.flags, got, err, tc.want)
		}
	}
}

// TestAgentRegistry parses every registry neuron up can write with the
// orchestrator's own parser.
func TestAgentRegistry(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  registryConfig
	}{
		{"sandboxed scripted", registryConfig{route: routeEnvironment, operatorAddr: "127.0.0.1:1", environmentAddr: "127.0.0.1:2", scripted: true}},
		{"operator scripted", registryConfig{route: routeOperator, operatorAddr: "127.0.0.1:1", environmentAddr: "127.0.0.1:2", scripted: true}},
		{"operator real model", registryConfig{route: routeOperator, operatorAddr: "127.0.0.1:1", model: "llama3.2: \"8b\""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yml, err := agentRegistry(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			reg, err := orchestrator.ParseRegistry(yml)
			if err != nil {
				t.Fatalf("%v\n%s", err, yml)
			}
			for _, id := range []string{"assistant", "researcher"} {
				a, err := reg.Lookup(id)
				if err != nil {
					t.Fatal(err)
				}
				switch tc.cfg.route {
				case routeEnvironment:
					if a.Environment != "127.0.0.1:2" || a.Operator != "" || len(a.Spec.GetIsolation()) != 1 || a.Spec.GetIsolation()[0].GetProcess() == nil {
						t.Errorf("%s: environment %q operator %q spec %v; want the process sandbox of 127.0.0.1:2", id, a.Environment, a.Operator, a.Spec)
					}
				default:
					if a.Operator != "127.0.0.1:1" || a.Environment != "" {
						t.Errorf("%s: operator %q environment %q; want the operator 127.0.0.1:1", id, a.Operator, a.Environment)
					}
				}
				_, hasScript := a.Defaults.Metadata.GetFields()["scripted"]
				if hasScript != tc.cfg.scripted {
					t.Errorf("%s: script in metadata %v, want %v", id, hasScript, tc.cfg.scripted)
				}
				if a.Defaults.Model != tc.cfg.model {
					t.Errorf("%s: model %q, want %q", id, a.Defaults.Model, tc.cfg.model)
				}
			}
			a, _ := reg.Lookup("assistant")
			if !a.Defaults.Budget.Valid || a.Defaults.Budget.Decimal.String() != "1" {
				t.Errorf("assistant budget %v, want 1.00", a.Defaults.Budget)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	obs := func(typ string, data map[string]any) *lifecyclev1.LifecycleEvent {
		v, err := structpb.NewValue(data)
		if err != nil {
			t.Fatal(err)
		}
		return &lifecyclev1.LifecycleEvent{Event: &lifecyclev1.LifecycleEvent_Observable{Observable: &lifecyclev1.ObservableEvent{EventType: typ, Data: v}}}
	}
	for _, tc := range []struct {
		ev   *lifecyclev1.LifecycleEvent
		want string
	}{
		{obs(eventDispatchDone, map[string]any{"dispatch_id": "w#1", "exit": "EXIT_KIND_COMPLETE", "effects": 2.0, "cost": "0.01", "duration_ms": 12.0}),
			"operator call w#1: COMPLETE, 2 effect(s), cost $0.01, 12ms"},
		{obs("orchestrator.dispatch.failed", map[string]any{"dispatch_id": "w#2", "code": 14.0, "message": "down"}),
			"operator call w#2 failed: UNAVAILABLE: down"},
		{obs("orchestrator.effect.applied", map[string]any{"effect": "write_memory", "detail": "written (revision 3)"}),
			"effect write_memory applied: written (revision 3)"},
		{obs("orchestrator.workflow.completed", map[string]any{"steps": 3.0, "spent": "0.5", "exit": "EXIT_KIND_COMPLETE"}),
			"workflow completed: 3 operator call(s), spent $0.5, exit COMPLETE"},
		{obs("acme.custom", map[string]any{"k": "v"}), `acme.custom {"k":"v"}`},
		{&lifecyclev1.LifecycleEvent{Event: &lifecyclev1.LifecycleEvent_Budget{Budget: &lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_CostIncurred{
			CostIncurred: &lifecyclev1.CostIncurred{Cost: &typesv1.Money{Amount: "0.01"}, Cumulative: &typesv1.Money{Amount: "0.03"}}}}}},
			"cost +$0.01 (workflow total $0.03)"},
		{&lifecyclev1.LifecycleEvent{Event: &lifecyclev1.LifecycleEvent_Compaction{Compaction: &lifecyclev1.CompactionEvent{Kind: &lifecyclev1.CompactionEvent_CompactionComplete{
			CompactionComplete: &lifecyclev1.CompactionComplete{Strategy: "sliding_window", TokensFreed: 900}}}}},
			"context compacted (sliding_window, 900 tokens freed)"},
	} {
		if got := describe(tc.ev); got != tc.want {
			t.Errorf("describe: %q, want %q", got, tc.want)
		}
	}
	if !workflowEnded(obs("orchestrator.workflow.failed", nil)) || workflowEnded(obs("orchestrator.workflow.started", nil)) || workflowEnded(obs("x.completed", nil)) {
		t.Error("workflowEnded: wrong verdicts")
	}
}

func TestPrintResultEffects(t *testing.T) {
	var b bytes.Buffer
	kinds := effectKinds{}
	kinds.learn(&lifecyclev1.LifecycleEvent{Event: &lifecyclev1.LifecycleEvent_Observable{Observable: &lifecyclev1.ObservableEvent{
		EventType: "orchestrator.effect.applied",
		Data:      structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"idempotency_key": structpb.NewStringValue("w#1/0"), "effect": structpb.NewStringValue("delegate")}}),
	}}})
	printResult(&b, "assistant", &orchestratorv1.DispatchResponse{
		WorkflowId: "w", TotalCost: &typesv1.Money{Amount: "0.25"},
		Effects: []*orchestratorv1.EffectOutcome{{IdempotencyKey: "w#1/0", Applied: true, Detail: "ran"}, {IdempotencyKey: "w#1/1", Detail: "no handler"}},
	}, kinds)
	for _, want := range []string{"cost:     $0.25 for the whole workflow", "  applied      delegate      ran  [w#1/0]", "  NOT applied  effect        no handler  [w#1/1]"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %q:\n%s", want, b.String())
		}
	}
}

func TestServingAddr(t *testing.T) {
	for line, want := range map[string]string{
		`{"time":"t","level":"INFO","msg":"SERVING","addr":"127.0.0.1:7072","dev":true}`: "127.0.0.1:7072",
		`{"msg":"not SERVING yet","addr":"x"}`:                                           "",
		`level=INFO msg=SERVING addr=127.0.0.1:1`:                                        "",
	} {
		got, ok := servingAddr(line)
		if got != want || ok != (want != "") {
			t.Errorf("%s: %q %v, want %q", line, got, ok, want)
		}
	}
	if got := readableLog(`{"time":"t","level":"ERROR","msg":"listen failed","service":"state","addr":"a:1","n":2}`); got != `ERROR listen failed addr="a:1" n=2` {
		t.Errorf("readableLog: %q", got)
	}
}

// TestUsageErrors runs commands in process that fail before any call.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"frobnicate"}, exitUsage, `neuron: unknown command "frobnicate"`},
		{[]string{"run", "assistant"}, exitUsage, "want AGENT and TASK"},
		{[]string{"run", "a", "b", "--budget", "-1"}, exitUsage, `--budget "-1"`},
		{[]string{"run", "a", "b", "--metadata", "[1]"}, exitUsage, "--metadata: want a JSON object"},
		{[]string{"workflows", "frob"}, exitUsage, `unknown subcommand "frob"`},
		{[]string{"workflows", "show"}, exitUsage, "wrong number of arguments"},
		{[]string{"workflows", "list", "--status", "sleeping"}, exitUsage, `--status "sleeping"`},
		{[]string{"state", "put", "k", "not json", "--global"}, exitUsage, "store text with --text"},
		{[]string{"events", "--kind", "weather"}, exitUsage, `--kind "weather"`},
		{[]string{"events", "--after", "-3"}, exitUsage, "invalid value"},
		{[]string{"up", "--isolation", "vm"}, exitUsage, `--isolation "vm"`},
		{[]string{"up", "--state-addr", "127.0.0.1:7070"}, exitUsage, "both 127.0.0.1:7070"},
	} {
		c, _, errOut := testCLI()
		if got := c.main(context.Background(), tc.args); got != tc.code || !strings.Contains(errOut.String(), tc.msg) {
			t.Errorf("neuron %q: exit %d, stderr %q; want %d and %q", tc.args, got, errOut.String(), tc.code, tc.msg)
		}
	}
	c, out, _ := testCLI()
	if got := c.main(context.Background(), []string{"help", "run"}); got != 0 || !strings.Contains(out.String(), "Usage: neuron run AGENT TASK...") {
		t.Errorf("neuron help run: exit %d, %q", got, out.String())
	}
}

// TestUpModel checks how neuron up picks the model and the route from the
// environment.
func TestUpModel(t *testing.T) {
	dir := t.TempDir()
	f := func() upFlags {
		m := map[string]*string{}
		for i, n := range serviceNames {
			a := fmt.Sprintf("127.0.0.1:%d", 17000+i)
			m[n] = &a
		}
		return upFlags{binDir: dir, dataDir: dir, addrs: m, isolation: "auto"}
	}
	env := func(kv map[string]string) *cli {
		c, _, _ := testCLI()
		c.getenv = func(k string) string { return kv[k] }
		return c
	}
	// OPENAI_BASE_URL alone needs --model.
	_, err := env(map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"}).planUp(f())
	var ue *usageError
	if !errors.As(err, &ue) || !strings.Contains(ue.msg, "--model") {
		t.Errorf("OPENAI_BASE_URL without --model: %v", err)
	}
	// --model without a provider.
	fl0 := f()
	fl0.model = "claude-sonnet-4-5"
	if _, err := env(nil).planUp(fl0); !errors.As(err, &ue) || !strings.Contains(ue.msg, "needs a model provider") {
		t.Errorf("--model without a key: %v", err)
	}
	// A model server named by a base URL cannot be forced into the
	// sandbox (it has no network); a public API's key can (the egress
	// proxy adds it): that plan fails later, on the missing binaries or
	// the host's sandbox support, not on the key.
	fl := f()
	fl.isolation = "process"
	if _, err := env(map[string]string{"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://127.0.0.1:1/v1"}).planUp(fl); !errors.As(err, &ue) || !strings.Contains(ue.msg, "OPENAI_API_KEY") {
		t.Errorf("--isolation process with a base URL: %v", err)
	}
	if _, err := env(map[string]string{"ANTHROPIC_API_KEY": "k"}).planUp(fl); errors.As(err, &ue) {
		t.Errorf("--isolation process with a key: %v, want it planned sandboxed", err)
	}
	if d := sidecarOf("ANTHROPIC_API_KEY", func(string) string { return "" }); d == nil || d.Host != "api.anthropic.com" {
		t.Errorf("sidecarOf(ANTHROPIC_API_KEY) = %v", d)
	}
	reg, err := agentRegistry(registryConfig{route: routeEnvironment, environmentAddr: "127.0.0.1:1", sidecar: sidecarOf("OPENAI_API_KEY", func(string) string { return "" })})
	if err != nil || !strings.Contains(string(reg), "credentials: [{name: model-key, injection: {sidecar: {host: api.openai.com") {
		t.Errorf("the registry of a sandboxed real model: %v\n%s", err, reg)
	}
	// The binaries are missing from dir: a plain error naming make build.
	_, err = env(nil).planUp(f())
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitFailure || !strings.Contains(ee.msg, "make build") {
		t.Errorf("missing binaries: %v", err)
	}
}
