package effect_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/effect"
)

// full is an invocation with a session, a workflow and an agent.
var full = tool.DeclareContext{SessionID: "s1", WorkflowID: "wf1", AgentID: "a1", IdempotencyKey: "d1/0"}

func mustValue(t *testing.T, v any) *structpb.Value {
	t.Helper()
	pv, err := structpb.NewValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

func write(s *typesv1.Scope, key string, v *structpb.Value) *typesv1.Effect {
	return &typesv1.Effect{IdempotencyKey: "d1/0", Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{Scope: s, Key: key, Value: v}}}
}

func del(s *typesv1.Scope, key string) *typesv1.Effect {
	return &typesv1.Effect{IdempotencyKey: "d1/0", Kind: &typesv1.Effect_DeleteMemory{DeleteMemory: &typesv1.DeleteMemory{Scope: s, Key: key}}}
}

func byName(t *testing.T, name string) tool.EffectTool {
	t.Helper()
	for _, et := range effect.All() {
		if et.Spec().Name == name {
			return et
		}
	}
	t.Fatalf("no tool %q", name)
	return nil
}

func TestAll(t *testing.T) {
	r := tool.NewRegistry()
	var names []string
	for _, et := range effect.All() {
		names = append(names, et.Spec().Name)
		if err := r.RegisterEffect(et); err != nil {
			t.Errorf("RegisterEffect(%s): %v", et.Spec().Name, err)
		}
		if et.Spec().Tier != tool.SideEffecting || et.Spec().Description == "" {
			t.Errorf("%s: spec %+v", et.Spec().Name, et.Spec())
		}
	}
	if got := strings.Join(names, ","); got != "write_memory,delete_memory,delegate,handoff,signal" {
		t.Errorf("All() = %s", got)
	}
	for _, n := range r.Names() {
		if e, _ := r.Lookup(n); !e.Effect {
			t.Errorf("%s is not an effect tool in the registry", n)
		}
	}
}

func TestDeclare(t *testing.T) {
	obj := mustValue(t, map[string]any{"theme": "dark", "n": 3.0, "tags": []any{"a", true, nil}})
	tests := []struct {
		name    string
		tool    string
		dc      tool.DeclareContext
		input   string
		want    *typesv1.Effect
		wantAck string
	}{
		{
			name: "write, default scope is the session", tool: "write_memory", dc: full,
			input: `{"key":"user/prefs","value":{"theme":"dark","n":3,"tags":["a",true,null]}}`,
			want:  write(scope.Session("s1"), "user/prefs", obj), wantAck: "Memory written.",
		},
		{
			name: "write session", tool: "write_memory", dc: full,
			input: `{"key":"k","value":"v","scope":"session"}`,
			want:  write(scope.Session("s1"), "k", structpb.NewStringValue("v")), wantAck: "Memory written.",
		},
		{
			name: "write workflow", tool: "write_memory", dc: full,
			input: `{"key":"k","value":1.5,"scope":"workflow"}`,
			want:  write(scope.Workflow("wf1"), "k", structpb.NewNumberValue(1.5)), wantAck: "Memory written.",
		},
		{
			name: "write agent", tool: "write_memory", dc: full,
			input: `{"key":"k","value":false,"scope":"agent"}`,
			want:  write(scope.Agent("wf1", "a1"), "k", structpb.NewBoolValue(false)), wantAck: "Memory written.",
		},
		{
			name: "write global without a session", tool: "write_memory", dc: tool.DeclareContext{IdempotencyKey: "d1/0"},
			input: `{"key":"k","value":null,"scope":"global"}`,
			want:  write(scope.Global(), "k", structpb.NewNullValue()), wantAck: "Memory written.",
		},
		{
			name: "write large exact integer", tool: "write_memory", dc: full,
			input: `{"key":"k","value":[9007199254740992,-9007199254740992,1e300,0.1,1e-400,18014398509481984]}`,
			want: write(scope.Session("s1"), "k", mustValue(t, []any{
				float64(1 << 53), -float64(1 << 53), 1e300, 0.1, 0.0, float64(1 << 54),
			})), wantAck: "Memory written.",
		},
		{
			name: "delete", tool: "delete_memory", dc: full,
			input: `{"key":"user/prefs"}`,
			want:  del(scope.Session("s1"), "user/prefs"), wantAck: "Memory deleted.",
		},
		{
			name: "delete agent", tool: "delete_memory", dc: full,
			input: `{"key":"k","scope":"agent"}`,
			want:  del(scope.Agent("wf1", "a1"), "k"), wantAck: "Memory deleted.",
		},
		{
			name: "delegate", tool: "delegate", dc: full,
			input: `{"agent_id":"researcher","message":"Find the 2024 revenue of ACME."}`,
			want: &typesv1.Effect{IdempotencyKey: "d1/0", Kind: &typesv1.Effect_Delegate{Delegate: &typesv1.Delegate{
				AgentId: "researcher", Message: content.Text("Find the 2024 revenue of ACME."),
			}}},
			wantAck: "Delegation requested.",
		},
		{
			name: "delegate with session", tool: "delegate", dc: full,
			input: `{"agent_id":"researcher","message":"again","session_id":"s9"}`,
			want: &typesv1.Effect{IdempotencyKey: "d1/0", Kind: &typesv1.Effect_Delegate{Delegate: &typesv1.Delegate{
				AgentId: "researcher", Message: content.Text("again"), SessionId: "s9",
			}}},
			wantAck: "Delegation requested.",
		},
		{
			name: "handoff", tool: "handoff", dc: full,
			input: `{"agent_id":"billing"}`,
			want: &typesv1.Effect{IdempotencyKey: "d1/0", Kind: &typesv1.Effect_Handoff{Handoff: &typesv1.Handoff{
				AgentId: "billing",
			}}},
			wantAck: "Handoff initiated.",
		},
		{
			name: "handoff with state", tool: "handoff", dc: full,
			input: `{"agent_id":"billing","state":{"theme":"dark","n":3,"tags":["a",true,null]}}`,
			want: &typesv1.Effect{IdempotencyKey: "d1/0", Kind: &typesv1.Effect_Handoff{Handoff: &typesv1.Handoff{
				AgentId: "billing", State: obj,
			}}},
			wantAck: "Handoff initiated.",
		},
		{
			name: "signal", tool: "signal", dc: tool.DeclareContext{IdempotencyKey: "d1/0"},
			input: `{"workflow_id":"wf7","signal_type":"approve"}`,
			want: &typesv1.Effect{IdempotencyKey: "d1/0", Kind: &typesv1.Effect_Signal{Signal: &typesv1.SignalEffect{
				WorkflowId: "wf7", Payload: &typesv1.SignalPayload{SignalType: "approve"},
			}}},
			wantAck: "Signal sent.",
		},
		{
			name: "signal with data", tool: "signal", dc: full,
			input: `{"workflow_id":"wf7","signal_type":"user_feedback","data":"looks good"}`,
			want: &typesv1.Effect{IdempotencyKey: "d1/0", Kind: &typesv1.Effect_Signal{Signal: &typesv1.SignalEffect{
				WorkflowId: "wf7", Payload: &typesv1.SignalPayload{SignalType: "user_feedback", Data: structpb.NewStringValue("looks good")},
			}}},
			wantAck: "Signal sent.",
		},
	}
	r := tool.NewRegistry()
	for _, et := range effect.All() {
		if err := r.RegisterEffect(et); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Directly, and through the registry (which validates first).
			for via, declare := range map[string]func() (*typesv1.Effect, string, error){
				"tool": func() (*typesv1.Effect, string, error) {
					return byName(t, tt.tool).Declare(tt.dc, json.RawMessage(tt.input))
				},
				"registry": func() (*typesv1.Effect, string, error) { return r.Declare(tt.dc, tt.tool, json.RawMessage(tt.input)) },
			} {
				eff, ack, err := declare()
				if err != nil {
					t.Fatalf("%s: Declare: %v", via, err)
				}
				if !proto.Equal(eff, tt.want) || ack != tt.wantAck {
					t.Errorf("%s: Declare =\n%v, %q\nwant\n%v, %q", via, eff, ack, tt.want, tt.wantAck)
				}
				if err := protovalidate.Validate(eff); err != nil {
					t.Errorf("%s: protovalidate: %v", via, err)
				}
			}
		})
	}
}

func TestDeclareErrors(t *testing.T) {
	deep := strings.Repeat("[", effect.MaxDepth+1) + strings.Repeat("]", effect.MaxDepth+1)
	okDeep := strings.Repeat("[", effect.MaxDepth) + strings.Repeat("]", effect.MaxDepth)
	tests := []struct {
		name    string
		tool    string
		dc      tool.DeclareContext
		input   string
		wantErr string // "" for success
		kind    *errs.Kind
	}{
		{
			name: "no session, default scope", tool: "write_memory", dc: tool.DeclareContext{WorkflowID: "wf1", AgentID: "a1", IdempotencyKey: "k"},
			input:   `{"key":"k","value":1}`,
			wantErr: `no scope was given and the default scope "session" is unavailable: this invocation has no session; pass "scope" as "workflow", "agent" or "global"`,
		},
		{
			name: "no session, explicit", tool: "delete_memory", dc: tool.DeclareContext{IdempotencyKey: "k"},
			input:   `{"key":"k","scope":"session"}`,
			wantErr: `scope "session" is unavailable: this invocation has no session; pass "scope" as "global"`,
		},
		{
			name: "no workflow", tool: "write_memory", dc: tool.DeclareContext{SessionID: "s1", IdempotencyKey: "k"},
			input:   `{"key":"k","value":1,"scope":"workflow"}`,
			wantErr: `scope "workflow" is unavailable: this invocation is not part of a workflow; use "session" or "global"`,
		},
		{
			name: "no agent", tool: "write_memory", dc: tool.DeclareContext{SessionID: "s1", WorkflowID: "wf1", IdempotencyKey: "k"},
			input:   `{"key":"k","value":1,"scope":"agent"}`,
			wantErr: `scope "agent" is unavailable: this invocation has no workflow and agent id; use "session", "workflow" or "global"`,
		},
		{
			name: "unknown scope", tool: "write_memory", dc: full,
			input:   `{"key":"k","value":1,"scope":"planet"}`,
			wantErr: `unknown scope "planet"; use "session", "workflow", "agent" or "global"`,
		},
		{
			name: "session id too long", tool: "write_memory", dc: tool.DeclareContext{SessionID: strings.Repeat("s", 257), IdempotencyKey: "k"},
			input:   `{"key":"k","value":1}`,
			wantErr: `the invocation's scope is unusable: scope session.session_id is 257 characters; the limit is 256: invalid argument`,
		},
		{name: "empty key", tool: "write_memory", dc: full, input: `{"key":"","value":1}`, wantErr: `"key" is empty; give the memory a key such as "user/preferences"`},
		{name: "long key", tool: "delete_memory", dc: full, input: `{"key":"` + strings.Repeat("é", 513) + `"}`, wantErr: `"key" is 1026 bytes; the limit is 1024`},
		{name: "longest key", tool: "delete_memory", dc: full, input: `{"key":"` + strings.Repeat("k", 1024) + `"}`},
		{name: "missing value", tool: "write_memory", dc: full, input: `{"key":"k"}`, wantErr: `missing required property "value": the value to store, any JSON value`},
		{
			name: "inexact integer", tool: "write_memory", dc: full, input: `{"key":"k","value":{"id":[1,9007199254740993]}}`,
			wantErr: `the integer 9007199254740993 at /value/id/1 cannot be stored exactly (numbers are 64-bit floats, exact up to 2^53); send it as a string`,
		},
		{
			name: "number out of range", tool: "signal", dc: full, input: `{"workflow_id":"w","signal_type":"t","data":{"a/b":-1e400}}`,
			wantErr: `the number -1e400 at /data/a~1b is too large to store; send it as a string`,
		},
		{
			name: "too deep", tool: "handoff", dc: full, input: `{"agent_id":"a","state":` + deep + `}`,
			wantErr: fmt.Sprintf("the value at /state%s is nested more than 64 levels deep; flatten it", strings.Repeat("/0", effect.MaxDepth)),
		},
		{name: "deep enough", tool: "handoff", dc: full, input: `{"agent_id":"a","state":` + okDeep + `}`},
		{name: "empty agent", tool: "delegate", dc: full, input: `{"agent_id":"","message":"m"}`, wantErr: `"agent_id" is empty`},
		{name: "long agent", tool: "handoff", dc: full, input: `{"agent_id":"` + strings.Repeat("a", 257) + `"}`, wantErr: `"agent_id" is 257 characters; the limit is 256`},
		{name: "empty message", tool: "delegate", dc: full, input: `{"agent_id":"a","message":""}`, wantErr: `"message" is empty; give the agent its task, or omit "message" and state it in "goal"`},
		{name: "long session", tool: "delegate", dc: full, input: `{"agent_id":"a","message":"m","session_id":"` + strings.Repeat("s", 257) + `"}`, wantErr: `"session_id" is 257 characters; the limit is 256`},
		{name: "empty signal type", tool: "signal", dc: full, input: `{"workflow_id":"w","signal_type":""}`, wantErr: `"signal_type" is empty`},
		{name: "empty workflow", tool: "signal", dc: full, input: `{"workflow_id":"","signal_type":"t"}`, wantErr: `"workflow_id" is empty`},
		{name: "unknown property", tool: "signal", dc: full, input: `{"workflow_id":"w","signal_type":"t","foo":1}`, wantErr: `invalid arguments: json: unknown field "foo"`},
		{name: "wrong type", tool: "delegate", dc: full, input: `{"agent_id":5}`, wantErr: `invalid arguments: json: cannot unmarshal number into Go struct field .agent_id of type string`},
		{name: "malformed", tool: "delegate", dc: full, input: `{"agent_id":`, wantErr: `invalid arguments: unexpected EOF`},
		{
			name: "no idempotency key", tool: "signal", dc: tool.DeclareContext{SessionID: "s"}, input: `{"workflow_id":"w","signal_type":"t"}`,
			wantErr: `tool "signal" got no idempotency key`, kind: errs.Internal,
		},
		{
			name: "idempotency key too long", tool: "signal", dc: tool.DeclareContext{IdempotencyKey: strings.Repeat("k", 513)}, input: `{"workflow_id":"w","signal_type":"t"}`,
			wantErr: `tool "signal" got an idempotency key of 513 characters; the limit is 512`, kind: errs.Internal,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eff, ack, err := byName(t, tt.tool).Declare(tt.dc, json.RawMessage(tt.input))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Declare: %v", err)
				}
				if err := protovalidate.Validate(eff); err != nil {
					t.Errorf("protovalidate: %v", err)
				}
				return
			}
			kind := tt.kind
			if kind == nil {
				kind = errs.InvalidArgument
			}
			if err == nil || err.Error() != tt.wantErr || !errors.Is(err, kind) {
				t.Fatalf("Declare = %v, %q, %v; want error %q wrapping %v", eff, ack, err, tt.wantErr, kind)
			}
			if eff != nil || ack != "" {
				t.Errorf("Declare returned %v, %q with an error", eff, ack)
			}
		})
	}
}

// The registry's schema check catches what the tools would refuse, with a
// message for the model.
func TestSchemas(t *testing.T) {
	r := tool.NewRegistry()
	for _, et := range effect.All() {
		if err := r.RegisterEffect(et); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct{ tool, input, want string }{
		{"write_memory", `{"key":"k","value":1,"scope":"planet"}`, `- at /scope: value must be one of "session", "workflow", "agent", "global"; schema: {"description":"Where the memory lives: \"session\" (this conversation; the default), \"workflow\" (this workflow run), \"agent\" (this agent within this workflow run) or \"global\" (shared by all workflows).","enum":["session","workflow","agent","global"],"type":"string"}`},
		{"write_memory", `{"key":"k"}`, `- at /value: missing required property "value"; schema: {"description":"The value to store. Any JSON value; integers beyond 2^53 must be sent as strings."}`},
		{"delete_memory", `{"key":""}`, `- at /key: minLength: got 0 characters, want at least 1; schema: {"description":"The key, unique within the scope, such as \"user/preferences\" (at most 1024 bytes).","maxLength":1024,"minLength":1,"type":"string"}`},
		{"delegate", `{"agent_id":"a","message":"m","extra":1}`, `- at /extra: property "extra" is not allowed; allowed properties: "agent_id", "goal", "key_facts", "max_cost", "max_turns", "message", "output_format", "output_schema", "session_id", "tools", "workspace_path"`},
		{"handoff", `{}`, `- at /agent_id: missing required property "agent_id"; schema: {"description":"The id of the agent that takes over.","maxLength":256,"minLength":1,"type":"string"}`},
		{"signal", `{"workflow_id":"w","signal_type":7}`, `- at /signal_type: got number, want string; schema: {"description":"The kind of signal, such as \"user_feedback\" or \"approve\".","maxLength":256,"minLength":1,"type":"string"}`},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			_, _, err := r.Declare(full, tt.tool, json.RawMessage(tt.input))
			var ve *tool.ValidationError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), "\n"+tt.want) {
				t.Errorf("Declare error =\n%v\nwant a validation error containing\n%s", err, tt.want)
			}
		})
	}
}

// The effect carries exactly the key the invocation derived, so a
// retried dispatch declares the same effect and the orchestrator runs it
// once.
func TestIdempotencyKey(t *testing.T) {
	in := json.RawMessage(`{"key":"k","value":1}`)
	wm := effect.WriteMemory()
	dc := full
	var effects []*typesv1.Effect
	for _, key := range []string{"dispatch-1/0", "dispatch-1/1", "dispatch-1/0"} {
		dc.IdempotencyKey = key
		eff, _, err := wm.Declare(dc, in)
		if err != nil {
			t.Fatal(err)
		}
		if eff.GetIdempotencyKey() != key {
			t.Errorf("key = %q, want %q", eff.GetIdempotencyKey(), key)
		}
		effects = append(effects, eff)
	}
	if !proto.Equal(effects[0], effects[2]) || proto.Equal(effects[0], effects[1]) {
		t.Errorf("effects %v: the same key must give the same effect, another key another", effects)
	}
}

func TestNumbers(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"0", 0}, {"-0", math.Copysign(0, -1)}, {"9007199254740991", 9007199254740991}, {"-9007199254740993.0", -9007199254740992},
		{"1.7976931348623157e308", math.MaxFloat64}, {"123456789012345678901234567890.5", 123456789012345678901234567890.5},
	}
	for _, tt := range tests {
		eff, _, err := effect.Signal().Declare(full, json.RawMessage(`{"workflow_id":"w","signal_type":"t","data":`+tt.in+`}`))
		if err != nil {
			t.Errorf("%s: %v", tt.in, err)
			continue
		}
		if got := eff.GetSignal().GetPayload().GetData().GetNumberValue(); got != tt.want || math.Signbit(got) != math.Signbit(tt.want) {
			t.Errorf("%s: got %v, want %v", tt.in, got, tt.want)
		}
	}
}
