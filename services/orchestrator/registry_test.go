package orchestrator_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/orchestrator"
)

func regUSD(s string) decimal.NullDecimal {
	return decimal.NewNullDecimal(decimal.RequireFromString(s))
}

func regStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// regAgentDiff lists how got differs from want.
func regAgentDiff(got, want *orchestrator.Agent) []string {
	var diffs []string
	if !proto.Equal(got.Spec, want.Spec) {
		diffs = append(diffs, fmt.Sprintf("Spec = %v, want %v", got.Spec, want.Spec))
	}
	if !proto.Equal(got.Defaults.Metadata, want.Defaults.Metadata) {
		diffs = append(diffs, fmt.Sprintf("Metadata = %v, want %v", got.Defaults.Metadata, want.Defaults.Metadata))
	}
	for _, m := range []struct {
		name      string
		got, want decimal.NullDecimal
	}{{"Budget", got.Defaults.Budget, want.Defaults.Budget}, {"MaxCost", got.Defaults.MaxCost, want.Defaults.MaxCost}} {
		if m.got.Valid != m.want.Valid || !m.got.Decimal.Equal(m.want.Decimal) {
			diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", m.name, m.got, m.want))
		}
	}
	g, w := *got, *want
	g.Spec, w.Spec = nil, nil
	g.Defaults.Metadata, w.Defaults.Metadata = nil, nil
	g.Defaults.Budget, w.Defaults.Budget = decimal.NullDecimal{}, decimal.NullDecimal{}
	g.Defaults.MaxCost, w.Defaults.MaxCost = decimal.NullDecimal{}, decimal.NullDecimal{}
	if !reflect.DeepEqual(g, w) {
		diffs = append(diffs, fmt.Sprintf("got  %+v\nwant %+v", g, w))
	}
	return diffs
}

func TestLoadRegistryTestdata(t *testing.T) {
	r, err := orchestrator.LoadRegistry(filepath.Join("testdata", "agents.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fiveMin := 5 * time.Minute
	want := []*orchestrator.Agent{
		{
			ID:       "researcher",
			Operator: "127.0.0.1:7071",
			Defaults: orchestrator.AgentDefaults{
				Model:          "claude-sonnet-4-5",
				DowngradeModel: "claude-haiku-4-5",
				Budget:         regUSD("1.00"),
				MaxCost:        regUSD("0.25"),
				MaxTurns:       10,
				MaxDuration:    2 * time.Minute,
				AllowedTools:   []string{"read", "write_memory", "delegate"},
				SystemAddendum: "Cite sources.",
				Metadata:       regStruct(t, map[string]any{"team": "research", "tier": 2}),
			},
			Retry: orchestrator.RetryPolicy{MaxAttempts: 4, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second},
		},
		{
			ID:       "writer.v2",
			Operator: "127.0.0.1:7071",
			Defaults: orchestrator.AgentDefaults{
				Model:        "claude-sonnet-4-5",
				Budget:       regUSD("0.5"),
				MaxDuration:  fiveMin,
				AllowedTools: []string{},
			},
			Retry: orchestrator.RetryPolicy{MaxAttempts: 4, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second},
		},
		{
			ID:          "sandboxed",
			Environment: "127.0.0.1:7073",
			Spec: &environmentv1.EnvironmentSpec{
				Timeout: durationpb.New(time.Minute),
				Isolation: []*environmentv1.IsolationBoundary{
					{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}},
					{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{Image: "ghcr.io/secbear/operator:latest"}}},
				},
				Credentials: []*environmentv1.CredentialRef{
					{Name: "anthropic-api-key", Injection: &environmentv1.CredentialInjection{
						Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "ANTHROPIC_API_KEY"}}}},
					{Name: "github-token", Injection: &environmentv1.CredentialInjection{
						Method: &environmentv1.CredentialInjection_Sidecar{Sidecar: &environmentv1.SidecarInjection{Host: "api.github.com"}}}},
				},
				Resources: &environmentv1.ResourceLimits{
					Cpu:            proto.String("1"),
					Memory:         proto.String("512Mi"),
					MaxProcesses:   proto.Uint32(64),
					MaxOutputBytes: proto.Uint64(1 << 20),
					CpuTime:        durationpb.New(90 * time.Second),
				},
				Network: &environmentv1.NetworkPolicy{
					DefaultAction: environmentv1.NetworkAction_NETWORK_ACTION_DENY,
					Rules: []*environmentv1.NetworkRule{
						{Destination: "api.anthropic.com", Port: proto.Uint32(443), Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW},
					},
				},
			},
			Defaults: orchestrator.AgentDefaults{Model: "claude-sonnet-4-5", MaxDuration: fiveMin},
			Retry:    orchestrator.RetryPolicy{MaxAttempts: 1, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second},
		},
	}
	got := r.Agents()
	if len(got) != len(want) {
		t.Fatalf("got %d agents, want %d", len(got), len(want))
	}
	for i, w := range want {
		for _, d := range regAgentDiff(got[i], w) {
			t.Errorf("agent %d (%s): %s", i, w.ID, d)
		}
		a, err := r.Lookup(w.ID)
		if err != nil || a != got[i] {
			t.Errorf("Lookup(%q) = %p, %v; want %p", w.ID, a, err, got[i])
		}
	}
	// Agents returns a copy of the list.
	got[0] = nil
	if r.Agents()[0] == nil {
		t.Error("changing the slice Agents returned changed the registry")
	}
}

func TestParseRegistryErrors(t *testing.T) {
	longID := strings.Repeat("a", 257)
	tests := []struct {
		name, yaml string
		want       string // the message between "agent registry: " and ": invalid argument"
		contains   bool   // want is only a part of the message
	}{
		// The file.
		{"empty", "", `the file is empty: want "agents:" with at least one agent`, false},
		{"only comments", "# nothing\n", `the file is empty: want "agents:" with at least one agent`, false},
		{"a list", "- id: a\n", `want a mapping with "agents:" (and optionally "defaults:") at the top level`, false},
		{"no agents", "defaults: {operator: x}\n", `no agents: want "agents:" with at least one agent`, false},
		{"empty agents", "agents: []\n", `no agents: want "agents:" with at least one agent`, false},
		{"unknown top-level field", "agents: [{id: a, operator: x}]\nagentz: 1\n", `unknown field "agentz"`, false},
		{"agents not a list", "agents: {id: a}\n", `agents: got an object, want a list`, false},
		{"syntax error", "agents:\n  - id: a\n   operator: x\n", `yaml: line 2: did not find expected '-' indicator`, true},
		{"duplicate key", "agents: [{id: a, operator: x, operator: y}]\n", `key "operator" already set in map`, true},
		{"busy_session unknown", "agents: [{id: a, operator: x, busy_session: queue}]\n", `agent "a": busy_session "queue": want reject, enqueue, interrupt or signal (leave it out to run messages side by side)`, false},
		// Ids.
		{"agent not a mapping", "agents: [researcher]\n", `agents[0]: want a mapping with an id, such as {id: researcher, operator: 127.0.0.1:7071}`, false},
		{"no id", "agents: [{id: a, operator: x}, {operator: x}]\n", `agents[1]: id is required`, false},
		{"empty id", "agents: [{id: '', operator: x}]\n", `agents[0]: id is required`, false},
		{"id not a string", "agents: [{id: [a], operator: x}]\n", `agents[0]: id: got an array, want a string`, false},
		{"id with a space", "agents: [{id: 'a b', operator: x}]\n", `agent "a b": id may contain only letters, digits, '.', '_' and '-'`, false},
		{"id with a slash", "agents: [{id: a/b, operator: x}]\n", `agent "a/b": id may contain only letters, digits, '.', '_' and '-'`, false},
		{"id not ASCII", "agents: [{id: é, operator: x}]\n", `agent "é": id may contain only letters, digits, '.', '_' and '-'`, false},
		{"id too long", "agents: [{id: " + longID + ", operator: x}]\n", `agents[0]: id "` + longID[:32] + `"...: 257 characters, at most 256`, false},
		{"duplicate id", "agents: [{id: a, operator: x}, {id: b, operator: x}, {id: a, operator: z}]\n", `agent "a": id is already used by agents[0]`, false},
		// Fields.
		{"unknown field", "agents: [{id: a, operator: x, modle: m}]\n", `agent "a": unknown field "modle"`, false},
		{"unknown retry field", "agents: [{id: a, operator: x, retry: {max_attempt: 2}}]\n", `agent "a": unknown field "max_attempt"`, true},
		{"no address", "agents: [{id: a}]\n", `agent "a": set operator (an operator service address) or environment (an environment service address)`, false},
		{"both addresses", "agents: [{id: a, operator: x, environment: e}]\n", `agent "a": set operator or environment, not both`, false},
		{"empty operator", "agents: [{id: a, operator: ''}]\n", `agent "a": operator is empty: want an address such as "127.0.0.1:7071"`, false},
		{"empty environment", "agents: [{id: a, environment: ''}]\n", `agent "a": environment is empty: want an address such as "127.0.0.1:7073"`, false},
		{"model a YAML boolean", "agents: [{id: a, operator: x, model: yes}]\n", `agent "a": model: got a bool, want a string; quote it`, false},
		{"operator not a string", "agents: [{id: a, operator: {host: x}}]\n", `agent "a": operator: got an object, want a string`, false},
		{"spec without environment", "agents: [{id: a, operator: x, spec: {timeout: 1s}}]\n",
			`agent "a": spec is only allowed with environment: an agent on an operator runs without isolation`, false},
		{"spec with the default operator", "defaults: {operator: x}\nagents: [{id: a, spec: {}}]\n",
			`agent "a": spec is only allowed with environment: an agent on an operator runs without isolation`, false},
		{"spec not a mapping", "agents: [{id: a, environment: e, spec: 60s}]\n", `agent "a": spec: want a mapping, such as {timeout: 60s}`, false},
		{"spec unknown field", "agents: [{id: a, environment: e, spec: {timout: 1s}}]\n", `agent "a": spec: unknown field "timout"`, false},
		{"spec bad duration", "agents: [{id: a, environment: e, spec: {timeout: soon}}]\n", `agent "a": spec: invalid google.protobuf.Duration value "soon"`, false},
		{"spec number for a string", "agents: [{id: a, environment: e, spec: {resources: {cpu: 1}}}]\n", `agent "a": spec: invalid value for string field cpu: 1`, true},
		{"spec rule: timeout", "agents: [{id: a, environment: e, spec: {timeout: -1m}}]\n", `agent "a": spec.timeout: must be greater than 0s`, false},
		{"spec rule: oneof", "agents: [{id: a, environment: e, spec: {isolation: [{}]}}]\n", `agent "a": spec.isolation[0].kind: exactly one field is required in oneof`, false},
		{"spec rules: two", "agents: [{id: a, environment: e, spec: {credentials: [{name: '', injection: {file: {path: rel}}}]}}]\n",
			`agent "a": spec.credentials[0].name: must be at least 1 characters; spec.credentials[0].injection.file.path: does not match regex pattern ` + "`^/`", false},
		{"empty model", "agents: [{id: a, operator: x, model: ''}]\n", `agent "a": model is empty: leave it out for the operator's default`, false},
		{"empty downgrade model", "agents: [{id: a, operator: x, downgrade_model: ''}]\n", `agent "a": downgrade_model is empty: leave it out for none`, false},
		{"negative budget", "agents: [{id: a, operator: x, budget: '-1'}]\n", `agent "a": budget "-1": must not be negative`, false},
		{"negative budget number", "agents: [{id: a, operator: x, budget: -0.5}]\n", `agent "a": budget -0.5: must not be negative`, false},
		{"budget not a number", "agents: [{id: a, operator: x, budget: lots}]\n", `agent "a": budget "lots": want a non-negative amount of USD such as "0.25"`, false},
		{"budget a list", "agents: [{id: a, operator: x, budget: [1]}]\n", `agent "a": budget [1]: want a non-negative amount of USD such as "0.25"`, false},
		{"budget too long", "agents: [{id: a, operator: x, budget: '1e70'}]\n", `agent "a": budget "1e70": money amount "1000000000000000"...: 71 characters, at most 64: invalid argument`, false},
		{"negative max_cost", "agents: [{id: a, operator: x, max_cost: '-0.01'}]\n", `agent "a": max_cost "-0.01": must not be negative`, false},
		{"max_turns 0", "agents: [{id: a, operator: x, max_turns: 0}]\n", `agent "a": max_turns 0: want a whole number from 1 to 4294967295; leave it out for the operator's default`, false},
		{"max_turns negative", "agents: [{id: a, operator: x, max_turns: -1}]\n", `agent "a": max_turns -1: want a whole number from 1 to 4294967295; leave it out for the operator's default`, false},
		{"max_turns fraction", "agents: [{id: a, operator: x, max_turns: 2.5}]\n", `agent "a": max_turns 2.5: want a whole number from 1 to 4294967295; leave it out for the operator's default`, false},
		{"max_turns string", "agents: [{id: a, operator: x, max_turns: '10'}]\n", `agent "a": max_turns "10": want a whole number from 1 to 4294967295; leave it out for the operator's default`, false},
		{"max_turns too big", "agents: [{id: a, operator: x, max_turns: 4294967296}]\n", `agent "a": max_turns 4294967296: want a whole number from 1 to 4294967295; leave it out for the operator's default`, false},
		{"max_duration zero", "agents: [{id: a, operator: x, max_duration: 0s}]\n", `agent "a": max_duration "0s": must be positive`, false},
		{"max_duration negative", "agents: [{id: a, operator: x, max_duration: -1m}]\n", `agent "a": max_duration "-1m": must be positive`, false},
		{"max_duration number", "agents: [{id: a, operator: x, max_duration: 120}]\n", `agent "a": max_duration 120: want a duration such as "90s" or "2m"`, false},
		{"max_duration bad", "agents: [{id: a, operator: x, max_duration: soon}]\n", `agent "a": max_duration "soon": want a duration such as "90s" or "2m"`, false},
		{"empty tool name", "agents: [{id: a, operator: x, allowed_tools: [read, '']}]\n", `agent "a": allowed_tools[1] is empty`, false},
		{"allowed_tools not a list", "agents: [{id: a, operator: x, allowed_tools: read}]\n", `agent "a": allowed_tools: got a string, want a list of strings`, false},
		{"metadata not a mapping", "agents: [{id: a, operator: x, metadata: [team]}]\n", `agent "a": metadata: want a mapping, such as {team: research}`, false},
		// Retry.
		{"max_attempts 0", "agents: [{id: a, operator: x, retry: {max_attempts: 0}}]\n", `agent "a": retry.max_attempts 0: want a whole number from 1 to 20 (1 = no retry)`, false},
		{"max_attempts 21", "agents: [{id: a, operator: x, retry: {max_attempts: 21}}]\n", `agent "a": retry.max_attempts 21: want a whole number from 1 to 20 (1 = no retry)`, false},
		{"initial_backoff zero", "agents: [{id: a, operator: x, retry: {initial_backoff: 0ms}}]\n", `agent "a": retry.initial_backoff "0ms": must be positive`, false},
		{"max_backoff negative", "agents: [{id: a, operator: x, retry: {max_backoff: -1s}}]\n", `agent "a": retry.max_backoff "-1s": must be positive`, false},
		{"max_backoff number", "agents: [{id: a, operator: x, retry: {max_backoff: 5}}]\n", `agent "a": retry.max_backoff 5: want a duration such as "90s" or "2m"`, false},
		{"initial above max", "agents: [{id: a, operator: x, retry: {initial_backoff: 2s, max_backoff: 1s}}]\n", `agent "a": retry.initial_backoff 2s is above retry.max_backoff 1s`, false},
		{"initial above the default max", "agents: [{id: a, operator: x, retry: {initial_backoff: 10s}}]\n", `agent "a": retry.initial_backoff 10s is above retry.max_backoff 5s`, false},
		{"initial above max after the merge", "defaults: {retry: {initial_backoff: 3s}}\nagents: [{id: a, operator: x, retry: {max_backoff: 2s}}]\n",
			`agent "a": retry.initial_backoff 3s is above retry.max_backoff 2s`, false},
		{"retry not a mapping", "agents: [{id: a, operator: x, retry: 3}]\n", `agent "a": retry: got a number, want a mapping`, false},
		// Defaults.
		{"defaults not a mapping", "defaults: [x]\nagents: [{id: a, operator: x}]\n", `defaults: want a mapping of agent fields`, false},
		{"defaults with an id", "defaults: {id: x}\nagents: [{id: a, operator: x}]\n", `defaults: id is not allowed here: defaults apply to every agent`, false},
		{"defaults with both addresses", "defaults: {operator: x, environment: e}\nagents: [{id: a}]\n", `defaults: set operator or environment, not both`, false},
		{"defaults unknown field", "defaults: {modle: x}\nagents: [{id: a, operator: x}]\n", `defaults: unknown field "modle"`, false},
		{"defaults bad budget", "defaults: {budget: '-1'}\nagents: [{id: a, operator: x}]\n", `defaults: budget "-1": must not be negative`, false},
		{"defaults bad retry", "defaults: {retry: {max_attempts: 50}}\nagents: [{id: a, operator: x}]\n", `defaults: retry.max_attempts 50: want a whole number from 1 to 20 (1 = no retry)`, false},
		{"defaults bad spec", "defaults: {environment: e, spec: {timeout: 0s}}\nagents: [{id: a}]\n", `defaults: spec.timeout: must be greater than 0s`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := orchestrator.ParseRegistry([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("ParseRegistry succeeded with %d agents, want an error", len(r.Agents()))
			}
			if !errors.Is(err, errs.InvalidArgument) {
				t.Errorf("error %q does not wrap errs.InvalidArgument", err)
			}
			msg := err.Error()
			if tt.contains {
				if !strings.HasPrefix(msg, "agent registry: ") || !strings.Contains(msg, tt.want) {
					t.Errorf("error\n got %q\nwant it to contain %q", msg, tt.want)
				}
				return
			}
			if want := "agent registry: " + tt.want + ": invalid argument"; msg != want {
				t.Errorf("error\n got %q\nwant %q", msg, want)
			}
		})
	}
}

func TestLoadRegistryErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	empty := write("empty.yaml", "")
	bad := write("bad.yaml", "agents:\n  - id: a\n    operator: [x\n")
	invalid := write("invalid.yaml", "agents: [{id: a, operator: x, max_turns: 0}]\n")
	missing := filepath.Join(dir, "missing.yaml")
	tests := []struct {
		path, prefix, contains string
		is                     error
	}{
		{empty, "agent registry " + empty + ": ", `the file is empty`, errs.InvalidArgument},
		{bad, "agent registry " + bad + ": ", `yaml: line `, errs.InvalidArgument},
		{invalid, "agent registry " + invalid + ": ", `agent "a": max_turns 0`, errs.InvalidArgument},
		{missing, "agent registry: open " + missing + ": ", `no such file`, os.ErrNotExist},
	}
	for _, tt := range tests {
		_, err := orchestrator.LoadRegistry(tt.path)
		if err == nil {
			t.Errorf("LoadRegistry(%s) succeeded", tt.path)
			continue
		}
		if !strings.HasPrefix(err.Error(), tt.prefix) || !strings.Contains(err.Error(), tt.contains) {
			t.Errorf("LoadRegistry(%s) error\n got %q\nwant prefix %q containing %q", tt.path, err, tt.prefix, tt.contains)
		}
		if !errors.Is(err, tt.is) {
			t.Errorf("LoadRegistry(%s) error %q is not %v", tt.path, err, tt.is)
		}
	}
}

// TestParseRegistryInheritance: what an agent takes from the defaults.
func TestParseRegistryInheritance(t *testing.T) {
	spec := func(d time.Duration) *environmentv1.EnvironmentSpec {
		return &environmentv1.EnvironmentSpec{Timeout: durationpb.New(d)}
	}
	defaultRetry := orchestrator.RetryPolicy{MaxAttempts: 3, InitialBackoff: 200 * time.Millisecond, MaxBackoff: 5 * time.Second}
	id256 := strings.Repeat("x", 256)
	tests := []struct {
		name, yaml string
		want       orchestrator.Agent
	}{
		{"no defaults, no retry", "agents: [{id: a, operator: x}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: defaultRetry}},
		{"id charset and length", "agents: [{id: " + id256 + ", operator: x}, {id: A-z_0.9, operator: x}]",
			orchestrator.Agent{ID: id256, Operator: "x", Retry: defaultRetry}},
		{"the default operator", "defaults: {operator: x}\nagents: [{id: a}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: defaultRetry}},
		{"environment overrides the default operator", "defaults: {operator: x}\nagents: [{id: a, environment: e}]",
			orchestrator.Agent{ID: "a", Environment: "e", Retry: defaultRetry}},
		{"operator overrides the default environment and spec", "defaults: {environment: e, spec: {timeout: 1m}}\nagents: [{id: a, operator: x}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: defaultRetry}},
		{"the default environment and spec", "defaults: {environment: e, spec: {timeout: 1m}}\nagents: [{id: a}]",
			orchestrator.Agent{ID: "a", Environment: "e", Spec: spec(time.Minute), Retry: defaultRetry}},
		{"the default spec with an own environment", "defaults: {spec: {timeout: 1m}}\nagents: [{id: a, environment: z}]",
			orchestrator.Agent{ID: "a", Environment: "z", Spec: spec(time.Minute), Retry: defaultRetry}},
		{"an own spec replaces the default one", "defaults: {environment: e, spec: {timeout: 1m, resources: {memory: 1Gi}}}\nagents: [{id: a, spec: {timeout: 2s}}]",
			orchestrator.Agent{ID: "a", Environment: "e", Spec: spec(2 * time.Second), Retry: defaultRetry}},
		{"spec field names, both forms", "agents: [{id: a, environment: e, spec: {resources: {maxOutputBytes: '18446744073709551615', max_processes: 2, cpuTime: 1.5s}}}]",
			orchestrator.Agent{ID: "a", Environment: "e", Retry: defaultRetry, Spec: &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{
				MaxOutputBytes: proto.Uint64(math.MaxUint64), MaxProcesses: proto.Uint32(2), CpuTime: durationpb.New(1500 * time.Millisecond)}}}},
		{"own fields win whole", "defaults: {operator: x, model: m, max_turns: 3, allowed_tools: [read], metadata: {a: 1, b: 2}, system_addendum: s}\n" +
			"agents: [{id: a, model: own, allowed_tools: [], metadata: {b: 3}, budget: 0}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: defaultRetry, Defaults: orchestrator.AgentDefaults{
				Model: "own", MaxTurns: 3, AllowedTools: []string{}, Metadata: regStruct(t, map[string]any{"b": 3}),
				SystemAddendum: "s", Budget: regUSD("0")}}},
		{"inherited fields", "defaults: {operator: x, model: m, downgrade_model: d, budget: '2', max_cost: 0.1, max_turns: 3, max_duration: 1h, allowed_tools: [read], metadata: {a: 1}, system_addendum: s, searchable_history: true}\n" +
			"agents: [{id: a}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: defaultRetry, Defaults: orchestrator.AgentDefaults{
				Model: "m", DowngradeModel: "d", Budget: regUSD("2"), MaxCost: regUSD("0.1"), MaxTurns: 3, MaxDuration: time.Hour,
				AllowedTools: []string{"read"}, Metadata: regStruct(t, map[string]any{"a": 1}), SystemAddendum: "s", SearchableHistory: true}}},
		{"downgrade_model without model", "agents: [{id: a, operator: x, downgrade_model: d}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: defaultRetry, Defaults: orchestrator.AgentDefaults{DowngradeModel: "d"}}},
		{"money forms", "agents: [{id: a, operator: x, budget: 0.0000001, max_cost: '12.50'}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: defaultRetry, Defaults: orchestrator.AgentDefaults{
				Budget: regUSD("0.0000001"), MaxCost: regUSD("12.5")}}},
		{"retry merged field by field", "defaults: {operator: x, retry: {max_attempts: 5, initial_backoff: 1s}}\nagents: [{id: a, retry: {initial_backoff: 50ms, max_backoff: 10s}}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: orchestrator.RetryPolicy{MaxAttempts: 5, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 10 * time.Second}}},
		{"retry bounds", "agents: [{id: a, operator: x, retry: {max_attempts: 20, initial_backoff: 1s, max_backoff: 1s}}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: orchestrator.RetryPolicy{MaxAttempts: 20, InitialBackoff: time.Second, MaxBackoff: time.Second}}},
		{"null fields are absent", "defaults: {operator: x, model: m}\nagents: [{id: a, model: null, budget: null, retry: null, allowed_tools: null}]",
			orchestrator.Agent{ID: "a", Operator: "x", Retry: defaultRetry, Defaults: orchestrator.AgentDefaults{Model: "m"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := orchestrator.ParseRegistry([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range regAgentDiff(r.Agents()[0], &tt.want) {
				t.Error(d)
			}
		})
	}
}

func regInput(mod func(in *operatorv1.OperatorInput)) *operatorv1.OperatorInput {
	in := &operatorv1.OperatorInput{Message: content.Text("hi"), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK}
	mod(in)
	return in
}

func TestApply(t *testing.T) {
	full := &orchestrator.Agent{ID: "a", Operator: "x", Defaults: orchestrator.AgentDefaults{
		Model:          "m",
		DowngradeModel: "cheap", // not an OperatorConfig field
		Budget:         regUSD("9"),
		MaxCost:        regUSD("0.25"),
		MaxTurns:       7,
		MaxDuration:    2 * time.Minute,
		AllowedTools:   []string{"read", "write"},
		SystemAddendum: "Cite sources.",
		Metadata:       regStruct(t, map[string]any{"team": "research", "tier": 1}),

		SearchableHistory: true,
	}}
	noTools := &orchestrator.Agent{ID: "b", Operator: "x", Defaults: orchestrator.AgentDefaults{AllowedTools: []string{}}}
	bare := &orchestrator.Agent{ID: "c", Operator: "x"}
	filled := &operatorv1.OperatorConfig{
		MaxTurns:       proto.Uint32(7),
		MaxCost:        &typesv1.Money{Amount: "0.25"},
		MaxDuration:    durationpb.New(2 * time.Minute),
		Model:          proto.String("m"),
		AllowedTools:   &operatorv1.AllowedTools{Names: []string{"read", "write"}},
		SystemAddendum: proto.String("Cite sources."),

		SearchableHistory: proto.Bool(true),
	}
	own := &operatorv1.OperatorConfig{
		MaxTurns:       proto.Uint32(2),
		MaxCost:        &typesv1.Money{Amount: "1"},
		MaxDuration:    durationpb.New(time.Second),
		Model:          proto.String("own"),
		AllowedTools:   &operatorv1.AllowedTools{Names: []string{"ls"}},
		SystemAddendum: proto.String("Be brief."),

		SearchableHistory: proto.Bool(false),
	}
	// Set to the zero value: still set, so kept.
	zeros := &operatorv1.OperatorConfig{
		MaxTurns:       proto.Uint32(0),
		MaxCost:        &typesv1.Money{},
		MaxDuration:    &durationpb.Duration{},
		Model:          proto.String(""),
		AllowedTools:   &operatorv1.AllowedTools{},
		SystemAddendum: proto.String(""),

		SearchableHistory: proto.Bool(false),
	}
	tests := []struct {
		name  string
		agent *orchestrator.Agent
		in    *operatorv1.OperatorInput
		want  *operatorv1.OperatorInput
	}{
		{"unset config filled", full,
			regInput(func(in *operatorv1.OperatorInput) {}),
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = filled
				in.Metadata = regStruct(t, map[string]any{"team": "research", "tier": 1})
			})},
		{"empty config filled", full,
			regInput(func(in *operatorv1.OperatorInput) { in.Config = &operatorv1.OperatorConfig{} }),
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = filled
				in.Metadata = regStruct(t, map[string]any{"team": "research", "tier": 1})
			})},
		{"set fields kept", full,
			regInput(func(in *operatorv1.OperatorInput) { in.Config = own }),
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = own
				in.Metadata = regStruct(t, map[string]any{"team": "research", "tier": 1})
			})},
		{"zero values are set", full,
			regInput(func(in *operatorv1.OperatorInput) { in.Config = zeros }),
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = zeros
				in.Metadata = regStruct(t, map[string]any{"team": "research", "tier": 1})
			})},
		{"some set, some filled", full,
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = &operatorv1.OperatorConfig{Model: proto.String("own"), AllowedTools: &operatorv1.AllowedTools{}}
			}),
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = &operatorv1.OperatorConfig{
					MaxTurns: proto.Uint32(7), MaxCost: &typesv1.Money{Amount: "0.25"}, MaxDuration: durationpb.New(2 * time.Minute),
					Model: proto.String("own"), AllowedTools: &operatorv1.AllowedTools{}, SystemAddendum: proto.String("Cite sources."),
					SearchableHistory: proto.Bool(true),
				}
				in.Metadata = regStruct(t, map[string]any{"team": "research", "tier": 1})
			})},
		{"metadata merged, input keys win", full,
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = own
				in.Metadata = regStruct(t, map[string]any{"tier": 3, "trace": "t1"})
			}),
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = own
				in.Metadata = regStruct(t, map[string]any{"team": "research", "tier": 3, "trace": "t1"})
			})},
		{"empty allowed tools default is no tools", noTools,
			regInput(func(in *operatorv1.OperatorInput) {}),
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{}}
			})},
		{"empty allowed tools default keeps the input's tools", noTools,
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{Names: []string{"ls"}}}
			}),
			regInput(func(in *operatorv1.OperatorInput) {
				in.Config = &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{Names: []string{"ls"}}}
			})},
		{"no defaults: unchanged, config stays absent", bare,
			regInput(func(in *operatorv1.OperatorInput) { in.Metadata = regStruct(t, map[string]any{"k": "v"}) }),
			regInput(func(in *operatorv1.OperatorInput) { in.Metadata = regStruct(t, map[string]any{"k": "v"}) })},
		{"no defaults: empty config kept", bare,
			regInput(func(in *operatorv1.OperatorInput) { in.Config = &operatorv1.OperatorConfig{} }),
			regInput(func(in *operatorv1.OperatorInput) { in.Config = &operatorv1.OperatorConfig{} })},
		{"nil input", full, nil,
			&operatorv1.OperatorInput{Config: filled, Metadata: regStruct(t, map[string]any{"team": "research", "tier": 1})}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := proto.Clone(tt.in)
			got := tt.agent.Apply(tt.in)
			if !proto.Equal(got, tt.want) {
				t.Errorf("Apply =\n%v\nwant\n%v", got, tt.want)
			}
			if !proto.Equal(tt.in, before) {
				t.Errorf("Apply modified its input:\n%v\nwas\n%v", tt.in, before)
			}
			if got == tt.in && tt.in != nil {
				t.Error("Apply returned its input, not a copy")
			}
			// The result shares nothing with the input or the agent.
			if got.Config != nil && tt.in != nil && tt.in.Config != nil && got.Config == tt.in.Config {
				t.Error("the result shares its config with the input")
			}
		})
	}

	// Changing the result changes neither the input nor the agent.
	in := regInput(func(in *operatorv1.OperatorInput) { in.Metadata = regStruct(t, map[string]any{"x": 1}) })
	out := full.Apply(in)
	out.Metadata.Fields["team"] = structpb.NewStringValue("changed")
	out.Metadata.Fields["x"] = structpb.NewStringValue("changed")
	out.Config.AllowedTools.Names[0] = "changed"
	if full.Defaults.Metadata.Fields["team"].GetStringValue() != "research" || full.Defaults.AllowedTools[0] != "read" {
		t.Errorf("changing the result changed the agent: %+v", full.Defaults)
	}
	if in.Metadata.Fields["x"].GetNumberValue() != 1 {
		t.Errorf("changing the result changed the input: %v", in.Metadata)
	}
}

func TestBackoff(t *testing.T) {
	p := orchestrator.RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	one := func() float64 { return 1 } // clamped: the ceiling itself
	ceilings := []time.Duration{100, 200, 400, 800, 1000, 1000, 1000}
	for i, c := range ceilings {
		attempt := i + 1
		c *= time.Millisecond
		if got := p.Backoff(attempt, one); got != c {
			t.Errorf("Backoff(%d) ceiling = %s, want %s", attempt, got, c)
		}
		if got := p.Backoff(attempt, func() float64 { return 0.5 }); got != c/2 {
			t.Errorf("Backoff(%d, 0.5) = %s, want %s", attempt, got, c/2)
		}
		if got := p.Backoff(attempt, func() float64 { return 0 }); got != 0 {
			t.Errorf("Backoff(%d, 0) = %s, want 0", attempt, got)
		}
		// Full jitter with the real source: within [0, ceiling], and not
		// always the same.
		seen := map[time.Duration]bool{}
		for range 200 {
			d := p.Backoff(attempt, nil)
			if d < 0 || d > c {
				t.Fatalf("Backoff(%d) = %s, outside [0, %s]", attempt, d, c)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("Backoff(%d): only %d distinct waits in 200, want jitter", attempt, len(seen))
		}
	}
	tests := []struct {
		name    string
		p       orchestrator.RetryPolicy
		attempt int
		rnd     float64
		want    time.Duration
	}{
		{"attempt 0 counts as 1", p, 0, 1, 100 * time.Millisecond},
		{"negative attempt counts as 1", p, -3, 1, 100 * time.Millisecond},
		{"huge attempt: no overflow", p, math.MaxInt, 1, time.Second},
		{"huge max backoff: no overflow", orchestrator.RetryPolicy{InitialBackoff: time.Second, MaxBackoff: math.MaxInt64}, 200, 1, math.MaxInt64},
		{"zero policy: default initial", orchestrator.RetryPolicy{}, 1, 1, 200 * time.Millisecond},
		{"zero policy: default max", orchestrator.RetryPolicy{}, 30, 1, 5 * time.Second},
		{"initial above max is capped", orchestrator.RetryPolicy{InitialBackoff: time.Minute, MaxBackoff: time.Second}, 1, 1, time.Second},
		{"rnd above 1 clamped", p, 2, 7, 200 * time.Millisecond},
		{"rnd below 0 clamped", p, 2, -1, 0},
		{"rnd NaN is 0", p, 2, math.NaN(), 0},
	}
	for _, tt := range tests {
		got := tt.p.Backoff(tt.attempt, func() float64 { return tt.rnd })
		if got != tt.want && !(tt.want == math.MaxInt64 && got > math.MaxInt64/2) {
			t.Errorf("%s: Backoff = %s, want %s", tt.name, got, tt.want)
		}
		if got < 0 {
			t.Errorf("%s: Backoff = %s, negative", tt.name, got)
		}
	}
}

func TestRegistryLookup(t *testing.T) {
	var b strings.Builder
	b.WriteString("defaults: {operator: x}\nagents:\n")
	for i := range 25 {
		fmt.Fprintf(&b, "  - id: a%02d\n", 24-i) // file order, not sorted
	}
	many, err := orchestrator.ParseRegistry([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	few, err := orchestrator.ParseRegistry([]byte("agents: [{id: writer, operator: x}, {id: researcher, operator: x}, {id: critic, operator: x}]"))
	if err != nil {
		t.Fatal(err)
	}
	var first20 []string
	for i := range 20 {
		first20 = append(first20, fmt.Sprintf("a%02d", 24-i))
	}
	tests := []struct {
		r    *orchestrator.Registry
		id   string
		want string
	}{
		{few, "coder", `agent "coder" is not in the agent registry (known agents: writer, researcher, critic): not found`},
		{few, "", `agent "" is not in the agent registry (known agents: writer, researcher, critic): not found`},
		{few, "Writer", `agent "Writer" is not in the agent registry (known agents: writer, researcher, critic): not found`},
		{many, "b", `agent "b" is not in the agent registry (known agents: ` + strings.Join(first20, ", ") + ` and 5 more): not found`},
	}
	for _, tt := range tests {
		a, err := tt.r.Lookup(tt.id)
		if a != nil || err == nil {
			t.Errorf("Lookup(%q) = %v, %v; want an error", tt.id, a, err)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("Lookup(%q) error\n got %q\nwant %q", tt.id, err, tt.want)
		}
		if !errors.Is(err, errs.NotFound) {
			t.Errorf("Lookup(%q) error does not wrap errs.NotFound", tt.id)
		}
	}
	if a, err := many.Lookup("a07"); err != nil || a.ID != "a07" || a.Operator != "x" {
		t.Errorf("Lookup(a07) = %+v, %v", a, err)
	}
}
