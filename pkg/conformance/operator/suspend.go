package operator

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

func testSuspend(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"Suspended", testSuspended},
		{"Approve", testApprove},
		{"Reject", testReject},
		{"Stream", testSuspendStream},
		{"BadResume", testBadResume},
	})
}

// The key the approval script writes, and its answer after the decision.
const (
	approvalKey    = "conformance/approved"
	approvalAnswer = "Done after the decision."
)

// approvalInput is an invocation whose first turn calls write_memory,
// which its config says always waits for approval.
func (s *suite) approvalInput(t *testing.T) *operatorv1.OperatorInput {
	in := s.input(t, script{
		turn("I will write it once allowed.", writeCall(approvalKey, "yes")),
		turn(approvalAnswer),
	})
	in.Config = &operatorv1.OperatorConfig{ToolApprovals: map[string]operatorv1.ToolApproval{
		"write_memory": operatorv1.ToolApproval_TOOL_APPROVAL_ALWAYS,
	}}
	return in
}

// suspend executes in, which must exit SUSPENDED waiting for the one
// write_memory call, and returns the suspension.
func (s *suite) suspend(t *testing.T, in *operatorv1.OperatorInput) *operatorv1.Suspension {
	t.Helper()
	out := s.execute(t, in)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_SUSPENDED)
	return wantSuspension(t, out)
}

func wantSuspension(t *testing.T, out *operatorv1.OperatorOutput) *operatorv1.Suspension {
	t.Helper()
	sus := out.GetExitReason().GetSuspension()
	if sus.GetResumeToken() == "" {
		t.Fatalf("SUSPENDED without a resume token: %v", out.GetExitReason())
	}
	if len(sus.GetToolCalls()) != 1 {
		t.Fatalf("suspension lists %d tool calls %v, want the one write_memory call", len(sus.GetToolCalls()), sus.GetToolCalls())
	}
	call := sus.GetToolCalls()[0]
	want, _ := structpb.NewValue(map[string]any{"key": approvalKey, "value": "yes", "scope": "workflow"})
	if call.GetToolUseId() == "" || call.GetName() != "write_memory" || call.GetTurn() != 1 || !proto.Equal(call.GetInput(), want) {
		t.Fatalf("pending call %v, want a tool_use_id, name write_memory, turn 1 and the model's input %v", call, want)
	}
	if len(writes(out.GetEffects())[approvalKey]) != 0 {
		t.Fatalf("the suspended output declares the write that waits: %v", out.GetEffects())
	}
	return sus
}

// resumed is in resumed from sus with one decision on its call.
func resumed(in *operatorv1.OperatorInput, sus *operatorv1.Suspension, approved bool) *operatorv1.OperatorInput {
	r := proto.CloneOf(in)
	r.Resume = &operatorv1.Resume{
		ResumeToken: sus.GetResumeToken(),
		ToolDecisions: []*operatorv1.ToolDecision{{
			ToolUseId: sus.GetToolCalls()[0].GetToolUseId(), Approved: approved,
			Reason: "the conformance suite decided", DecidedBy: "conformance",
		}},
	}
	return r
}

// testSuspended: a call that waits for approval suspends the invocation
// before it runs: EXIT_KIND_SUSPENDED, a resume token, the call listed
// with its id, name, input and turn, and no effect of it declared.
func testSuspended(t *testing.T, s *suite) {
	s.suspend(t, s.approvalInput(t))
}

// testApprove: the same input resumed with the call approved runs it
// (its effect declared exactly once) and goes on to complete.
func testApprove(t *testing.T, s *suite) {
	in := s.approvalInput(t)
	sus := s.suspend(t, in)
	out := s.execute(t, resumed(in, sus, true))
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	if got := content.TextOf(out.GetMessage()); got != approvalAnswer {
		t.Errorf("message %q, want %q", got, approvalAnswer)
	}
	w := writes(out.GetEffects())[approvalKey]
	if len(w) != 1 {
		t.Fatalf("effects %v, want the approved write of %q exactly once", out.GetEffects(), approvalKey)
	}
	wantWrite(t, in, w[0], approvalKey, "yes")
}

// testReject: resumed with the call rejected, the call never runs (no
// effect) and the invocation goes on to complete.
func testReject(t *testing.T, s *suite) {
	in := s.approvalInput(t)
	sus := s.suspend(t, in)
	out := s.execute(t, resumed(in, sus, false))
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	if w := writes(out.GetEffects())[approvalKey]; len(w) != 0 {
		t.Fatalf("the rejected write was declared: %v", w)
	}
}

// testSuspendStream: ExecuteStream suspends the same way (the output,
// last, SUSPENDED, and no ToolCallStarted for the waiting call), and a
// resumed stream runs the approved call (started, finished) and ends
// with the completed output.
func testSuspendStream(t *testing.T, s *suite) {
	in := s.approvalInput(t)
	events, err := s.stream(ctx(t), in)
	if err != nil {
		t.Fatalf("ExecuteStream: %v", err)
	}
	out := wantOutputLast(t, events)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_SUSPENDED)
	sus := wantSuspension(t, out)
	id := sus.GetToolCalls()[0].GetToolUseId()
	for _, ev := range events {
		if ev.GetToolCallStarted().GetToolUseId() == id {
			t.Fatalf("the waiting call %q was started: %v", id, ev)
		}
	}
	events, err = s.stream(ctx(t), resumed(in, sus, true))
	if err != nil {
		t.Fatalf("resumed ExecuteStream: %v", err)
	}
	out = wantOutputLast(t, events)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	var startedCall, finishedCall bool
	for _, ev := range events {
		startedCall = startedCall || ev.GetToolCallStarted().GetToolUseId() == id
		finishedCall = finishedCall || (startedCall && ev.GetToolCallFinished().GetToolUseId() == id)
	}
	if !startedCall || !finishedCall {
		t.Fatalf("the resumed stream did not start and finish the approved call %q: %v", id, events)
	}
	if len(writes(out.GetEffects())[approvalKey]) != 1 {
		t.Fatalf("effects %v, want the approved write once", out.GetEffects())
	}
}

// testBadResume: a resume the implementation cannot trust or match is
// INVALID_ARGUMENT: a token with a byte changed, decisions missing the
// pending call, and a decision naming a call that is not pending.
func testBadResume(t *testing.T, s *suite) {
	in := s.approvalInput(t)
	sus := s.suspend(t, in)

	tampered := resumed(in, sus, true)
	tok := []byte(tampered.Resume.ResumeToken)
	i := len(tok) / 2
	if tok[i] == 'A' {
		tok[i] = 'B'
	} else {
		tok[i] = 'A'
	}
	tampered.Resume.ResumeToken = string(tok)
	_, err := s.c.Execute(ctx(t), &operatorv1.ExecuteRequest{Input: tampered})
	wantCode(t, "a resume token with a byte changed", err, codes.InvalidArgument)

	missing := resumed(in, sus, true)
	missing.Resume.ToolDecisions = nil
	_, err = s.c.Execute(ctx(t), &operatorv1.ExecuteRequest{Input: missing})
	wantCode(t, "a resume without a decision on the pending call", err, codes.InvalidArgument)

	unknown := resumed(in, sus, true)
	unknown.Resume.ToolDecisions = append(unknown.Resume.ToolDecisions,
		&operatorv1.ToolDecision{ToolUseId: "conformance-not-pending", Approved: true})
	_, err = s.c.Execute(ctx(t), &operatorv1.ExecuteRequest{Input: unknown})
	wantCode(t, "a resume deciding a call that is not pending", err, codes.InvalidArgument)
}
