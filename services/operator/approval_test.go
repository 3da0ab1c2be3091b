package operator_test

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/hook"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
)

const (
	always         = operatorv1.ToolApproval_TOOL_APPROVAL_ALWAYS
	never          = operatorv1.ToolApproval_TOOL_APPROVAL_NEVER
	unlessReadOnly = operatorv1.ToolApproval_TOOL_APPROVAL_UNLESS_READ_ONLY
	suspended      = operatorv1.ExitKind_EXIT_KIND_SUSPENDED
)

// recorder is a tool that records the inputs it ran with.
type recorder struct {
	mu  sync.Mutex
	ran []string
}

func (r *recorder) tool(name string, tier tool.Tier, schema string) funcTool {
	return newTool(name, tier, schema, func(_ context.Context, in json.RawMessage) (string, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.ran = append(r.ran, name+" "+string(in))
		return name + " done", nil
	})
}

func (r *recorder) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ran...)
}

const textSchema = `{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`

// approvalTools are a read-only "look" and a side-effecting "write",
// both recording their calls in rec.
func approvalTools(rec *recorder) []tool.Tool {
	return tools(rec.tool("look", tool.ReadOnly, objectSchema), rec.tool("write", tool.SideEffecting, textSchema))
}

func withApprovals(in *operatorv1.OperatorInput, m map[string]operatorv1.ToolApproval) *operatorv1.OperatorInput {
	if in.Config == nil {
		in.Config = &operatorv1.OperatorConfig{}
	}
	in.Config.ToolApprovals = m
	return in
}

// resumeInput continues out (which must be SUSPENDED) with decisions.
func resumeInput(out *operatorv1.OperatorOutput, config *operatorv1.OperatorConfig, ds ...*operatorv1.ToolDecision) *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{
		Message: content.Text("(resumed)"), Config: config,
		Resume: &operatorv1.Resume{ResumeToken: out.GetExitReason().GetSuspension().GetResumeToken(), ToolDecisions: ds},
	}
}

func approve(id string) *operatorv1.ToolDecision {
	return &operatorv1.ToolDecision{ToolUseId: id, Approved: true, DecidedBy: "alice"}
}

func reject(id, reason string) *operatorv1.ToolDecision {
	return &operatorv1.ToolDecision{ToolUseId: id, Reason: reason, DecidedBy: "alice"}
}

// pendingIDs lists a suspension's waiting calls as "name id reason".
func pendingIDs(t *testing.T, out *operatorv1.OperatorOutput) []string {
	t.Helper()
	wantExit(t, out, suspended)
	s := out.GetExitReason().GetSuspension()
	if s.GetResumeToken() == "" || s.GetPrompt() == "" {
		t.Fatalf("suspension without token or prompt: %v", s)
	}
	var got []string
	for _, c := range s.GetToolCalls() {
		got = append(got, c.GetName()+" "+c.GetToolUseId()+" "+c.GetReason())
	}
	return got
}

func sameList(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

// lastResults are the tool results of the newest tool-result message the
// model was shown in its latest request.
func lastResults(t *testing.T, m *fakeModel) []provider.ToolResult {
	t.Helper()
	reqs := m.requests()
	msgs := reqs[len(reqs)-1].Messages
	for i := len(msgs) - 1; i >= 0; i-- {
		var out []provider.ToolResult
		for _, p := range msgs[i].Parts {
			if p.ToolResult != nil {
				out = append(out, *p.ToolResult)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	t.Fatal("the model was shown no tool results")
	return nil
}

// TestApprovalPolicy: ALWAYS, UNLESS_READ_ONLY and "*" make calls wait;
// when any call of a turn waits none of the turn runs, and the
// suspension lists only the waiting calls, in the model's order.
func TestApprovalPolicy(t *testing.T) {
	for _, tt := range []struct {
		name      string
		approvals map[string]operatorv1.ToolApproval
		calls     []string
		wantWait  []string // empty: completes, running every call
	}{
		{"always", map[string]operatorv1.ToolApproval{"write": always},
			[]string{"look", `{}`, "write", `{"text":"a"}`}, []string{"write call_1_1 policy"}},
		{"never", map[string]operatorv1.ToolApproval{"write": never},
			[]string{"write", `{"text":"a"}`}, nil},
		{"unless read-only lets a read run", map[string]operatorv1.ToolApproval{"look": unlessReadOnly, "write": unlessReadOnly},
			[]string{"look", `{}`}, nil},
		{"unless read-only stops a write", map[string]operatorv1.ToolApproval{"*": unlessReadOnly},
			[]string{"write", `{"text":"a"}`, "look", `{}`, "write", `{"text":"b"}`}, []string{"write call_1_0 policy", "write call_1_2 policy"}},
		{"star", map[string]operatorv1.ToolApproval{"*": always},
			[]string{"look", `{}`}, []string{"look call_1_0 policy"}},
		{"a named tool overrides star", map[string]operatorv1.ToolApproval{"*": always, "look": never},
			[]string{"look", `{}`, "write", `{"text":"a"}`}, []string{"write call_1_1 policy"}},
		{"an unset policy", nil, []string{"write", `{"text":"a"}`}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			m := &fakeModel{steps: []step{callTools("0.01", tt.calls...), say("done", "0")}}
			c := serve(t, operator.Config{ExtraTools: approvalTools(rec)}, m)
			out := execute(t, c, withApprovals(input("go"), tt.approvals))
			if tt.wantWait == nil {
				wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
				if len(rec.calls()) != len(tt.calls)/2 {
					t.Fatalf("ran %q", rec.calls())
				}
				return
			}
			sameList(t, "waiting calls", pendingIDs(t, out), tt.wantWait)
			if ran := rec.calls(); len(ran) != 0 {
				t.Fatalf("a turn with a waiting call ran %q", ran)
			}
			if len(m.requests()) != 1 {
				t.Fatalf("model called %d times", len(m.requests()))
			}
			md := out.GetMetadata()
			if md.GetTurnsUsed() != 1 || md.GetCost().GetAmount() != "0.01" || md.GetTokensIn() != 10 {
				t.Fatalf("metadata %v", md)
			}
			for _, pc := range out.GetExitReason().GetSuspension().GetToolCalls() {
				if pc.GetTurn() != 1 || pc.GetInput().GetStructValue() == nil {
					t.Fatalf("pending call %v", pc)
				}
			}
		})
	}
}

// TestApprovalResume: approving runs the call (and the turn's other
// calls, in order); rejecting tells the model, with the reason; an edit
// replaces the input; an invalid edit is an error result, not a failed
// invocation.
func TestApprovalResume(t *testing.T) {
	cfg := &operatorv1.OperatorConfig{ToolApprovals: map[string]operatorv1.ToolApproval{"write": always}}
	start := func(t *testing.T) (*recorder, *fakeModel, operatorv1.OperatorServiceClient, *operatorv1.OperatorOutput) {
		rec := &recorder{}
		m := &fakeModel{steps: []step{callTools("0.01", "look", `{"q":1}`, "write", `{"text":"model's"}`), say("finished", "0.02")}}
		c := serve(t, operator.Config{ExtraTools: approvalTools(rec)}, m)
		in := input("go")
		in.Config = proto.CloneOf(cfg)
		out := execute(t, c, in)
		sameList(t, "waiting", pendingIDs(t, out), []string{"write call_1_1 policy"})
		return rec, m, c, out
	}
	t.Run("approve", func(t *testing.T) {
		rec, m, c, out := start(t)
		res := execute(t, c, resumeInput(out, cfg, approve("call_1_1")))
		wantExit(t, res, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
		sameList(t, "ran", rec.calls(), []string{`look {"q":1}`, `write {"text":"model's"}`})
		got := lastResults(t, m)
		if len(got) != 2 || got[0].ToolUseID != "call_1_0" || got[1].ToolUseID != "call_1_1" || got[1].Content != "write done" || got[1].IsError {
			t.Fatalf("model shown %+v", got)
		}
		// The model sees the whole conversation again: the task, its own
		// tool calls, the results.
		msgs := m.requests()[1].Messages
		if len(msgs) != 3 || msgs[0].Parts[0].Text != "go" || msgs[1].Parts[1].ToolUse.ID != "call_1_1" {
			t.Fatalf("resumed conversation %+v", msgs)
		}
		// The resumed output counts only what it consumed itself.
		md := res.GetMetadata()
		if md.GetTurnsUsed() != 1 || md.GetCost().GetAmount() != "0.02" || len(md.GetSubDispatches()) != 2 {
			t.Fatalf("metadata %v", md)
		}
	})
	t.Run("reject", func(t *testing.T) {
		rec, m, c, out := start(t)
		res := execute(t, c, resumeInput(out, cfg, reject("call_1_1", "not on a Friday")))
		wantExit(t, res, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
		sameList(t, "ran", rec.calls(), []string{`look {"q":1}`})
		got := lastResults(t, m)
		if len(got) != 2 || !got[1].IsError || !strings.Contains(got[1].Content, "not on a Friday") || !strings.Contains(got[1].Content, "alice") ||
			!strings.Contains(got[1].Content, "Rejected") {
			t.Fatalf("model shown %+v", got)
		}
		recs := res.GetMetadata().GetSubDispatches()
		if len(recs) != 2 || recs[1].GetSuccess() || !strings.HasPrefix(recs[1].GetError(), "rejected by alice: not on a Friday") {
			t.Fatalf("records %v", recs)
		}
	})
	t.Run("edit", func(t *testing.T) {
		rec, _, c, out := start(t)
		d := approve("call_1_1")
		d.EditedInput, _ = structpb.NewValue(map[string]any{"text": "person's"})
		wantExit(t, execute(t, c, resumeInput(out, cfg, d)), operatorv1.ExitKind_EXIT_KIND_COMPLETE)
		sameList(t, "ran", rec.calls(), []string{`look {"q":1}`, `write {"text":"person's"}`})
	})
	t.Run("invalid edit", func(t *testing.T) {
		rec, m, c, out := start(t)
		d := approve("call_1_1")
		d.EditedInput, _ = structpb.NewValue(map[string]any{"txt": 7})
		wantExit(t, execute(t, c, resumeInput(out, cfg, d)), operatorv1.ExitKind_EXIT_KIND_COMPLETE)
		sameList(t, "ran", rec.calls(), []string{`look {"q":1}`})
		got := lastResults(t, m)
		if !got[1].IsError || !strings.Contains(got[1].Content, "edited arguments") || !strings.Contains(got[1].Content, "/text") {
			t.Fatalf("model shown %+v", got[1])
		}
	})
}

// TestApprovalResumeStream: a resumed invocation streams the calls it
// runs; a rejected call is a finished event with is_error.
func TestApprovalResumeStream(t *testing.T) {
	rec := &recorder{}
	cfg := &operatorv1.OperatorConfig{ToolApprovals: map[string]operatorv1.ToolApproval{"*": always}}
	m := &fakeModel{steps: []step{callTools("0", "write", `{"text":"a"}`, "write", `{"text":"b"}`), say("ok", "0")}}
	c := serve(t, operator.Config{ExtraTools: approvalTools(rec)}, m)
	in := input("go")
	in.Config = cfg
	out := execute(t, c, in)
	sameList(t, "waiting", pendingIDs(t, out), []string{"write call_1_0 policy", "write call_1_1 policy"})

	st, err := c.ExecuteStream(ctxT(t), &operatorv1.ExecuteStreamRequest{Input: resumeInput(out, cfg, approve("call_1_0"), reject("call_1_1", "twice is too many"))})
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for {
		ev, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch e := ev.GetEvent().(type) {
		case *operatorv1.ExecuteStreamResponse_ToolCallStarted:
			events = append(events, "started "+e.ToolCallStarted.GetToolUseId())
		case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
			f := e.ToolCallFinished
			s := "finished " + f.GetToolUseId()
			if f.GetIsError() {
				s += " error: " + f.GetResult()
			}
			if f.GetTurn() != 1 {
				t.Errorf("turn %d", f.GetTurn())
			}
			events = append(events, s)
		case *operatorv1.ExecuteStreamResponse_Output:
			wantExit(t, e.Output, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
		}
	}
	if len(events) != 3 || events[0] != "started call_1_0" || events[1] != "finished call_1_0" ||
		!strings.HasPrefix(events[2], "finished call_1_1 error: Rejected") || !strings.Contains(events[2], "twice is too many") {
		t.Fatalf("events %q", events)
	}
	sameList(t, "ran", rec.calls(), []string{`write {"text":"a"}`})
}

// TestApprovalHook: a PRE_TOOL_USE hook answering REQUIRE_APPROVAL makes
// the call wait, with the hook's reason; once approved it runs although
// the hook asks again.
func TestApprovalHook(t *testing.T) {
	rec := &recorder{}
	var asked sync.Map
	guard := hook.Func{HookName: "prod-guard", At: []operatorv1.HookPoint{operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE},
		Fn: func(_ context.Context, hc *operatorv1.HookContext) (*operatorv1.HookAction, error) {
			n, _ := asked.LoadOrStore(hc.GetToolUseId(), new(int))
			*n.(*int)++
			if hc.GetToolName() == "write" {
				return hook.RequireApproval("writes touch production"), nil
			}
			return hook.Continue(), nil
		}}
	m := &fakeModel{steps: []step{callTools("0", "look", `{}`, "write", `{"text":"a"}`), say("ok", "0")}}
	c := serve(t, operator.Config{ExtraTools: approvalTools(rec), LocalHooks: []hook.Hook{guard}}, m)
	out := execute(t, c, input("go"))
	sameList(t, "waiting", pendingIDs(t, out), []string{"write call_1_1 writes touch production"})
	if ran := rec.calls(); len(ran) != 0 {
		t.Fatalf("ran %q before approval", ran)
	}
	res := execute(t, c, resumeInput(out, nil, approve("call_1_1")))
	wantExit(t, res, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	sameList(t, "ran", rec.calls(), []string{`look {}`, `write {"text":"a"}`})
	if n, _ := asked.Load("call_1_1"); *n.(*int) != 2 {
		t.Fatalf("hook asked %d times about the write, want 2 (before and after approval)", *n.(*int))
	}
}

// TestApprovalDecisionsChecked: every waiting call needs exactly one
// decision; anything else is INVALID_ARGUMENT naming the call.
func TestApprovalDecisionsChecked(t *testing.T) {
	rec := &recorder{}
	cfg := &operatorv1.OperatorConfig{ToolApprovals: map[string]operatorv1.ToolApproval{"write": always}}
	m := &fakeModel{steps: []step{callTools("0", "write", `{"text":"a"}`, "write", `{"text":"b"}`), say("ok", "0")}}
	c := serve(t, operator.Config{ExtraTools: approvalTools(rec)}, m)
	in := input("go")
	in.Config = cfg
	out := execute(t, c, in)
	edited := approve("call_1_0")
	edited.Approved = false
	edited.EditedInput = structpb.NewStringValue("x")
	for _, tt := range []struct {
		name string
		ds   []*operatorv1.ToolDecision
		want string
	}{
		{"missing", []*operatorv1.ToolDecision{approve("call_1_0")}, `no decision for tool call "call_1_1"`},
		{"none", nil, `"call_1_0", "call_1_1"`},
		{"unknown", []*operatorv1.ToolDecision{approve("call_1_0"), approve("call_1_1"), approve("call_9")}, `"call_9" is not waiting`},
		{"duplicate", []*operatorv1.ToolDecision{approve("call_1_0"), approve("call_1_0"), approve("call_1_1")}, `"call_1_0" is decided twice`},
		{"edit of a rejection", []*operatorv1.ToolDecision{edited, approve("call_1_1")}, "edited_input is for approved calls"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: resumeInput(out, cfg, tt.ds...)})
			wantStatus(t, err, codes.InvalidArgument, "")
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to say %s", err, tt.want)
			}
		})
	}
	if ran := rec.calls(); len(ran) != 0 {
		t.Fatalf("refused resumes ran %q", ran)
	}
	if n := len(m.requests()); n != 1 {
		t.Fatalf("refused resumes called the model: %d calls", n)
	}
}

// tokenParts splits a token into its prefix, its body (inflated JSON)
// and its MAC, the format resume.go writes.
func tokenParts(t *testing.T, token string) (string, map[string]any, string) {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q has %d parts", token, len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(flate.NewReader(bytes.NewReader(b)))
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatal(err)
	}
	return parts[0], body, parts[2]
}

// sealBody encodes body as a token body (without a valid MAC).
func sealBody(t *testing.T, prefix string, body map[string]any, mac string) string {
	t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw, _ := flate.NewWriter(&buf, flate.DefaultCompression)
	zw.Write(raw)
	zw.Close()
	return prefix + "." + base64.RawURLEncoding.EncodeToString(buf.Bytes()) + "." + mac
}

// TestApprovalTokenTamper is the attack test: a token with a flipped
// byte, one whose waiting-call list was swapped, one whose counters were
// lowered, and one signed by another operator's key are each refused
// with INVALID_ARGUMENT, and nothing runs.
func TestApprovalTokenTamper(t *testing.T) {
	rec := &recorder{}
	cfg := &operatorv1.OperatorConfig{ToolApprovals: map[string]operatorv1.ToolApproval{"write": always}}
	steps := []step{callTools("0", "look", `{}`, "write", `{"text":"a"}`), say("ok", "0")}
	key := bytes.Repeat([]byte{7}, 32)
	m := &fakeModel{steps: steps}
	c := serve(t, operator.Config{ExtraTools: approvalTools(rec), ResumeKey: key}, m)
	in := input("go")
	in.Config = cfg
	out := execute(t, c, in)
	token := out.GetExitReason().GetSuspension().GetResumeToken()
	prefix, body, mac := tokenParts(t, token)

	// The same turn on an operator with another key.
	other := serve(t, operator.Config{ExtraTools: approvalTools(rec), ResumeKey: bytes.Repeat([]byte{8}, 32)}, &fakeModel{steps: steps})
	otherIn := input("go")
	otherIn.Config = cfg
	otherOut := execute(t, other, otherIn)

	flipped := []byte(token)
	flipped[len(prefix)+10] ^= 0x01
	swapped := func() string {
		b := proto.Clone(structOf(t, body)).(*structpb.Struct).AsMap()
		b["pending"] = []any{map[string]any{"id": "call_1_0", "reason": "policy"}}
		return sealBody(t, prefix, b, mac)
	}()
	cheaper := func() string {
		b := proto.Clone(structOf(t, body)).(*structpb.Struct).AsMap()
		b["turns"] = 0
		return sealBody(t, prefix, b, mac)
	}()
	for _, tt := range []struct {
		name, token string
		ds          []*operatorv1.ToolDecision
		want        string
	}{
		{"flipped byte", string(flipped), []*operatorv1.ToolDecision{approve("call_1_1")}, "altered"},
		{"swapped pending calls", swapped, []*operatorv1.ToolDecision{reject("call_1_0", "")}, "altered"},
		{"lowered turn count", cheaper, []*operatorv1.ToolDecision{approve("call_1_1")}, "altered"},
		{"another operator's key", otherOut.GetExitReason().GetSuspension().GetResumeToken(), []*operatorv1.ToolDecision{approve("call_1_1")}, "--resume-key"},
		{"truncated MAC", token[:len(token)-2], []*operatorv1.ToolDecision{approve("call_1_1")}, "altered"},
		{"another format", "nrt0" + token[4:], []*operatorv1.ToolDecision{approve("call_1_1")}, `format "nrt0"`},
		{"garbage", "hello", []*operatorv1.ToolDecision{approve("call_1_1")}, `format "hello"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := &operatorv1.OperatorInput{Message: content.Text("x"), Config: cfg,
				Resume: &operatorv1.Resume{ResumeToken: tt.token, ToolDecisions: tt.ds}}
			_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: res})
			wantStatus(t, err, codes.InvalidArgument, "")
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to say %s", err, tt.want)
			}
		})
	}
	if ran := rec.calls(); len(ran) != 0 {
		t.Fatalf("forged resumes ran %q", ran)
	}
	// The genuine token still works, on any operator with the same key.
	same := serve(t, operator.Config{ExtraTools: approvalTools(rec), ResumeKey: key}, &fakeModel{steps: steps[1:]})
	wantExit(t, execute(t, same, resumeInput(out, cfg, approve("call_1_1"))), operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	sameList(t, "ran", rec.calls(), []string{`look {}`, `write {"text":"a"}`})
}

func structOf(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestApprovalLimitsAcrossResume: max_turns counts the turns before the
// suspension: with max_turns 2, a turn that waited and one more end the
// invocation, although the resumed part used only one turn.
func TestApprovalLimitsAcrossResume(t *testing.T) {
	rec := &recorder{}
	cfg := &operatorv1.OperatorConfig{MaxTurns: proto.Uint32(2), ToolApprovals: map[string]operatorv1.ToolApproval{"write": always}}
	m := &fakeModel{steps: []step{callTools("0", "write", `{"text":"a"}`), callTools("0", "look", `{}`), say("never", "0")}}
	c := serve(t, operator.Config{ExtraTools: approvalTools(rec)}, m)
	in := input("go")
	in.Config = cfg
	out := execute(t, c, in)
	pendingIDs(t, out)
	res := execute(t, c, resumeInput(out, cfg, approve("call_1_0")))
	wantExit(t, res, operatorv1.ExitKind_EXIT_KIND_MAX_TURNS)
	if n := len(m.requests()); n != 2 {
		t.Fatalf("model called %d times, want 2", n)
	}
	if res.GetMetadata().GetTurnsUsed() != 1 {
		t.Fatalf("resumed turns_used %d, want 1", res.GetMetadata().GetTurnsUsed())
	}
	sameList(t, "ran", rec.calls(), []string{`write {"text":"a"}`, `look {}`})
}

// TestApprovalSuspendAgain: a resumed invocation may wait again in a
// later turn; each suspension lists only its own calls.
func TestApprovalSuspendAgain(t *testing.T) {
	rec := &recorder{}
	cfg := &operatorv1.OperatorConfig{ToolApprovals: map[string]operatorv1.ToolApproval{"write": always}}
	m := &fakeModel{steps: []step{callTools("0", "write", `{"text":"a"}`), callTools("0", "write", `{"text":"b"}`), say("done", "0")}}
	c := serve(t, operator.Config{ExtraTools: approvalTools(rec)}, m)
	in := input("go")
	in.Config = cfg
	out := execute(t, c, in)
	sameList(t, "first", pendingIDs(t, out), []string{"write call_1_0 policy"})
	out = execute(t, c, resumeInput(out, cfg, approve("call_1_0")))
	sameList(t, "second", pendingIDs(t, out), []string{"write call_3_0 policy"})
	if tc := out.GetExitReason().GetSuspension().GetToolCalls()[0]; tc.GetTurn() != 2 {
		t.Fatalf("second suspension at turn %d", tc.GetTurn())
	}
	out = execute(t, c, resumeInput(out, cfg, reject("call_3_0", "enough")))
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	sameList(t, "ran", rec.calls(), []string{`write {"text":"a"}`})
}

// pastHistory is a session with one earlier exchange.
type pastHistory struct{}

func (pastHistory) Load(context.Context, string, int) ([]provider.Message, error) {
	return []provider.Message{
		{Role: provider.User, Parts: []provider.Part{{Text: "earlier question"}}},
		{Role: provider.Assistant, Parts: []provider.Part{{Text: "earlier answer"}}},
	}, nil
}

// TestApprovalSessionHistory: a suspended invocation declares no history
// (its turns travel in the token); the invocation that finishes declares
// all of them, after the session's history; a resume must name the same
// session.
func TestApprovalSessionHistory(t *testing.T) {
	rec := &recorder{}
	cfg := &operatorv1.OperatorConfig{ToolApprovals: map[string]operatorv1.ToolApproval{"write": always}}
	m := &fakeModel{steps: []step{callTools("0", "write", `{"text":"a"}`), say("done", "0")}}
	c := serve(t, operator.Config{ExtraTools: approvalTools(rec), History: pastHistory{}}, m)
	in := input("go")
	in.Config, in.SessionId = cfg, proto.String("s1")
	out := execute(t, c, in)
	pendingIDs(t, out)
	if len(out.GetEffects()) != 0 {
		t.Fatalf("a suspended invocation declared %v", out.GetEffects())
	}

	wrong := resumeInput(out, cfg, approve("call_3_0"))
	wrong.SessionId = proto.String("s2")
	_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: wrong})
	wantStatus(t, err, codes.InvalidArgument, "")
	if !strings.Contains(err.Error(), `session_id "s1"`) {
		t.Fatalf("error %v", err)
	}

	res := resumeInput(out, cfg, approve("call_3_0"))
	res.SessionId = proto.String("s1")
	done := execute(t, c, res)
	wantExit(t, done, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	msgs := m.requests()[1].Messages
	if len(msgs) != 5 || msgs[0].Parts[0].Text != "earlier question" || msgs[2].Parts[0].Text != "go" {
		t.Fatalf("resumed conversation %+v", msgs)
	}
	effs := done.GetEffects()
	if len(effs) != 1 || effs[0].GetWriteMemory() == nil {
		t.Fatalf("effects %v", effs)
	}
	stored := effs[0].GetWriteMemory().GetValue().GetStructValue().GetFields()["messages"].GetListValue().GetValues()
	if len(stored) != 4 { // task, tool call, result, answer
		b, _ := protojson.Marshal(effs[0])
		t.Fatalf("history holds %d messages, want 4: %s", len(stored), b)
	}
}

// TestApprovalOneShot: the one-shot operator suspends and resumes the
// same way across two processes' worth of runs sharing a key, and
// refuses to suspend without a key (no later process could resume it).
func TestApprovalOneShot(t *testing.T) {
	rec := &recorder{}
	m := &fakeModel{steps: []step{callTools("0", "write", `{"text":"a"}`), say("done", "0")}}
	run := func(t *testing.T, key []byte, in *operatorv1.OperatorInput) (int, []byte) {
		t.Helper()
		b, err := protojson.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		cfg := operator.Config{Log: harness.Logger(t), Router: provider.Single{Provider: m, Default: "fake-1"},
			ExtraTools: approvalTools(rec), ResumeKey: key}
		code, err := operator.RunOneShot(context.Background(), cfg, bytes.NewReader(b), &stdout, &stderr)
		if err != nil {
			t.Fatal(err)
		}
		return code, stdout.Bytes()
	}
	cfg := &operatorv1.OperatorConfig{ToolApprovals: map[string]operatorv1.ToolApproval{"write": always}}
	in := input("go")
	in.Config = cfg

	code, stdout := run(t, nil, in)
	if code != operator.ExitStatusBase+int(codes.FailedPrecondition) || !strings.Contains(string(stdout), "resume-key") {
		t.Fatalf("without a key: exit %d, %s", code, stdout)
	}

	m.reqs = nil
	key := bytes.Repeat([]byte{3}, 32)
	code, stdout = run(t, key, in)
	out := &operatorv1.OperatorOutput{}
	if err := protojson.Unmarshal(stdout, out); err != nil || code != operator.ExitNotDone {
		t.Fatalf("exit %d, %s (%v)", code, stdout, err)
	}
	sameList(t, "waiting", pendingIDs(t, out), []string{"write call_1_0 policy"})
	code, stdout = run(t, key, resumeInput(out, cfg, approve("call_1_0")))
	if code != operator.ExitComplete {
		t.Fatalf("resume: exit %d, %s", code, stdout)
	}
	sameList(t, "ran", rec.calls(), []string{`write {"text":"a"}`})
}

// TestApprovalConfigChecked: an approval setting the contract does not
// define is INVALID_ARGUMENT.
func TestApprovalConfigChecked(t *testing.T) {
	c := serve(t, operator.Config{}, &fakeModel{steps: []step{say("x", "0")}})
	in := withApprovals(input("go"), map[string]operatorv1.ToolApproval{"write": 9})
	_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: in})
	wantStatus(t, err, codes.InvalidArgument, "")
}

// TestApprovalCostAndEffectsAcrossResume: max_cost counts the cost spent
// before the suspension, and effect keys number on from the effects the
// suspended output declared (keyed by the first dispatch, whatever the
// resume's dispatch id), so no two effects share a key.
func TestApprovalCostAndEffectsAcrossResume(t *testing.T) {
	rec := &recorder{}
	cfg := &operatorv1.OperatorConfig{MaxCost: &typesv1.Money{Amount: "0.05"}, ToolApprovals: map[string]operatorv1.ToolApproval{"write": always}}
	m := &fakeModel{steps: []step{
		callTools("0.01", "write_memory", `{"key":"a","value":1,"scope":"global"}`),
		callTools("0.02", "write", `{"text":"a"}`),
		callTools("0.03", "write_memory", `{"key":"b","value":2,"scope":"global"}`),
		say("never", "0"),
	}}
	c := serve(t, operator.Config{ExtraTools: approvalTools(rec), EffectTools: true}, m)
	in := input("go")
	in.Config = cfg
	in.Dispatch = &operatorv1.DispatchContext{DispatchId: "d-1"}
	out := execute(t, c, in)
	pendingIDs(t, out)
	if effs := out.GetEffects(); len(effs) != 1 || effs[0].GetIdempotencyKey() != "d-1/effect/1" {
		t.Fatalf("suspended output's effects %v", effs)
	}
	res := resumeInput(out, cfg, approve("call_3_0"))
	res.Dispatch = &operatorv1.DispatchContext{DispatchId: "d-2"}
	done := execute(t, c, res)
	// 0.01 + 0.02 + 0.03 reaches 0.05 only counted across the suspension.
	wantExit(t, done, operatorv1.ExitKind_EXIT_KIND_BUDGET_EXHAUSTED)
	if effs := done.GetEffects(); len(effs) != 1 || effs[0].GetIdempotencyKey() != "d-1/effect/2" || effs[0].GetWriteMemory().GetKey() != "b" {
		t.Fatalf("resumed output's effects %v", effs)
	}
	if got := done.GetMetadata().GetCost().GetAmount(); got != "0.03" {
		t.Fatalf("resumed cost %s, want 0.03 (its own)", got)
	}
}
