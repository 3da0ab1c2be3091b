package grpcserver

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"buf.build/go/protovalidate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// bigValue is a conversation-entry-like value with n messages.
func bigValue(t *testing.T, n int) *structpb.Value {
	t.Helper()
	msgs := make([]any, n)
	for i := range msgs {
		msgs[i] = map[string]any{"role": "user", "content": map[string]any{"blocks": []any{map[string]any{"text": map[string]any{"text": fmt.Sprint("turn ", i)}}}}}
	}
	v, err := structpb.NewValue(map[string]any{"version": 1, "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The rules on a field that holds a google.protobuf.Value still apply
// with the value trees skipped: required on WriteRequest.value, the CEL
// rule on ToolUseBlock.input; and rules of messages outside those trees.
func TestValidationOfValueFieldsKept(t *testing.T) {
	v := valueTreesSkipped{protovalidate.GlobalValidator}
	global := &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}
	tests := []struct {
		name string
		msg  proto.Message
		want string // "" for valid
	}{
		{"write with a value", &statev1.WriteRequest{Scope: global, Key: "k", Value: bigValue(t, 3)}, ""},
		{"write without a value", &statev1.WriteRequest{Scope: global, Key: "k"}, "value"},
		{"write with an empty key", &statev1.WriteRequest{Scope: global, Value: bigValue(t, 1)}, "key"},
		{"tool input an object", &typesv1.ToolUseBlock{Id: "1", Name: "read", Input: structpb.NewStructValue(&structpb.Struct{})}, ""},
		{"tool input a string", &typesv1.ToolUseBlock{Id: "1", Name: "read", Input: structpb.NewStringValue("x")}, "input must be a JSON object"},
		{"tool without a name", &typesv1.ToolUseBlock{Id: "1", Input: structpb.NewStructValue(&structpb.Struct{})}, "name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := v.Validate(tt.msg)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("valid message refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// countingFilter counts what protovalidate asks of skipValueTrees.
type countingFilter struct{ n int }

func (c *countingFilter) ShouldValidate(m protoreflect.Message, d protoreflect.Descriptor) bool {
	c.n++
	return skipValueTrees(m, d)
}

// Validating a Write costs the same whatever the size of its value:
// protovalidate does not walk the entries of the Struct (each entry it
// walked would ask the filter).
func TestValidationSkipsValueTrees(t *testing.T) {
	global := &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}
	asks := func(n int) int {
		f := &countingFilter{}
		req := &statev1.WriteRequest{Scope: global, Key: "k", Value: bigValue(t, n)}
		if err := protovalidate.GlobalValidator.Validate(req, protovalidate.WithFilter(f)); err != nil {
			t.Fatal(err)
		}
		return f.n
	}
	small, big := asks(1), asks(200)
	if small != big {
		t.Fatalf("the filter was asked %d times for a value of 1 message and %d for 200: the value's tree was walked", small, big)
	}
}

// Through the server's chain, a Write with a large value is accepted and
// one without is refused, INVALID_ARGUMENT.
func TestChainValidatesWrites(t *testing.T) {
	h := start(t, Config{Dev: true}, &fakeState{})
	c := statev1.NewStateServiceClient(h.conn)
	global := &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}
	if _, err := c.Write(context.Background(), &statev1.WriteRequest{Scope: global, Key: "k", Value: bigValue(t, 50)}); err != nil {
		t.Fatalf("write: %v", err)
	}
	_, err := c.Write(context.Background(), &statev1.WriteRequest{Scope: global, Key: "k"})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "value") {
		t.Fatalf("got %v %q, want INVALID_ARGUMENT naming value", st.Code(), st.Message())
	}
}

// BenchmarkValidateWrite is the chain's validation of a State Write whose
// value is a conversation entry of 8 messages: skipped=false is
// protovalidate's own walk.
func BenchmarkValidateWrite(b *testing.B) {
	global := &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}
	msgs := make([]any, 8)
	for i := range msgs {
		msgs[i] = map[string]any{"role": "user", "content": map[string]any{"blocks": []any{map[string]any{"text": map[string]any{"text": fmt.Sprint("turn ", i)}}}}}
	}
	val, err := structpb.NewValue(map[string]any{"version": 1, "messages": msgs})
	if err != nil {
		b.Fatal(err)
	}
	req := &statev1.WriteRequest{Scope: global, Key: "conversation/1", Value: val, IdempotencyKey: "d-1/history", Unindexed: true}
	for _, v := range []struct {
		name string
		v    protovalidate.Validator
	}{{"skipped=true", valueTreesSkipped{protovalidate.GlobalValidator}}, {"skipped=false", protovalidate.GlobalValidator}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := v.v.Validate(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
