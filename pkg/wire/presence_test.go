package wire_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
)

// TestPresenceSurvives checks that fields with explicit presence keep it
// through both encodings when set to their zero value, and stay absent
// when unset. The contracts give these zeros meaning: expected_revision 0
// is "the key must not exist", an empty AllowedTools is "no tools",
// whereas unset means "no condition" / "the defaults".
func TestPresenceSurvives(t *testing.T) {
	tests := []struct {
		name    string
		msg     proto.Message
		path    string // dotted field path from msg
		present bool
	}{
		{"max_turns 0", &operatorv1.OperatorConfig{MaxTurns: proto.Uint32(0)}, "max_turns", true},
		{"max_turns unset", &operatorv1.OperatorConfig{}, "max_turns", false},
		{"model empty", &operatorv1.OperatorConfig{Model: proto.String("")}, "model", true},
		{"model unset", &operatorv1.OperatorConfig{}, "model", false},
		{"system_addendum empty", &operatorv1.OperatorConfig{SystemAddendum: proto.String("")}, "system_addendum", true},
		{"allowed_tools empty list", &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{}}, "allowed_tools", true},
		{"allowed_tools unset", &operatorv1.OperatorConfig{}, "allowed_tools", false},
		{
			name:    "allowed_tools empty list nested in input",
			msg:     &operatorv1.OperatorInput{Config: &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{}}},
			path:    "config.allowed_tools",
			present: true,
		},
		{"session_id empty", &operatorv1.OperatorInput{SessionId: proto.String("")}, "session_id", true},
		{"session_id unset", &operatorv1.OperatorInput{}, "session_id", false},
		{"write expected_revision 0", &statev1.WriteRequest{ExpectedRevision: proto.Uint64(0)}, "expected_revision", true},
		{"write expected_revision unset", &statev1.WriteRequest{}, "expected_revision", false},
		{"delete expected_revision 0", &statev1.DeleteRequest{ExpectedRevision: proto.Uint64(0)}, "expected_revision", true},
		{"delete expected_revision unset", &statev1.DeleteRequest{}, "expected_revision", false},
		{"after_sequence 0", &lifecyclev1.SubscribeRequest{AfterSequence: proto.Uint64(0)}, "after_sequence", true},
		{"after_sequence unset", &lifecyclev1.SubscribeRequest{}, "after_sequence", false},
		{"max_processes 0", &environmentv1.ResourceLimits{MaxProcesses: proto.Uint32(0)}, "max_processes", true},
		{"cpu empty", &environmentv1.ResourceLimits{Cpu: proto.String("")}, "cpu", true},
		{"port 0", &environmentv1.NetworkRule{Port: proto.Uint32(0)}, "port", true},
		{"port unset", &environmentv1.NetworkRule{}, "port", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := has(t, tt.msg, tt.path); got != tt.present {
				t.Fatalf("test setup: %s present = %v before encoding", tt.path, got)
			}

			b, err := proto.Marshal(tt.msg)
			if err != nil {
				t.Fatal(err)
			}
			fromBinary := tt.msg.ProtoReflect().Type().New().Interface()
			if err := proto.Unmarshal(b, fromBinary); err != nil {
				t.Fatal(err)
			}
			if got := has(t, fromBinary, tt.path); got != tt.present {
				t.Errorf("binary: %s present = %v, want %v", tt.path, got, tt.present)
			}

			j, err := protojson.Marshal(tt.msg)
			if err != nil {
				t.Fatal(err)
			}
			fromJSON := tt.msg.ProtoReflect().Type().New().Interface()
			if err := protojson.Unmarshal(j, fromJSON); err != nil {
				t.Fatal(err)
			}
			if got := has(t, fromJSON, tt.path); got != tt.present {
				t.Errorf("JSON %s: %s present = %v, want %v", j, tt.path, got, tt.present)
			}
		})
	}
}

// has reports whether the field at the dotted path is present in m. Every
// element but the last must name a singular message field.
func has(t *testing.T, m proto.Message, path string) bool {
	t.Helper()
	rm := m.ProtoReflect()
	names := strings.Split(path, ".")
	for i, name := range names {
		fd := rm.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			t.Fatalf("%s has no field %q", rm.Descriptor().FullName(), name)
		}
		if !rm.Has(fd) {
			return false
		}
		if i == len(names)-1 {
			return true
		}
		rm = rm.Get(fd).Message()
	}
	return false
}
