package operator

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
)

func testErrors(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"InvalidInput", testInvalidInput},
		{"NonRetryable", testNonRetryable},
	})
}

// testInvalidInput: malformed inputs are INVALID_ARGUMENT with a message,
// from Execute and from ExecuteStream, before any model call.
func testInvalidInput(t *testing.T, s *suite) {
	cases := []struct {
		name  string
		input func(t *testing.T) *operatorv1.OperatorInput
	}{
		{"NoInput", func(*testing.T) *operatorv1.OperatorInput { return nil }},
		{"NoMessage", func(t *testing.T) *operatorv1.OperatorInput {
			in := s.input(t, script{turn("x")})
			in.Message = nil
			return in
		}},
		{"MaxTurnsZero", func(t *testing.T) *operatorv1.OperatorInput {
			in := s.input(t, script{turn("x")})
			in.Config = &operatorv1.OperatorConfig{MaxTurns: proto.Uint32(0)}
			return in
		}},
		{"UnknownModel", func(t *testing.T) *operatorv1.OperatorInput {
			in := s.input(t, script{turn("x")})
			in.Config = &operatorv1.OperatorConfig{Model: proto.String("conformance-no-such-model")}
			return in
		}},
		{"UnknownAllowedTool", func(t *testing.T) *operatorv1.OperatorInput {
			in := s.input(t, script{turn("x")})
			in.Config = &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{Names: []string{"conformance_no_such_tool"}}}
			return in
		}},
		{"CustomTriggerUnnamed", func(t *testing.T) *operatorv1.OperatorInput {
			in := s.input(t, script{turn("x")})
			in.Trigger = operatorv1.TriggerType_TRIGGER_TYPE_CUSTOM
			return in
		}},
		{"MalformedScript", func(t *testing.T) *operatorv1.OperatorInput {
			in := s.input(t, script{turn("x")})
			in.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{MetadataKey: structpb.NewStringValue(`{"turns": [`)}}
			return in
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.c.Execute(ctx(t), &operatorv1.ExecuteRequest{Input: c.input(t)})
			wantCode(t, "Execute", err, codes.InvalidArgument)
			_, err = s.stream(ctx(t), c.input(t))
			wantCode(t, "ExecuteStream", err, codes.InvalidArgument)
		})
	}
}

// testNonRetryable: a model reply cut at its output limit cannot be fixed
// by a retry: FAILED_PRECONDITION with the ErrorInfo reason
// OPERATOR_NON_RETRYABLE, which tells the orchestrator not to retry.
func testNonRetryable(t *testing.T, s *suite) {
	in := s.input(t, script{with(turn("Cut off mid"), "stop", "max_tokens")})
	_, err := s.c.Execute(ctx(t), &operatorv1.ExecuteRequest{Input: in})
	wantCode(t, "a reply cut at max_tokens", err, codes.FailedPrecondition)
	wantReason(t, "a reply cut at max_tokens", err, errs.ReasonNonRetryable)
}
