package hook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
)

const (
	preInference  = operatorv1.HookPoint_HOOK_POINT_PRE_INFERENCE
	postInference = operatorv1.HookPoint_HOOK_POINT_POST_INFERENCE
	preTool       = operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE
	postTool      = operatorv1.HookPoint_HOOK_POINT_POST_TOOL_USE
	exitCheck     = operatorv1.HookPoint_HOOK_POINT_EXIT_CHECK

	kContinue = operatorv1.HookActionKind_HOOK_ACTION_KIND_CONTINUE
	kHalt     = operatorv1.HookActionKind_HOOK_ACTION_KIND_HALT
	kSkip     = operatorv1.HookActionKind_HOOK_ACTION_KIND_SKIP_TOOL
	kModify   = operatorv1.HookActionKind_HOOK_ACTION_KIND_MODIFY_TOOL_INPUT
)

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logLine is the part of a log record the tests check.
type logLine struct {
	Level, Msg, Hook, Point string
}

func newLogger() (*slog.Logger, *syncBuffer) {
	buf := &syncBuffer{}
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// records returns every record at level min or above, in full.
func records(t *testing.T, buf *syncBuffer, min slog.Level) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(m["level"].(string))); err != nil {
			t.Fatal(err)
		}
		if lvl >= min {
			out = append(out, m)
		}
	}
	return out
}

func lines(t *testing.T, buf *syncBuffer, min slog.Level) []logLine {
	t.Helper()
	var out []logLine
	for _, m := range records(t, buf, min) {
		s := func(k string) string { v, _ := m[k].(string); return v }
		out = append(out, logLine{Level: s("level"), Msg: s("msg"), Hook: s("hook"), Point: s("point")})
	}
	return out
}

func obj(t *testing.T, m map[string]any) *structpb.Value {
	t.Helper()
	v, err := structpb.NewValue(m)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func inputJSON(v *structpb.Value) string {
	if v == nil {
		return "null"
	}
	b, err := json.Marshal(v.AsInterface())
	if err != nil {
		return "!" + err.Error()
	}
	return string(b)
}

func sameDecision(a, b Decision) bool {
	return a.Kind == b.Kind && a.Reason == b.Reason && a.Hook == b.Hook && proto.Equal(a.NewInput, b.NewInput) &&
		a.NeedsApproval == b.NeedsApproval && a.ApprovalReason == b.ApprovalReason && a.ApprovalHook == b.ApprovalHook
}

func showDecision(d Decision) string {
	return fmt.Sprintf("{%s reason=%q hook=%q input=%s approval=%v %q %q}", d.Kind, d.Reason, d.Hook, inputJSON(d.NewInput),
		d.NeedsApproval, d.ApprovalReason, d.ApprovalHook)
}

// recorder makes hooks that record their calls and the tool input seen.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, s)
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func (r *recorder) hook(name string, act *operatorv1.HookAction, err error, points ...operatorv1.HookPoint) Hook {
	return Func{HookName: name, At: points, Fn: func(_ context.Context, hc *operatorv1.HookContext) (*operatorv1.HookAction, error) {
		r.add(name + inputJSON(hc.GetToolInput()))
		return act, err
	}}
}

func TestRunPipeline(t *testing.T) {
	aTxt := map[string]any{"path": "a.txt"}
	bTxt := map[string]any{"path": "b.txt"}
	cTxt := map[string]any{"path": "c.txt"}
	str := structpb.NewStringValue("b.txt")
	type step struct {
		name string
		act  *operatorv1.HookAction
		err  error
	}
	tests := []struct {
		name      string
		point     operatorv1.HookPoint
		steps     []step
		want      Decision
		wantCalls []string
		wantLog   []logLine // records at Info and above
	}{
		{
			name:  "no hooks at the point",
			point: preTool,
			want:  Decision{Kind: kContinue},
		},
		{
			name:  "all continue, in order",
			point: preInference,
			steps: []step{
				{name: "a", act: Continue()},
				{name: "b"},                                // nil action
				{name: "c", act: &operatorv1.HookAction{}}, // UNSPECIFIED
			},
			want:      Decision{Kind: kContinue},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"a.txt"}`, `c{"path":"a.txt"}`},
		},
		{
			name:  "first halt wins and stops the pipeline",
			point: postInference,
			steps: []step{
				{name: "a", act: Continue()},
				{name: "b", act: Halt("too long")},
				{name: "c", act: Halt("other")},
			},
			want:      Decision{Kind: kHalt, Reason: "too long", Hook: "b"},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"a.txt"}`},
			wantLog:   []logLine{{"INFO", "hook halted the loop", "b", "HOOK_POINT_POST_INFERENCE"}},
		},
		{
			name:      "halt at exit check",
			point:     exitCheck,
			steps:     []step{{name: "budget", act: Halt("over budget")}},
			want:      Decision{Kind: kHalt, Reason: "over budget", Hook: "budget"},
			wantCalls: []string{`budget{"path":"a.txt"}`},
			wantLog:   []logLine{{"INFO", "hook halted the loop", "budget", "HOOK_POINT_EXIT_CHECK"}},
		},
		{
			name:  "skip at pre tool use stops the pipeline",
			point: preTool,
			steps: []step{
				{name: "a", act: Skip("no writes")},
				{name: "b", act: Halt("never called")},
			},
			want:      Decision{Kind: kSkip, Reason: "no writes", Hook: "a"},
			wantCalls: []string{`a{"path":"a.txt"}`},
			wantLog:   []logLine{{"INFO", "hook skipped the tool", "a", "HOOK_POINT_PRE_TOOL_USE"}},
		},
		{
			name:  "modify is seen by later hooks",
			point: preTool,
			steps: []step{
				{name: "a", act: Modify(obj(t, bTxt), "sandbox path")},
				{name: "b", act: Continue()},
			},
			want:      Decision{Kind: kModify, Reason: "sandbox path", Hook: "a", NewInput: obj(t, bTxt)},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"b.txt"}`},
			wantLog:   []logLine{{"INFO", "hook modified the tool input", "a", "HOOK_POINT_PRE_TOOL_USE"}},
		},
		{
			name:  "a later hook modifies again",
			point: preTool,
			steps: []step{
				{name: "a", act: Modify(obj(t, bTxt), "first")},
				{name: "b", act: Modify(obj(t, cTxt), "second")},
				{name: "c"},
			},
			want:      Decision{Kind: kModify, Reason: "second", Hook: "b", NewInput: obj(t, cTxt)},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"b.txt"}`, `c{"path":"c.txt"}`},
			wantLog: []logLine{
				{"INFO", "hook modified the tool input", "a", "HOOK_POINT_PRE_TOOL_USE"},
				{"INFO", "hook modified the tool input", "b", "HOOK_POINT_PRE_TOOL_USE"},
			},
		},
		{
			name:  "modify then skip",
			point: preTool,
			steps: []step{
				{name: "a", act: Modify(obj(t, bTxt), "")},
				{name: "b", act: Skip("b.txt is protected")},
			},
			want:      Decision{Kind: kSkip, Reason: "b.txt is protected", Hook: "b"},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"b.txt"}`},
			wantLog: []logLine{
				{"INFO", "hook modified the tool input", "a", "HOOK_POINT_PRE_TOOL_USE"},
				{"INFO", "hook skipped the tool", "b", "HOOK_POINT_PRE_TOOL_USE"},
			},
		},
		{
			name:  "modify then halt",
			point: preTool,
			steps: []step{
				{name: "a", act: Modify(obj(t, bTxt), "")},
				{name: "b", act: Halt("stop")},
			},
			want:      Decision{Kind: kHalt, Reason: "stop", Hook: "b"},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"b.txt"}`},
			wantLog: []logLine{
				{"INFO", "hook modified the tool input", "a", "HOOK_POINT_PRE_TOOL_USE"},
				{"INFO", "hook halted the loop", "b", "HOOK_POINT_PRE_TOOL_USE"},
			},
		},
		{
			name:  "require approval goes on to later hooks",
			point: preTool,
			steps: []step{
				{name: "a", act: RequireApproval("writes need a person")},
				{name: "b", act: RequireApproval("second opinion")},
				{name: "c", act: Modify(obj(t, bTxt), "redact")},
			},
			want: Decision{Kind: kModify, Reason: "redact", Hook: "c", NewInput: obj(t, bTxt),
				NeedsApproval: true, ApprovalReason: "writes need a person", ApprovalHook: "a"},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"a.txt"}`, `c{"path":"a.txt"}`},
			wantLog: []logLine{
				{"INFO", "hook requires approval of the tool call", "a", "HOOK_POINT_PRE_TOOL_USE"},
				{"INFO", "hook requires approval of the tool call", "b", "HOOK_POINT_PRE_TOOL_USE"},
				{"INFO", "hook modified the tool input", "c", "HOOK_POINT_PRE_TOOL_USE"},
			},
		},
		{
			name:  "require approval outside pre tool use is misuse",
			point: postInference,
			steps: []step{{name: "a", act: RequireApproval("late")}},
			want:  Decision{Kind: kContinue}, wantCalls: []string{`a{"path":"a.txt"}`},
			wantLog: []logLine{{"WARN", "hook misuse: action only allowed at HOOK_POINT_PRE_TOOL_USE; continuing",
				"a", "HOOK_POINT_POST_INFERENCE"}},
		},
		{
			name:  "skip outside pre tool use is misuse",
			point: postTool,
			steps: []step{
				{name: "a", act: Skip("too late")},
				{name: "b"},
			},
			want:      Decision{Kind: kContinue},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"a.txt"}`},
			wantLog: []logLine{{"WARN", "hook misuse: action only allowed at HOOK_POINT_PRE_TOOL_USE; continuing",
				"a", "HOOK_POINT_POST_TOOL_USE"}},
		},
		{
			name:  "modify outside pre tool use is misuse and changes nothing",
			point: postInference,
			steps: []step{
				{name: "a", act: Modify(obj(t, bTxt), "")},
				{name: "b"},
			},
			want:      Decision{Kind: kContinue},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"a.txt"}`},
			wantLog: []logLine{{"WARN", "hook misuse: action only allowed at HOOK_POINT_PRE_TOOL_USE; continuing",
				"a", "HOOK_POINT_POST_INFERENCE"}},
		},
		{
			name:  "misuse then halt",
			point: exitCheck,
			steps: []step{
				{name: "a", act: Skip("")},
				{name: "b", act: Halt("done")},
			},
			want:      Decision{Kind: kHalt, Reason: "done", Hook: "b"},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"a.txt"}`},
			wantLog: []logLine{
				{"WARN", "hook misuse: action only allowed at HOOK_POINT_PRE_TOOL_USE; continuing", "a", "HOOK_POINT_EXIT_CHECK"},
				{"INFO", "hook halted the loop", "b", "HOOK_POINT_EXIT_CHECK"},
			},
		},
		{
			name:  "failing hook continues",
			point: preTool,
			steps: []step{
				{name: "a", err: errors.New("policy store down")},
				{name: "b", act: Skip("b says no")},
			},
			want:      Decision{Kind: kSkip, Reason: "b says no", Hook: "b"},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"a.txt"}`},
			wantLog: []logLine{
				{"WARN", "hook failed; continuing", "a", "HOOK_POINT_PRE_TOOL_USE"},
				{"INFO", "hook skipped the tool", "b", "HOOK_POINT_PRE_TOOL_USE"},
			},
		},
		{
			name:  "an error wins over the action returned with it",
			point: postInference,
			steps: []step{{name: "a", act: Halt("ignored"), err: errors.New("broken")}},
			want:  Decision{Kind: kContinue}, wantCalls: []string{`a{"path":"a.txt"}`},
			wantLog: []logLine{{"WARN", "hook failed; continuing", "a", "HOOK_POINT_POST_INFERENCE"}},
		},
		{
			name:  "modify without new input is invalid",
			point: preTool,
			steps: []step{
				{name: "a", act: &operatorv1.HookAction{Kind: kModify}},
				{name: "b"},
			},
			want:      Decision{Kind: kContinue},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"a.txt"}`},
			wantLog:   []logLine{{"WARN", "hook failed; continuing", "a", "HOOK_POINT_PRE_TOOL_USE"}},
		},
		{
			name:  "modify with a non-object input is invalid",
			point: preTool,
			steps: []step{
				{name: "a", act: Modify(str, "")},
				{name: "b"},
			},
			want:      Decision{Kind: kContinue},
			wantCalls: []string{`a{"path":"a.txt"}`, `b{"path":"a.txt"}`},
			wantLog:   []logLine{{"WARN", "hook failed; continuing", "a", "HOOK_POINT_PRE_TOOL_USE"}},
		},
		{
			name:      "unknown action kind is invalid",
			point:     preInference,
			steps:     []step{{name: "a", act: &operatorv1.HookAction{Kind: 42}}},
			want:      Decision{Kind: kContinue},
			wantCalls: []string{`a{"path":"a.txt"}`},
			wantLog:   []logLine{{"WARN", "hook failed; continuing", "a", "HOOK_POINT_PRE_INFERENCE"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log, buf := newLogger()
			reg := NewRegistry(log)
			rec := &recorder{}
			// A hook at every other point must never be called.
			var others []operatorv1.HookPoint
			for _, p := range []operatorv1.HookPoint{preInference, postInference, preTool, postTool, exitCheck} {
				if p != tt.point {
					others = append(others, p)
				}
			}
			reg.Add(rec.hook("elsewhere", Halt("wrong point"), nil, others...))
			for _, s := range tt.steps {
				reg.Add(rec.hook(s.name, s.act, s.err, tt.point))
			}
			hc := &operatorv1.HookContext{Point: tt.point, ToolName: "write", ToolInput: obj(t, aTxt)}
			orig := proto.CloneOf(hc)

			got := reg.Run(context.Background(), hc)

			if !sameDecision(got, tt.want) {
				t.Errorf("decision = %s, want %s", showDecision(got), showDecision(tt.want))
			}
			if c := rec.got(); fmt.Sprint(c) != fmt.Sprint(tt.wantCalls) {
				t.Errorf("calls = %q, want %q", c, tt.wantCalls)
			}
			if l := lines(t, buf, slog.LevelInfo); fmt.Sprint(l) != fmt.Sprint(tt.wantLog) {
				t.Errorf("log = %+v, want %+v", l, tt.wantLog)
			}
			if !proto.Equal(hc, orig) {
				t.Errorf("Run modified the caller's context: %v", hc)
			}
		})
	}
}

func TestFailureIsLoggedWithNameAndError(t *testing.T) {
	log, buf := newLogger()
	reg := NewRegistry(log)
	reg.Add(Func{HookName: "guard", At: []operatorv1.HookPoint{preTool}, Fn: func(context.Context, *operatorv1.HookContext) (*operatorv1.HookAction, error) {
		return nil, errors.New("policy store down")
	}})
	got := reg.Run(context.Background(), &operatorv1.HookContext{Point: preTool})
	if got.Kind != kContinue {
		t.Fatalf("decision = %s, want CONTINUE", showDecision(got))
	}
	recs := records(t, buf, slog.LevelWarn)
	if len(recs) != 1 {
		t.Fatalf("want 1 warning, got %v", recs)
	}
	want := map[string]any{"level": "WARN", "msg": "hook failed; continuing", "hook": "guard",
		"point": "HOOK_POINT_PRE_TOOL_USE", "err": "policy store down"}
	for k, v := range want {
		if recs[0][k] != v {
			t.Errorf("log %s = %v, want %v", k, recs[0][k], v)
		}
	}
}

func TestInvalidActionErrorText(t *testing.T) {
	tests := []struct {
		act  *operatorv1.HookAction
		want string
	}{
		{nil, ""},
		{&operatorv1.HookAction{}, ""},
		{Halt(""), ""},
		{Modify(structpb.NewStructValue(&structpb.Struct{}), ""), ""},
		{&operatorv1.HookAction{Kind: 42}, "unknown action kind 42"},
		{&operatorv1.HookAction{Kind: kModify}, "MODIFY_TOOL_INPUT without new_input"},
		{Modify(structpb.NewListValue(&structpb.ListValue{}), ""), "MODIFY_TOOL_INPUT new_input is not a JSON object"},
		{Modify(structpb.NewNullValue(), ""), "MODIFY_TOOL_INPUT new_input is not a JSON object"},
	}
	for _, tt := range tests {
		err := CheckAction(tt.act)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("CheckAction(%v) = %q, want %q", tt.act, got, tt.want)
		}
	}
}

func TestPanicContinues(t *testing.T) {
	log, buf := newLogger()
	reg := NewRegistry(log)
	reg.Add(Func{HookName: "crashy", At: []operatorv1.HookPoint{postTool}, Fn: func(context.Context, *operatorv1.HookContext) (*operatorv1.HookAction, error) {
		panic("boom")
	}})
	rec := &recorder{}
	reg.Add(rec.hook("next", nil, nil, postTool))

	got := reg.Run(context.Background(), &operatorv1.HookContext{Point: postTool})

	if !sameDecision(got, Decision{Kind: kContinue}) {
		t.Errorf("decision = %s, want CONTINUE", showDecision(got))
	}
	if c := rec.got(); len(c) != 1 {
		t.Errorf("the hook after the panic was not called: %q", c)
	}
	recs := records(t, buf, slog.LevelWarn)
	if len(recs) != 1 {
		t.Fatalf("want 1 record, got %v", recs)
	}
	r := recs[0]
	if r["level"] != "ERROR" || r["msg"] != "hook panicked; continuing" || r["hook"] != "crashy" ||
		r["point"] != "HOOK_POINT_POST_TOOL_USE" || r["err"] != "hook panicked: boom" {
		t.Errorf("record = %v", r)
	}
	if s, _ := r["stack"].(string); !strings.Contains(s, "TestPanicContinues") {
		t.Errorf("stack does not show the panicking hook: %q", s)
	}
}

func TestTimeoutContinues(t *testing.T) {
	const timeout = 200 * time.Millisecond
	log, buf := newLogger()
	reg := NewRegistry(log, WithTimeout(timeout))
	deadlines := make(chan time.Time, 1)
	reg.Add(Func{HookName: "slow", At: []operatorv1.HookPoint{preInference}, Fn: func(ctx context.Context, _ *operatorv1.HookContext) (*operatorv1.HookAction, error) {
		dl, _ := ctx.Deadline()
		deadlines <- dl
		<-ctx.Done()
		return Halt("too late"), ctx.Err()
	}})
	rec := &recorder{}
	reg.Add(rec.hook("next", Halt("next halts"), nil, preInference))

	start := time.Now()
	got := reg.Run(context.Background(), &operatorv1.HookContext{Point: preInference})
	elapsed := time.Since(start)

	if !sameDecision(got, Decision{Kind: kHalt, Reason: "next halts", Hook: "next"}) {
		t.Errorf("decision = %s", showDecision(got))
	}
	if elapsed < timeout || elapsed > timeout+3*time.Second {
		t.Errorf("Run took %s with a %s hook timeout", elapsed, timeout)
	}
	if d := (<-deadlines).Sub(start); d <= 0 || d > timeout+time.Second {
		t.Errorf("the hook's deadline was %s after the start, want about %s", d, timeout)
	}
	recs := records(t, buf, slog.LevelWarn)
	if len(recs) != 1 || recs[0]["msg"] != "hook failed; continuing" || recs[0]["hook"] != "slow" ||
		!strings.Contains(fmt.Sprint(recs[0]["err"]), "deadline exceeded") {
		t.Errorf("log = %v", recs)
	}
}

func TestHookIgnoringItsContextIsAbandoned(t *testing.T) {
	const timeout = 100 * time.Millisecond
	log, buf := newLogger()
	reg := NewRegistry(log, WithTimeout(timeout))
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	reg.Add(Func{HookName: "stuck", At: []operatorv1.HookPoint{exitCheck}, Fn: func(context.Context, *operatorv1.HookContext) (*operatorv1.HookAction, error) {
		<-release // ignores ctx
		return Halt("never seen"), nil
	}})

	start := time.Now()
	got := reg.Run(context.Background(), &operatorv1.HookContext{Point: exitCheck})
	elapsed := time.Since(start)

	if got.Kind != kContinue {
		t.Errorf("decision = %s, want CONTINUE", showDecision(got))
	}
	if elapsed < timeout || elapsed > timeout+3*time.Second {
		t.Errorf("Run took %s with a %s hook timeout", elapsed, timeout)
	}
	recs := records(t, buf, slog.LevelWarn)
	want := "no answer before the deadline (hook timeout 100ms): context deadline exceeded"
	if len(recs) != 1 || recs[0]["hook"] != "stuck" || recs[0]["err"] != want {
		t.Errorf("log = %v, want one warning with err %q", recs, want)
	}
}

func TestDoneContextStopsThePipeline(t *testing.T) {
	log, buf := newLogger()
	reg := NewRegistry(log)
	rec := &recorder{}
	reg.Add(rec.hook("a", Halt("x"), nil, preInference))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	got := reg.Run(ctx, &operatorv1.HookContext{Point: preInference})

	if got.Kind != kContinue {
		t.Errorf("decision = %s, want CONTINUE", showDecision(got))
	}
	if c := rec.got(); len(c) != 0 {
		t.Errorf("hooks called after the context ended: %q", c)
	}
	if l := lines(t, buf, slog.LevelInfo); len(l) != 0 {
		t.Errorf("a done context is not worth a warning: %v", l)
	}
}

func TestCancelDuringHookIsNotAWarning(t *testing.T) {
	log, buf := newLogger()
	reg := NewRegistry(log)
	ctx, cancel := context.WithCancel(context.Background())
	reg.Add(Func{HookName: "a", At: []operatorv1.HookPoint{preInference}, Fn: func(hctx context.Context, _ *operatorv1.HookContext) (*operatorv1.HookAction, error) {
		cancel()
		<-hctx.Done()
		return nil, hctx.Err()
	}})
	if got := reg.Run(ctx, &operatorv1.HookContext{Point: preInference}); got.Kind != kContinue {
		t.Errorf("decision = %s", showDecision(got))
	}
	if l := lines(t, buf, slog.LevelInfo); len(l) != 0 {
		t.Errorf("log = %v, want nothing at info or above", l)
	}
	if l := lines(t, buf, slog.LevelDebug); len(l) != 1 || l[0].Msg != "hook interrupted; continuing" {
		t.Errorf("debug log = %v", l)
	}
}

func TestAddRejectsInvalidHooks(t *testing.T) {
	tests := []struct {
		name string
		hook Hook
		want string
	}{
		{"nil", nil, "hook: Registry.Add(nil)"},
		{"unspecified", Func{HookName: "h", At: []operatorv1.HookPoint{preTool, operatorv1.HookPoint_HOOK_POINT_UNSPECIFIED}},
			`hook: Registry.Add: hook "h" names invalid point HOOK_POINT_UNSPECIFIED`},
		{"undefined", Func{HookName: "h", At: []operatorv1.HookPoint{42}},
			`hook: Registry.Add: hook "h" names invalid point 42`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := NewRegistry(nil)
			defer func() {
				if p := recover(); fmt.Sprint(p) != tt.want {
					t.Errorf("panic = %v, want %q", p, tt.want)
				}
				if reg.Len() != 0 || reg.Wants(preTool) {
					t.Error("a rejected hook was registered")
				}
			}()
			reg.Add(tt.hook)
		})
	}
}

func TestDuplicatePointsCallOnce(t *testing.T) {
	reg := NewRegistry(nil)
	rec := &recorder{}
	reg.Add(rec.hook("a", nil, nil, preTool, postTool, preTool))
	reg.Run(context.Background(), &operatorv1.HookContext{Point: preTool})
	reg.Run(context.Background(), &operatorv1.HookContext{Point: postTool})
	if c := rec.got(); fmt.Sprint(c) != "[anull anull]" {
		t.Errorf("calls = %q", c)
	}
	if reg.Len() != 1 {
		t.Errorf("Len = %d, want 1", reg.Len())
	}
}

func TestEmptyAndNilRegistry(t *testing.T) {
	var nilReg *Registry
	for _, reg := range []*Registry{nilReg, NewRegistry(nil)} {
		if got := reg.Run(context.Background(), &operatorv1.HookContext{Point: preTool}); !sameDecision(got, Decision{Kind: kContinue}) {
			t.Errorf("decision = %s", showDecision(got))
		}
		if reg.Wants(preTool) || reg.Len() != 0 {
			t.Error("empty registry wants a point")
		}
	}
	if got := NewRegistry(nil).Run(context.Background(), nil); got.Kind != kContinue {
		t.Errorf("nil context: %s", showDecision(got))
	}
}

func TestWantsAndTimeout(t *testing.T) {
	reg := NewRegistry(nil)
	if reg.Timeout() != DefaultTimeout {
		t.Errorf("default timeout = %s", reg.Timeout())
	}
	if NewRegistry(nil, WithTimeout(0)).Timeout() != DefaultTimeout {
		t.Error("WithTimeout(0) should keep the default")
	}
	if NewRegistry(nil, WithTimeout(time.Second)).Timeout() != time.Second {
		t.Error("WithTimeout ignored")
	}
	reg.Add(Func{HookName: "a", At: []operatorv1.HookPoint{postTool}})
	for _, p := range []operatorv1.HookPoint{preInference, postInference, preTool, postTool, exitCheck} {
		if got, want := reg.Wants(p), p == postTool; got != want {
			t.Errorf("Wants(%s) = %v, want %v", p, got, want)
		}
	}
}

func TestDecisionPredicates(t *testing.T) {
	for _, tt := range []struct {
		kind                     operatorv1.HookActionKind
		halted, skipped, changed bool
	}{
		{kContinue, false, false, false},
		{kHalt, true, false, false},
		{kSkip, false, true, false},
		{kModify, false, false, true},
	} {
		d := Decision{Kind: tt.kind}
		if d.Halted() != tt.halted || d.Skipped() != tt.skipped || d.Modified() != tt.changed {
			t.Errorf("%s: Halted=%v Skipped=%v Modified=%v", tt.kind, d.Halted(), d.Skipped(), d.Modified())
		}
	}
}

func TestConcurrentRunAndAdd(t *testing.T) {
	reg := NewRegistry(nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			reg.Add(Func{HookName: fmt.Sprint("h", i), At: []operatorv1.HookPoint{preTool}})
		}()
		go func() {
			defer wg.Done()
			for range 50 {
				reg.Run(context.Background(), &operatorv1.HookContext{Point: preTool})
			}
		}()
	}
	wg.Wait()
	if reg.Len() != 8 {
		t.Errorf("Len = %d, want 8", reg.Len())
	}
}

func BenchmarkRunEmpty(b *testing.B) {
	reg := NewRegistry(nil)
	reg.Add(Func{HookName: "a", At: []operatorv1.HookPoint{postTool}})
	hc := &operatorv1.HookContext{Point: preTool}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		reg.Run(ctx, hc)
	}
}
