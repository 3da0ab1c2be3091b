package exec

import (
	"fmt"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/money"
)

// StreamMethod is the streamed invocation, OperatorService.ExecuteStream:
// a stream interceptor reads its one request before the handler and its
// final output message (the last it sends) after.
const StreamMethod = operatorv1.OperatorService_ExecuteStream_FullMethodName

// Input returns the OperatorInput of a unary invocation: the request of
// OperatorService.Execute or EnvironmentService.Run, called as method.
// Any other call (another method, or a request of another type) is not an
// invocation: false.
func Input(method string, req any) (*operatorv1.OperatorInput, bool) {
	switch r := req.(type) {
	case *operatorv1.ExecuteRequest:
		return r.GetInput(), method == operatorv1.OperatorService_Execute_FullMethodName
	case *environmentv1.RunRequest:
		return r.GetInput(), method == environmentv1.EnvironmentService_Run_FullMethodName
	}
	return nil, false
}

// Output returns the OperatorOutput of a unary invocation's response
// (ExecuteResponse, RunResponse; the output may be nil). Any other
// message is not one: false.
func Output(resp any) (*operatorv1.OperatorOutput, bool) {
	switch r := resp.(type) {
	case *operatorv1.ExecuteResponse:
		return r.GetOutput(), true
	case *environmentv1.RunResponse:
		return r.GetOutput(), true
	}
	return nil, false
}

// SetOutput replaces, in place, the output of a unary invocation's
// response; any other message is left alone.
func SetOutput(resp any, out *operatorv1.OperatorOutput) {
	switch r := resp.(type) {
	case *operatorv1.ExecuteResponse:
		r.Output = out
	case *environmentv1.RunResponse:
		r.Output = out
	}
}

// HaltOutput is the output of an invocation that by (a middleware's
// name) halted: no message, no effects, exit EXIT_KIND_MIDDLEWARE_HALT
// with "halted by middleware <by>: <reason>". spent is the metadata of
// the invocation when it ran (halted after), so that what it consumed is
// still accounted; nil means it never ran (zero cost and duration).
func HaltOutput(by, reason string, spent *operatorv1.OperatorMetadata) *operatorv1.OperatorOutput {
	if spent == nil {
		spent = &operatorv1.OperatorMetadata{Cost: money.FromDecimal(decimal.Zero), Duration: durationpb.New(0)}
	}
	if reason == "" {
		reason = "no reason given"
	}
	return &operatorv1.OperatorOutput{
		Message: &typesv1.Content{},
		ExitReason: &operatorv1.ExitReason{
			Kind:    operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT,
			Message: fmt.Sprintf("halted by middleware %s: %s", by, reason),
		},
		Metadata: spent,
	}
}

// HaltResponse is the response of a unary invocation (req) that was
// halted before it ran, answering out: a RunResponse (zero duration) for
// EnvironmentService.Run, else an ExecuteResponse.
func HaltResponse(req any, out *operatorv1.OperatorOutput) any {
	if _, ok := req.(*environmentv1.RunRequest); ok {
		return &environmentv1.RunResponse{Output: out, Duration: durationpb.New(0)}
	}
	return &operatorv1.ExecuteResponse{Output: out}
}
