// Package local is the environment service's development backend: it
// forwards each invocation to a running operator service over gRPC. It
// isolates nothing, so it refuses every spec that asks for isolation,
// credentials, a network policy or resource limits; only the timeout is
// enforced (as the call's deadline).
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// Backend forwards invocations to an operator service.
type Backend struct {
	client operatorv1.OperatorServiceClient
}

// New returns a backend calling client.
func New(client operatorv1.OperatorServiceClient) *Backend { return &Backend{client: client} }

// Name implements environment.Backend.
func (b *Backend) Name() string { return "local" }

// Check implements environment.Backend: anything but a timeout is
// refused, because nothing here could enforce it.
func (b *Backend) Check(spec *environmentv1.EnvironmentSpec) error {
	var asks []string
	if k := environment.Kinds(spec); len(k) > 0 {
		asks = append(asks, "isolation "+strings.Join(k, ", "))
	}
	if len(spec.GetCredentials()) > 0 {
		asks = append(asks, "credentials")
	}
	if spec.GetNetwork() != nil {
		asks = append(asks, "a network policy")
	}
	if r := spec.GetResources(); r != nil {
		var fields []string
		r.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
			fields = append(fields, string(fd.Name()))
			return true
		})
		if len(fields) > 0 {
			asks = append(asks, "resource limits ("+strings.Join(fields, ", ")+")")
		}
	}
	if len(asks) == 0 {
		return nil
	}
	return fmt.Errorf("the local backend runs the operator service without any isolation, so it cannot enforce %s; use the process backend: %w",
		strings.Join(asks, ", "), errs.FailedPrecondition)
}

// Run implements environment.Backend.
func (b *Backend) Run(ctx context.Context, inv *environment.Invocation) (*environment.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, inv.Timeout)
	defer cancel()
	var out *operatorv1.OperatorOutput
	var err error
	if inv.Progress != nil {
		out, err = b.stream(ctx, inv)
	} else {
		var resp *operatorv1.ExecuteResponse
		resp, err = b.client.Execute(ctx, &operatorv1.ExecuteRequest{Input: inv.Input})
		out = resp.GetOutput()
	}
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("the invocation ran past its timeout of %v: %w", inv.Timeout, errs.DeadlineExceeded)
		}
		return nil, errs.FromGRPC(err)
	}
	return &environment.Result{Output: out, Usage: &environmentv1.ResourceUsage{}}, nil
}

// stream runs the invocation with ExecuteStream, passing its progress
// events to inv.Progress, and returns the output.
func (b *Backend) stream(ctx context.Context, inv *environment.Invocation) (*operatorv1.OperatorOutput, error) {
	s, err := b.client.ExecuteStream(ctx, &operatorv1.ExecuteStreamRequest{Input: inv.Input})
	if err != nil {
		return nil, err
	}
	for {
		m, err := s.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("the operator's stream ended without an output: %w", errs.Internal)
			}
			return nil, err
		}
		if out := m.GetOutput(); out != nil {
			return out, nil
		}
		if err := inv.Progress.Send(m); err != nil {
			return nil, err
		}
	}
}
