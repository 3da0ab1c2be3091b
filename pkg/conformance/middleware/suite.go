package middleware

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/middleware/remote"
	"github.com/secbear/neuron/pkg/scope"
)

// Target is a MiddlewareService under test, deployed with the
// conformance policy.
type Target struct {
	// Conn reaches the middleware (with a credential, if it needs one).
	// Required.
	Conn grpc.ClientConnInterface
	// Callers, when set, is run after the checks of the service itself:
	// it puts the reference callers (State, operator, orchestrator) in
	// front of the same middleware and checks what each does with its
	// verdicts. See RunCallers.
	Callers func(t *testing.T) Callers
}

// Run checks target: Describe, the verdicts of the conformance policy at
// each boundary and phase, each answered within the deadline callers
// give a middleware call (remote.DefaultTimeout), INVALID_ARGUMENT for a
// request without a phase; then Target.Callers.
func Run(t *testing.T, target Target) {
	t.Helper()
	if target.Conn == nil {
		t.Fatal("conformance: Target.Conn is nil")
	}
	c := middlewarev1.NewMiddlewareServiceClient(target.Conn)
	t.Run("Describe", func(t *testing.T) { testDescribe(t, c) })
	t.Run("Dispatch", func(t *testing.T) { testCalls(t, c, middlewarev1.Boundary_BOUNDARY_DISPATCH) })
	t.Run("Exec", func(t *testing.T) { testCalls(t, c, middlewarev1.Boundary_BOUNDARY_EXEC) })
	t.Run("Store", func(t *testing.T) { testStore(t, c) })
	t.Run("Invalid", func(t *testing.T) { testInvalid(t, c) })
	if target.Callers != nil {
		t.Run("Callers", func(t *testing.T) { RunCallers(t, target.Callers(t)) })
	}
}

// ctx is the deadline the reference callers give one middleware call.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), remote.DefaultTimeout)
	t.Cleanup(cancel)
	return c
}

// answered fails t when err is not nil, saying so plainly for a call that
// outlived the callers' deadline.
func answered(t *testing.T, what string, err error) {
	t.Helper()
	if status.Code(err) == codes.DeadlineExceeded {
		t.Fatalf("%s: no answer within %v, the deadline the reference callers give a middleware call (then fail-closed callers fail the call UNAVAILABLE)", what, remote.DefaultTimeout)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func testDescribe(t *testing.T, c middlewarev1.MiddlewareServiceClient) {
	res, err := c.Describe(ctx(t), &middlewarev1.DescribeRequest{})
	answered(t, "Describe", err)
	if res.GetName() == "" {
		t.Error("Describe: no name; callers name the middleware in logs and refusals")
	}
	have := map[[2]int32]bool{}
	for _, s := range res.GetSubscriptions() {
		have[[2]int32{int32(s.GetBoundary()), int32(s.GetPhase())}] = true
	}
	for _, b := range []middlewarev1.Boundary{middlewarev1.Boundary_BOUNDARY_DISPATCH, middlewarev1.Boundary_BOUNDARY_STORE, middlewarev1.Boundary_BOUNDARY_EXEC} {
		for _, p := range []middlewarev1.Phase{middlewarev1.Phase_PHASE_BEFORE, middlewarev1.Phase_PHASE_AFTER} {
			if !have[[2]int32{int32(b), int32(p)}] {
				t.Errorf("Describe does not subscribe to %v %v; the conformance policy needs all six", b, p)
			}
		}
	}
}

// call is one dispatch or exec interception: the verdict and
// replacements.
type call struct {
	verdict *middlewarev1.Verdict
	input   *operatorv1.OperatorInput
	output  *operatorv1.OperatorOutput
}

func intercept(t *testing.T, c middlewarev1.MiddlewareServiceClient, b middlewarev1.Boundary, phase middlewarev1.Phase, in *operatorv1.OperatorInput, out *operatorv1.OperatorOutput) call {
	t.Helper()
	if b == middlewarev1.Boundary_BOUNDARY_DISPATCH {
		res, err := c.InterceptDispatch(ctx(t), &middlewarev1.InterceptDispatchRequest{Phase: phase, AgentId: "conformance", Input: in, Output: out})
		answered(t, "InterceptDispatch", err)
		return call{res.GetVerdict(), res.GetInput(), res.GetOutput()}
	}
	res, err := c.InterceptExec(ctx(t), &middlewarev1.InterceptExecRequest{Phase: phase, Input: in, Output: out})
	answered(t, "InterceptExec", err)
	return call{res.GetVerdict(), res.GetInput(), res.GetOutput()}
}

func input(text string) *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{Message: content.Text(text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK,
		Dispatch: &operatorv1.DispatchContext{DispatchId: "conformance-1", WorkflowId: "conformance-wf"}}
}

func output(text string) *operatorv1.OperatorOutput {
	return &operatorv1.OperatorOutput{Message: content.Text(text),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE}}
}

// isContinue: CONTINUE, or unset (which means CONTINUE).
func isContinue(v *middlewarev1.Verdict) bool {
	k := v.GetKind()
	return k == middlewarev1.VerdictKind_VERDICT_KIND_CONTINUE || k == middlewarev1.VerdictKind_VERDICT_KIND_UNSPECIFIED
}

func wantHalt(t *testing.T, what string, v *middlewarev1.Verdict) {
	t.Helper()
	if v.GetKind() != middlewarev1.VerdictKind_VERDICT_KIND_HALT || strings.TrimSpace(v.GetReason()) == "" {
		t.Errorf("%s: verdict %v, want HALT with a reason (callers show it)", what, v)
	}
}

// testCalls checks the dispatch or exec boundary.
func testCalls(t *testing.T, c middlewarev1.MiddlewareServiceClient, b middlewarev1.Boundary) {
	before, after := middlewarev1.Phase_PHASE_BEFORE, middlewarev1.Phase_PHASE_AFTER
	if r := intercept(t, c, b, before, input("please say hello"), nil); !isContinue(r.verdict) {
		t.Errorf("before, an input without a word: verdict %v, want CONTINUE", r.verdict)
	}
	wantHalt(t, "before, an input carrying "+HaltWord, intercept(t, c, b, before, input("do "+HaltWord), nil).verdict)
	r := intercept(t, c, b, before, input("do "+ModifyWord+" now"), nil)
	if r.verdict.GetKind() != middlewarev1.VerdictKind_VERDICT_KIND_MODIFY || content.TextOf(r.input.GetMessage()) != "do "+Modified+" now" {
		t.Errorf("before, an input carrying %s: verdict %v, input %v; want MODIFY with the text %q", ModifyWord, r.verdict, r.input, "do "+Modified+" now")
	} else if r.input.GetDispatch().GetDispatchId() != "conformance-1" || r.input.GetTrigger() != operatorv1.TriggerType_TRIGGER_TYPE_TASK {
		t.Errorf("before, MODIFY: the replacement input lost what it did not change (dispatch, trigger): %v", r.input)
	}
	in := input("a question")
	if r := intercept(t, c, b, after, in, output("a plain answer")); !isContinue(r.verdict) {
		t.Errorf("after, an output without a word: verdict %v, want CONTINUE", r.verdict)
	}
	wantHalt(t, "after, an output carrying "+HaltAfterWord, intercept(t, c, b, after, in, output("this is "+HaltAfterWord)).verdict)
	r = intercept(t, c, b, after, in, output("the "+RedactWord+" part"))
	if r.verdict.GetKind() != middlewarev1.VerdictKind_VERDICT_KIND_MODIFY || content.TextOf(r.output.GetMessage()) != "the "+Redacted+" part" {
		t.Errorf("after, an output carrying %s: verdict %v, output %v; want MODIFY with the text %q", RedactWord, r.verdict, r.output, "the "+Redacted+" part")
	} else if r.output.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		t.Errorf("after, MODIFY: the replacement output lost its exit reason: %v", r.output)
	}
}

func testStore(t *testing.T, c middlewarev1.MiddlewareServiceClient) {
	store := func(phase middlewarev1.Phase, op middlewarev1.StoreOperation, key string, v *structpb.Value) *middlewarev1.InterceptStoreResponse {
		t.Helper()
		res, err := c.InterceptStore(ctx(t), &middlewarev1.InterceptStoreRequest{Phase: phase, Operation: op, Scope: scope.Workflow("conformance-wf"), Key: key, Value: v})
		answered(t, "InterceptStore", err)
		return res
	}
	before, after := middlewarev1.Phase_PHASE_BEFORE, middlewarev1.Phase_PHASE_AFTER
	write, read := middlewarev1.StoreOperation_STORE_OPERATION_WRITE, middlewarev1.StoreOperation_STORE_OPERATION_READ
	if r := store(before, write, "notes", structpb.NewStringValue("plain")); !isContinue(r.GetVerdict()) {
		t.Errorf("a plain write: verdict %v, want CONTINUE", r.GetVerdict())
	}
	for _, op := range []middlewarev1.StoreOperation{write, read, middlewarev1.StoreOperation_STORE_OPERATION_DELETE} {
		wantHalt(t, op.String()+" of a key carrying "+HaltWord, store(before, op, "x/"+HaltWord, structpb.NewStringValue("v")).GetVerdict())
	}
	r := store(before, write, "notes", structpb.NewStringValue("a "+ModifyWord))
	if r.GetVerdict().GetKind() != middlewarev1.VerdictKind_VERDICT_KIND_MODIFY || r.GetValue().GetStringValue() != "a "+Modified {
		t.Errorf("a write of %q: %v, want MODIFY to %q", "a "+ModifyWord, r, "a "+Modified)
	}
	r = store(after, read, "notes", structpb.NewStringValue("a "+RedactWord))
	if r.GetVerdict().GetKind() != middlewarev1.VerdictKind_VERDICT_KIND_MODIFY || r.GetValue().GetStringValue() != "a "+Redacted {
		t.Errorf("a read of %q: %v, want MODIFY to %q", "a "+RedactWord, r, "a "+Redacted)
	}
	wantHalt(t, "a read of a value carrying "+HaltAfterWord, store(after, read, "notes", structpb.NewStringValue(HaltAfterWord)).GetVerdict())
	if r := store(after, read, "notes", structpb.NewStringValue("plain")); !isContinue(r.GetVerdict()) {
		t.Errorf("a plain read: verdict %v, want CONTINUE", r.GetVerdict())
	}
}

// testInvalid: a request without a phase is INVALID_ARGUMENT.
func testInvalid(t *testing.T, c middlewarev1.MiddlewareServiceClient) {
	_, err := c.InterceptDispatch(ctx(t), &middlewarev1.InterceptDispatchRequest{Input: input("x")})
	wantCode(t, "InterceptDispatch without a phase", err)
	_, err = c.InterceptExec(ctx(t), &middlewarev1.InterceptExecRequest{Input: input("x")})
	wantCode(t, "InterceptExec without a phase", err)
	_, err = c.InterceptStore(ctx(t), &middlewarev1.InterceptStoreRequest{Operation: middlewarev1.StoreOperation_STORE_OPERATION_READ, Key: "k"})
	wantCode(t, "InterceptStore without a phase", err)
}

func wantCode(t *testing.T, what string, err error) {
	t.Helper()
	if st := status.Convert(err); err == nil || st.Code() != codes.InvalidArgument || st.Message() == "" {
		t.Errorf("%s: %v, want INVALID_ARGUMENT with a message", what, err)
	}
}
