package wire_test

import (
	"errors"
	"strings"
	"testing"

	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
)

func newValidator(t *testing.T) protovalidate.Validator {
	t.Helper()
	v, err := protovalidate.New()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestGoldenMessagesAreValid: the hand-built fixtures are realistic,
// fully filled messages, so each must pass its rules.
func TestGoldenMessagesAreValid(t *testing.T) {
	v := newValidator(t)
	for _, tc := range goldenCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			if err := v.Validate(tc.msg); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// TestValidationRules checks that the buf.validate annotations accept
// what they should and reject what they should, and that a rejection
// names the field and rule we expect.
func TestValidationRules(t *testing.T) {
	scope := &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}
	input := func(mod func(*operatorv1.OperatorInput)) *operatorv1.OperatorInput {
		in := &operatorv1.OperatorInput{Message: content.Text("hi")}
		mod(in)
		return in
	}

	tests := []struct {
		name string
		msg  proto.Message
		// For an invalid message: the violation expected, as the field path
		// and the rule id protovalidate reports. Both empty: valid.
		field, rule string
	}{
		// Valid edge cases.
		{name: "money empty is zero", msg: &typesv1.Money{}},
		{name: "money decimal", msg: &typesv1.Money{Amount: "0.0125"}},
		{name: "image data URL", msg: &typesv1.ImageBlock{Source: &typesv1.ImageBlock_Url{Url: "data:image/png;base64,iVBORw0KGgo="}}},
		{name: "scope global has no fields", msg: scope},
		{name: "write expected_revision 0", msg: &statev1.WriteRequest{Scope: scope, Key: "k", Value: structpb.NewNullValue(), ExpectedRevision: proto.Uint64(0)}},
		{name: "hook context point set", msg: &operatorv1.HookContext{Point: operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE}},
		{name: "input minimal", msg: input(func(*operatorv1.OperatorInput) {})},
		{name: "allowed tools empty", msg: input(func(in *operatorv1.OperatorInput) {
			in.Config = &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{}}
		})},
		{name: "env var underscore", msg: &environmentv1.EnvVarInjection{VarName: "_API_KEY2"}},

		// The rules the contracts rely on.
		{name: "effect without kind", msg: &typesv1.Effect{IdempotencyKey: "d/0"}, field: "kind", rule: "required"},
		{name: "effect without idempotency key", msg: &typesv1.Effect{Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{}}}, field: "idempotency_key", rule: "string.min_len"},
		{name: "effect write without scope", msg: &typesv1.Effect{IdempotencyKey: "d/0", Kind: &typesv1.Effect_WriteMemory{
			WriteMemory: &typesv1.WriteMemory{Key: "k", Value: structpb.NewNullValue()},
		}}, field: "write_memory.scope", rule: "required"},
		{name: "effect log level undefined", msg: &typesv1.Effect{IdempotencyKey: "d/0", Kind: &typesv1.Effect_Log{
			Log: &typesv1.LogEffect{Level: 42},
		}}, field: "log.level", rule: "enum.defined_only"},
		{name: "scope with no kind", msg: &typesv1.Scope{}, field: "kind", rule: "required"},
		{name: "session scope empty id", msg: &typesv1.Scope{Kind: &typesv1.Scope_Session{Session: &typesv1.SessionScope{}}}, field: "session.session_id", rule: "string.min_len"},
		{name: "write request empty key", msg: &statev1.WriteRequest{Scope: scope, Value: structpb.NewNullValue()}, field: "key", rule: "string.min_len"},
		{name: "write request without value", msg: &statev1.WriteRequest{Scope: scope, Key: "k"}, field: "value", rule: "required"},
		{name: "list page_size too big", msg: &statev1.ListRequest{Scope: scope, PageSize: 1001}, field: "page_size", rule: "int32.gte_lte"},
		{name: "money exponent", msg: &typesv1.Money{Amount: "1e5"}, field: "amount", rule: "string.pattern"},
		{name: "money negative", msg: &typesv1.Money{Amount: "-1"}, field: "amount", rule: "string.pattern"},
		{name: "money trailing point", msg: &typesv1.Money{Amount: "1."}, field: "amount", rule: "string.pattern"},
		{name: "money nested in config", msg: input(func(in *operatorv1.OperatorInput) {
			in.Config = &operatorv1.OperatorConfig{MaxCost: &typesv1.Money{Amount: "1e5"}}
		}), field: "config.max_cost.amount", rule: "string.pattern"},
		{name: "content block empty", msg: &typesv1.ContentBlock{}, field: "block", rule: "required"},
		{name: "image without source", msg: &typesv1.ImageBlock{MediaType: "image/png"}, field: "source", rule: "required"},
		{name: "image url not a URI", msg: &typesv1.ImageBlock{Source: &typesv1.ImageBlock_Url{Url: "not a url"}}, field: "url", rule: "string.uri"},
		{name: "env var leading digit", msg: &environmentv1.EnvVarInjection{VarName: "1BAD"}, field: "var_name", rule: "string.pattern"},
		{name: "env var empty", msg: &environmentv1.EnvVarInjection{}, field: "var_name", rule: "string.pattern"},
		{name: "file injection relative", msg: &environmentv1.FileInjection{Path: "secrets/key"}, field: "path", rule: "string.pattern"},
		{name: "file injection escapes", msg: &environmentv1.FileInjection{Path: "/run/../etc/passwd"}, field: "path", rule: "string.not_contains"},
		{name: "sidecar without host", msg: &environmentv1.SidecarInjection{}, field: "host", rule: "string.min_len"},
		{name: "image url with file scheme", msg: &typesv1.ImageBlock{Source: &typesv1.ImageBlock_Url{Url: "file:///etc/passwd"}}, field: "url", rule: "string.pattern"},
		{name: "inline image without media type", msg: &typesv1.ImageBlock{Source: &typesv1.ImageBlock_Data{Data: []byte{1}}}, field: "", rule: "image.media_type"},
		{name: "tool use input not an object", msg: &typesv1.ToolUseBlock{Id: "t1", Name: "n", Input: structpb.NewStringValue("x")}, field: "input", rule: "tool_use.input"},
		{name: "tool use input object", msg: &typesv1.ToolUseBlock{Id: "t1", Name: "n", Input: structpb.NewStructValue(&structpb.Struct{})}},
		{name: "custom trigger without name", msg: input(func(in *operatorv1.OperatorInput) {
			in.Trigger = operatorv1.TriggerType_TRIGGER_TYPE_CUSTOM
		}), field: "", rule: "input.custom_trigger"},
		{name: "money too long", msg: &typesv1.Money{Amount: strings.Repeat("9", 65)}, field: "amount", rule: "string.max_len"},
		{name: "subscribe unspecified kind", msg: &lifecyclev1.SubscribeRequest{Kinds: []lifecyclev1.EventKind{0}}, field: "kinds[0]", rule: "enum.not_in"},
		{name: "credential without injection", msg: &environmentv1.CredentialRef{Name: "k"}, field: "injection", rule: "required"},
		{name: "isolation boundary empty", msg: &environmentv1.IsolationBoundary{}, field: "kind", rule: "required"},
		{name: "network rule port 0", msg: &environmentv1.NetworkRule{Destination: "example.com", Port: proto.Uint32(0)}, field: "port", rule: "uint32.gte_lte"},
		{name: "spec timeout zero", msg: &environmentv1.EnvironmentSpec{Timeout: durationpb.New(0)}, field: "timeout", rule: "duration.gt"},
		{name: "hook point unspecified", msg: &operatorv1.HookContext{}, field: "point", rule: "enum.not_in"},
		{name: "hook point undefined", msg: &operatorv1.HookContext{Point: 99}, field: "point", rule: "enum.defined_only"},
		{name: "input without message", msg: &operatorv1.OperatorInput{}, field: "message", rule: "required"},
		{name: "input session_id present but empty", msg: input(func(in *operatorv1.OperatorInput) {
			in.SessionId = proto.String("")
		}), field: "session_id", rule: "string.min_len"},
		{name: "config max_turns 0", msg: &operatorv1.OperatorConfig{MaxTurns: proto.Uint32(0)}, field: "max_turns", rule: "uint32.gte"},
		{name: "config model present but empty", msg: &operatorv1.OperatorConfig{Model: proto.String("")}, field: "model", rule: "string.min_len"},
		{name: "config max_duration zero", msg: &operatorv1.OperatorConfig{MaxDuration: durationpb.New(0)}, field: "max_duration", rule: "duration.gt"},
		{name: "lifecycle event without event", msg: &lifecyclev1.LifecycleEvent{}, field: "event", rule: "required"},
		{name: "budget event empty", msg: &lifecyclev1.LifecycleEvent{Event: &lifecyclev1.LifecycleEvent_Budget{
			Budget: &lifecyclev1.BudgetEvent{},
		}}, field: "budget.kind", rule: "required"},
		{name: "subscribe kind undefined", msg: &lifecyclev1.SubscribeRequest{Kinds: []lifecyclev1.EventKind{99}}, field: "kinds[0]", rule: "enum.defined_only"},
		{name: "intercept store phase unspecified", msg: &middlewarev1.InterceptStoreRequest{}, field: "phase", rule: "enum.not_in"},
		{name: "dispatch many empty", msg: &orchestratorv1.DispatchManyRequest{}, field: "tasks", rule: "repeated.min_items"},
		{name: "signal workflow id too long", msg: &orchestratorv1.SignalRequest{
			WorkflowId: strings.Repeat("w", 257),
			Signal:     &typesv1.SignalPayload{SignalType: "approve"},
		}, field: "workflow_id", rule: "string.max_len"},
	}

	v := newValidator(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := v.Validate(tt.msg)
			if tt.rule == "" {
				if err != nil {
					t.Errorf("Validate(%v): %v, want valid", tt.msg, err)
				}
				return
			}
			var verr *protovalidate.ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Validate(%v) = %v, want a validation error", tt.msg, err)
			}
			var got []string
			for _, viol := range verr.Violations {
				field := protovalidate.FieldPathString(viol.Proto.GetField())
				rule := viol.Proto.GetRuleId()
				if field == tt.field && rule == tt.rule {
					return
				}
				got = append(got, field+" ["+rule+"]")
			}
			t.Errorf("want violation %s [%s], got %s", tt.field, tt.rule, strings.Join(got, "; "))
		})
	}
}
