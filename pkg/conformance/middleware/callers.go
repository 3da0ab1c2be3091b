package middleware

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/scope"
)

// Callers are the reference callers of one boundary each, all in front
// of the middleware under test. A nil one is skipped.
type Callers struct {
	// Operator is an OperatorService whose exec boundary consults the
	// middleware, with a model that answers "You said: <the message>"
	// (the scripted model's echo).
	Operator grpc.ClientConnInterface
	// State is a StateService whose store boundary consults the
	// middleware.
	State grpc.ClientConnInterface
	// Orchestrator is an OrchestratorService whose dispatch boundary
	// consults the middleware, and Agent an agent of its registry on an
	// operator that echoes like Operator (and consults no middleware).
	Orchestrator grpc.ClientConnInterface
	Agent        string
}

// RunCallers checks what the reference callers do with each verdict:
//
//   - exec (operator): HALT before ends the invocation with an output
//     EXIT_KIND_MIDDLEWARE_HALT naming the reason, MODIFY before runs the
//     replacement input, MODIFY after answers the replacement output,
//     HALT after replaces the output with a MIDDLEWARE_HALT one;
//   - store (State): HALT before fails the call PERMISSION_DENIED naming
//     the reason, MODIFY before stores the replacement, MODIFY after a
//     read returns the replacement, HALT after a read withholds it
//     (PERMISSION_DENIED);
//   - dispatch (orchestrator): HALT before or after fails the Dispatch
//     PERMISSION_DENIED naming the reason, MODIFY before dispatches the
//     replacement input, MODIFY after returns the replacement output.
func RunCallers(t *testing.T, c Callers) {
	if c.Operator != nil {
		t.Run("Exec", func(t *testing.T) { testExecCaller(t, operatorv1.NewOperatorServiceClient(c.Operator)) })
	}
	if c.State != nil {
		t.Run("Store", func(t *testing.T) { testStoreCaller(t, statev1.NewStateServiceClient(c.State)) })
	}
	if c.Orchestrator != nil {
		t.Run("Dispatch", func(t *testing.T) {
			testDispatchCaller(t, orchestratorv1.NewOrchestratorServiceClient(c.Orchestrator), c.Agent)
		})
	}
}

func callCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func wantDenied(t *testing.T, what string, err error) {
	t.Helper()
	if st := status.Convert(err); err == nil || st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), HaltReason) {
		t.Errorf("%s: %v, want PERMISSION_DENIED naming the reason %q", what, err, HaltReason)
	}
}

func testExecCaller(t *testing.T, op operatorv1.OperatorServiceClient) {
	exec := func(text string) *operatorv1.OperatorOutput {
		t.Helper()
		res, err := op.Execute(callCtx(t), &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{
			Message: content.Text(text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}})
		if err != nil {
			t.Fatalf("Execute(%q): %v", text, err)
		}
		return res.GetOutput()
	}
	for _, text := range []string{"do " + HaltWord, "say " + HaltAfterWord} {
		out := exec(text)
		if out.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT || !strings.Contains(out.GetExitReason().GetMessage(), HaltReason) {
			t.Errorf("Execute(%q): exit %v, want EXIT_KIND_MIDDLEWARE_HALT naming %q", text, out.GetExitReason(), HaltReason)
		}
		if strings.Contains(content.TextOf(out.GetMessage()), HaltAfterWord) {
			t.Errorf("Execute(%q): the halted output still carries the answer: %q", text, content.TextOf(out.GetMessage()))
		}
	}
	if got := content.TextOf(exec("say " + ModifyWord).GetMessage()); !strings.Contains(got, Modified) || strings.Contains(got, ModifyWord) {
		t.Errorf("MODIFY before: the model answered %q; want it to have seen the replacement input (%q)", got, Modified)
	}
	if got := content.TextOf(exec("say " + RedactWord).GetMessage()); !strings.Contains(got, Redacted) || strings.Contains(got, RedactWord) {
		t.Errorf("MODIFY after: the output is %q; want the replacement (%q)", got, Redacted)
	}
}

func testStoreCaller(t *testing.T, st statev1.StateServiceClient) {
	sc := scope.Workflow("conformance-middleware-" + time.Now().Format("150405.000000000"))
	write := func(key, value string) error {
		_, err := st.Write(callCtx(t), &statev1.WriteRequest{Scope: sc, Key: key, Value: structpb.NewStringValue(value)})
		return err
	}
	wantDenied(t, "Write of a key carrying "+HaltWord, write("k/"+HaltWord, "v"))
	if _, err := st.Read(callCtx(t), &statev1.ReadRequest{Scope: sc, Key: "k/" + HaltWord}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Read of a key carrying %s: %v, want PERMISSION_DENIED", HaltWord, err)
	}
	for key, c := range map[string]struct{ write, read string }{
		"modified": {"a " + ModifyWord, "a " + Modified},
		"redacted": {"a " + RedactWord, "a " + Redacted},
		"plain":    {"plain", "plain"},
	} {
		if err := write(key, c.write); err != nil {
			t.Fatalf("Write %q: %v", c.write, err)
		}
		res, err := st.Read(callCtx(t), &statev1.ReadRequest{Scope: sc, Key: key})
		if err != nil {
			t.Fatalf("Read %q: %v", key, err)
		}
		if got := res.GetValue().GetStringValue(); got != c.read {
			t.Errorf("wrote %q, read %q; want %q", c.write, got, c.read)
		}
	}
	if err := write("withheld", HaltAfterWord); err != nil {
		t.Fatalf("Write %q: %v", HaltAfterWord, err)
	}
	_, err := st.Read(callCtx(t), &statev1.ReadRequest{Scope: sc, Key: "withheld"})
	wantDenied(t, "Read of a value carrying "+HaltAfterWord, err)
}

func testDispatchCaller(t *testing.T, oc orchestratorv1.OrchestratorServiceClient, agent string) {
	n := 0
	dispatch := func(text string) (*orchestratorv1.DispatchResponse, error) {
		n++
		return oc.Dispatch(callCtx(t), &orchestratorv1.DispatchRequest{AgentId: agent,
			WorkflowId: "conformance-middleware-" + time.Now().Format("150405.000000000") + "-" + string(rune('a'+n)),
			Input:      &operatorv1.OperatorInput{Message: content.Text(text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}})
	}
	_, err := dispatch("do " + HaltWord)
	wantDenied(t, "Dispatch of an input carrying "+HaltWord, err)
	_, err = dispatch("say " + HaltAfterWord)
	wantDenied(t, "Dispatch whose output carries "+HaltAfterWord, err)
	res, err := dispatch("say " + ModifyWord)
	if err != nil {
		t.Fatalf("Dispatch MODIFY before: %v", err)
	}
	if got := content.TextOf(res.GetOutput().GetMessage()); !strings.Contains(got, Modified) || strings.Contains(got, ModifyWord) {
		t.Errorf("MODIFY before: the agent answered %q; want it to have seen the replacement input (%q)", got, Modified)
	}
	res, err = dispatch("say " + RedactWord)
	if err != nil {
		t.Fatalf("Dispatch MODIFY after: %v", err)
	}
	if got := content.TextOf(res.GetOutput().GetMessage()); !strings.Contains(got, Redacted) || strings.Contains(got, RedactWord) {
		t.Errorf("MODIFY after: the output is %q; want the replacement (%q)", got, Redacted)
	}
}
