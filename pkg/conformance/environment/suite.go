package environment

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// callTimeout bounds every Run the suite makes.
const callTimeout = time.Minute

// FakeKey is a secret-shaped string (an Anthropic API key's form) the
// suite has the operator answer; it must not come back.
const FakeKey = "sk-ant-api03-CONFORMANCEleak0123456789abcdefghijkl"

// Target is an EnvironmentService under test.
type Target struct {
	// Conn reaches the service (with a credential allowed Run). Required.
	Conn grpc.ClientConnInterface
	// Unsupported are isolation boundaries the deployment cannot enforce,
	// by their field name in IsolationBoundary ("gvisor", "microvm",
	// "wasm", ...). Each must be refused. Empty: none but a custom
	// boundary the suite makes up.
	Unsupported []string
	// EnforcesLimits says the deployment enforces resource limits (the
	// process, docker and kubernetes backends). False: a spec with
	// resource limits must be refused (the local backend).
	EnforcesLimits bool
}

// Run checks target's Run contract.
func Run(t *testing.T, target Target) {
	t.Helper()
	if target.Conn == nil {
		t.Fatal("conformance: Target.Conn is nil")
	}
	c := environmentv1.NewEnvironmentServiceClient(target.Conn)
	t.Run("Output", func(t *testing.T) { testOutput(t, c) })
	t.Run("FailClosed", func(t *testing.T) { testFailClosed(t, c, target.Unsupported) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, c, target.EnforcesLimits) })
	t.Run("Timeout", func(t *testing.T) { testTimeout(t, c) })
	t.Run("Secrets", func(t *testing.T) { testSecrets(t, c) })
	t.Run("Invalid", func(t *testing.T) { testInvalid(t, c) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return c
}

// scripted is an input whose scripted model plays turns.
func scripted(t *testing.T, turns ...map[string]any) *operatorv1.OperatorInput {
	t.Helper()
	ts := make([]any, len(turns))
	for i, tn := range turns {
		ts[i] = tn
	}
	md, err := structpb.NewStruct(map[string]any{"scripted": map[string]any{"turns": ts}})
	if err != nil {
		t.Fatal(err)
	}
	return &operatorv1.OperatorInput{Message: content.Text("conformance check"), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER, Metadata: md}
}

// testOutput: a run with the default spec returns the operator's output,
// the backend's name and the duration.
func testOutput(t *testing.T, c environmentv1.EnvironmentServiceClient) {
	const answer = "The conformance answer."
	res, err := c.Run(ctx(t), &environmentv1.RunRequest{Input: scripted(t, map[string]any{"text": answer}), Spec: &environmentv1.EnvironmentSpec{}})
	if err != nil {
		t.Fatalf("Run with the default spec: %v", err)
	}
	out := res.GetOutput()
	if content.TextOf(out.GetMessage()) != answer || out.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		t.Errorf("output %v, want %q, EXIT_KIND_COMPLETE", out, answer)
	}
	if out.GetMetadata() == nil {
		t.Error("the output has no metadata")
	}
	if res.GetBackend() == "" || res.GetDuration() == nil {
		t.Errorf("backend %q duration %v; want both set", res.GetBackend(), res.GetDuration())
	}
}

// wantPrecondition fails t unless err is FAILED_PRECONDITION naming each
// of names.
func wantPrecondition(t *testing.T, what string, err error, names ...string) {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != codes.FailedPrecondition {
		t.Errorf("%s: %v, want FAILED_PRECONDITION (refused, never silently weakened)", what, err)
		return
	}
	for _, n := range names {
		if !strings.Contains(st.Message(), n) {
			t.Errorf("%s: %q does not name %q", what, st.Message(), n)
		}
	}
}

// testFailClosed: a boundary the host cannot enforce is refused with
// FAILED_PRECONDITION naming it, before anything runs.
func testFailClosed(t *testing.T, c environmentv1.EnvironmentServiceClient, unsupported []string) {
	boundary := func(name string) *environmentv1.IsolationBoundary {
		b := &environmentv1.IsolationBoundary{}
		fd := b.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			t.Fatalf("Target.Unsupported names %q, which is no IsolationBoundary field", name)
		}
		b.ProtoReflect().Set(fd, b.ProtoReflect().NewField(fd))
		return b
	}
	for _, name := range unsupported {
		_, err := c.Run(ctx(t), &environmentv1.RunRequest{Input: scripted(t, map[string]any{"text": "ran"}),
			Spec: &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{boundary(name)}}})
		wantPrecondition(t, "isolation "+name, err, name)
	}
	custom := &environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Custom{Custom: &environmentv1.CustomIsolation{BoundaryType: "conformance-no-such-boundary"}}}
	_, err := c.Run(ctx(t), &environmentv1.RunRequest{Input: scripted(t, map[string]any{"text": "ran"}),
		Spec: &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{custom}}})
	wantPrecondition(t, "a custom boundary nobody implements", err, "conformance-no-such-boundary")
}

// testLimits: resource limits are enforced (an answer over
// max_output_bytes is RESOURCE_EXHAUSTED or an output reporting the
// "output" limit hit) or, by a deployment that cannot enforce them,
// refused with FAILED_PRECONDITION naming them.
func testLimits(t *testing.T, c environmentv1.EnvironmentServiceClient, enforces bool) {
	big := strings.Repeat("conformance output ", 4096) // 76 KiB
	spec := &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{MaxOutputBytes: proto.Uint64(16 << 10)}}
	res, err := c.Run(ctx(t), &environmentv1.RunRequest{Input: scripted(t, map[string]any{"text": big}), Spec: spec})
	if !enforces {
		wantPrecondition(t, "resource limits on a deployment that cannot enforce them", err, "max_output_bytes")
		return
	}
	switch {
	case status.Code(err) == codes.ResourceExhausted:
	case err != nil:
		t.Fatalf("an answer over max_output_bytes: %v, want RESOURCE_EXHAUSTED or an output with limits_hit [output]", err)
	case !containsString(res.GetUsage().GetLimitsHit(), "output") || proto.Size(res.GetOutput()) > 64<<10:
		t.Fatalf("an answer over max_output_bytes came back (%d bytes, limits_hit %v)", proto.Size(res.GetOutput()), res.GetUsage().GetLimitsHit())
	}
}

// testTimeout: a run past spec.timeout ends with DEADLINE_EXCEEDED or an
// output EXIT_KIND_TIMEOUT, well before the caller's own deadline.
func testTimeout(t *testing.T, c environmentv1.EnvironmentServiceClient) {
	spec := &environmentv1.EnvironmentSpec{Timeout: durationpb.New(2 * time.Second)}
	res, err := c.Run(ctx(t), &environmentv1.RunRequest{Input: scripted(t, map[string]any{"text": "late", "delay": "120s"}), Spec: spec})
	switch {
	case status.Code(err) == codes.DeadlineExceeded:
		if status.Convert(err).Message() == "" {
			t.Error("DEADLINE_EXCEEDED without a message")
		}
	case err != nil:
		t.Fatalf("a run past spec.timeout: %v, want DEADLINE_EXCEEDED or an output EXIT_KIND_TIMEOUT", err)
	case res.GetOutput().GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_TIMEOUT:
		t.Fatalf("a run past spec.timeout answered %v, want EXIT_KIND_TIMEOUT", res.GetOutput().GetExitReason())
	}
}

// testSecrets: a credential the deployment does not hold is refused
// (NOT_FOUND, or FAILED_PRECONDITION from a backend that places none),
// and a secret-shaped string the agent answers never comes back in any
// field of the response.
func testSecrets(t *testing.T, c environmentv1.EnvironmentServiceClient) {
	spec := &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{Name: "conformance-no-such-credential",
		Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "CONFORMANCE_TOKEN"}}}}}}
	_, err := c.Run(ctx(t), &environmentv1.RunRequest{Input: scripted(t, map[string]any{"text": "ran"}), Spec: spec})
	if code := status.Code(err); code != codes.NotFound && code != codes.FailedPrecondition {
		t.Errorf("an unknown credential: %v, want NOT_FOUND (or FAILED_PRECONDITION from a backend that places no credentials)", err)
	}
	res, err := c.Run(ctx(t), &environmentv1.RunRequest{Input: scripted(t, map[string]any{"text": "here is the key " + FakeKey}), Spec: &environmentv1.EnvironmentSpec{}})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	raw, _ := proto.Marshal(res)
	if strings.Contains(string(raw), FakeKey) {
		t.Fatalf("the secret-shaped %q came back: %q", FakeKey, content.TextOf(res.GetOutput().GetMessage()))
	}
}

// testInvalid: Run without an input or without a spec is
// INVALID_ARGUMENT.
func testInvalid(t *testing.T, c environmentv1.EnvironmentServiceClient) {
	for what, req := range map[string]*environmentv1.RunRequest{
		"no input": {Spec: &environmentv1.EnvironmentSpec{}},
		"no spec":  {Input: scripted(t, map[string]any{"text": "x"})},
	} {
		_, err := c.Run(ctx(t), req)
		if st := status.Convert(err); err == nil || st.Code() != codes.InvalidArgument || st.Message() == "" {
			t.Errorf("Run with %s: %v, want INVALID_ARGUMENT with a message", what, err)
		}
	}
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
