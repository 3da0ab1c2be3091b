package dispatch

import (
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/middleware/exec"
)

// Input returns the OperatorInput of a dispatch: the request of
// OperatorService.Execute or EnvironmentService.Run, called as method
// (the calls whose server side is the exec boundary: exec.Input). Any
// other call is not a dispatch: false.
func Input(method string, req any) (*operatorv1.OperatorInput, bool) {
	return exec.Input(method, req)
}

// Output returns the OperatorOutput of a dispatch's reply (ExecuteResponse,
// RunResponse; the output may be nil). Any other message is not one:
// false.
func Output(reply any) (*operatorv1.OperatorOutput, bool) { return exec.Output(reply) }

// SetOutput replaces, in place, the output of a dispatch's reply; any
// other message is left alone.
func SetOutput(reply any, out *operatorv1.OperatorOutput) { exec.SetOutput(reply, out) }
