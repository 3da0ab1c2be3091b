package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// orchClient is a client of the fake at addr.
func orchClient(t *testing.T, addr string) orchestratorv1.OrchestratorServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return orchestratorv1.NewOrchestratorServiceClient(cc)
}

// runCLI runs neuron with args in process and returns its exit code and
// output.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	c, out, errOut := testCLI()
	code := c.main(context.Background(), args)
	return code, out.String(), errOut.String()
}

// TestWatcherReconnect: a stream broken in the middle of an operator call
// is reopened after the last durable event; the call's progress, sent
// again from its start, is shown once, and so is every event.
func TestWatcherReconnect(t *testing.T) {
	f := newFakeOrch()
	f.lockstep, f.breakAfter = true, 3 // started, "Hel", "lo", then the break
	addr := serveOrch(t, f)
	if _, err := f.start("wf-r", "assistant", &operatorv1.OperatorInput{Message: content.Text("hello")}); err != nil {
		t.Fatal(err)
	}
	var (
		seqs []uint64
		text strings.Builder
	)
	w := &watcher{client: orchClient(t, addr), id: "wf-r",
		onEvent: func(ev *lifecyclev1.LifecycleEvent) { seqs = append(seqs, ev.GetWorkflowSequence()) },
		onProgress: func(p *orchestratorv1.StepProgress, restarted bool) {
			if restarted {
				t.Errorf("progress %d taken for a new attempt of the call", p.GetIndex())
			}
			text.WriteString(p.GetEvent().GetTextDelta().GetText())
		},
	}
	wf, err := w.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Errorf("end %v, want COMPLETED", wf.GetStatus())
	}
	if w.reconnects != 1 {
		t.Errorf("%d reconnects, want 1", w.reconnects)
	}
	if text.String() != "Hello, world" {
		t.Errorf("text %q, want %q once", text.String(), "Hello, world")
	}
	if len(seqs) != 3 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 {
		t.Errorf("event sequences %v, want [1 2 3]", seqs)
	}
}

// TestWatcherFresh: progress replayed after a reconnect is left out,
// progress that differs from what was shown is a new attempt, and an
// index going back on one stream is a new attempt.
func TestWatcherFresh(t *testing.T) {
	w := &watcher{calls: map[string]*seenCall{}, gen: 1}
	p := func(i uint64, s string) *orchestratorv1.StepProgress {
		return &orchestratorv1.StepProgress{DispatchId: "d#1", Index: i, Event: text(s)}
	}
	check := func(what string, pr *orchestratorv1.StepProgress, fresh, restarted bool) {
		t.Helper()
		if f, r := w.fresh(pr); f != fresh || r != restarted {
			t.Errorf("%s: fresh %v restarted %v, want %v %v", what, f, r, fresh, restarted)
		}
	}
	check("first", p(1, "a"), true, false)
	check("second", p(2, "b"), true, false)
	w.gen++ // a reconnect
	check("replayed 1", p(1, "a"), false, false)
	check("replayed 2", p(2, "b"), false, false)
	check("new 3", p(3, "c"), true, false)
	check("same stream, back to 1", p(1, "a"), true, true)
	w.gen++
	check("after a reconnect, a different 1", p(1, "x"), true, true)
}

func TestRunStreams(t *testing.T) {
	f := newFakeOrch()
	f.lockstep = true
	addr := serveOrch(t, f)
	code, out, errOut := runCLI(t, "run", "assistant", "use", "a", "tool", "--addr", addr)
	if code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"dispatching assistant in workflow run-",
		"assistant    workflow started (agent assistant)",
		"\n→ read({\"path\":\"notes.txt\"})\n← line one … (17 bytes)\nHello, world\n",
		"answer (assistant):\n  Hello, world\n",
		"cost:     $0.01 for the whole workflow",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\033[") {
		t.Errorf("piped output has terminal escapes:\n%q", out)
	}
}

// TestRunReconnects: `neuron run` whose stream breaks shows the answer's
// text and each event once.
func TestRunReconnects(t *testing.T) {
	f := newFakeOrch()
	f.lockstep, f.breakAfter = true, 3
	addr := serveOrch(t, f)
	code, out, errOut := runCLI(t, "run", "assistant", "hello", "--addr", addr)
	if code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", code, out, errOut)
	}
	streamed, _, _ := strings.Cut(out, "\nanswer (")
	if n := strings.Count(streamed, "Hel"); n != 1 || !strings.Contains(streamed, "\nHello, world\n") || strings.Contains(streamed, "started again") {
		t.Errorf("the streamed answer is shown %d times, want once:\n%s", n, out)
	}
	if n := strings.Count(out, "workflow started"); n != 1 {
		t.Errorf("the started event is shown %d times, want once:\n%s", n, out)
	}
	if f.watches < 3 { // the probe, the broken stream, the reconnect
		t.Errorf("%d WatchWorkflow calls, want at least 3", f.watches)
	}
}

func TestRunJSON(t *testing.T) {
	f := newFakeOrch()
	f.lockstep = true
	addr := serveOrch(t, f)
	code, out, _ := runCLI(t, "run", "assistant", "hello", "--json", "--addr", addr)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	kinds := map[string]int{}
	for i, l := range lines {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &obj); err != nil || len(obj) != 1 {
			t.Fatalf("line %d is not one JSON object with one field: %q", i+1, l)
		}
		for k, v := range obj {
			kinds[k]++
			if k == "progress" {
				if err := protojson.Unmarshal(v, &orchestratorv1.StepProgress{}); err != nil {
					t.Errorf("line %d: not a StepProgress: %v", i+1, err)
				}
			}
			if k == "result" && i != len(lines)-1 {
				t.Errorf("the result is line %d of %d, want last", i+1, len(lines))
			}
		}
	}
	if kinds["event"] != 3 || kinds["progress"] != 4 || kinds["result"] != 1 {
		t.Errorf("lines by kind %v, want 3 events, 4 progress, 1 result", kinds)
	}
}

func TestRunUnknownAgent(t *testing.T) {
	f := newFakeOrch()
	addr := serveOrch(t, f)
	code, out, errOut := runCLI(t, "run", "nobody", "hello", "--addr", addr)
	if code != 15 || !strings.Contains(errOut, "NOT_FOUND: agent \"nobody\" is not defined; `neuron agents list`") {
		t.Errorf("exit %d, want 15 with the hint:\n%s\n%s", code, out, errOut)
	}
}

// TestApprovalFlow: a run that stops for approval exits 4 with the
// command to run; approve refuses bad decisions, lists and decides; the
// watch then follows the workflow to its end.
func TestApprovalFlow(t *testing.T) {
	f := newFakeOrch()
	f.lockstep = true
	addr := serveOrch(t, f)
	code, out, errOut := runCLI(t, "run", "assistant", "please", "approve", "--addr", addr)
	if code != exitAwaitingApproval {
		t.Fatalf("exit %d, want %d:\n%s\n%s", code, exitAwaitingApproval, out, errOut)
	}
	m := regexp.MustCompile(`workflow (run-[0-9a-f]{12}) waits for approval of 1 tool call\(s\):\n  toolu_1  write\(\{"path":"notes.txt"\}\)  \[agent assistant, reason: policy\]\napprove:  neuron approve (run-[0-9a-f]{12}) --addr ` + regexp.QuoteMeta(addr) + "\n").FindStringSubmatch(out)
	if m == nil || m[1] != m[2] {
		t.Fatalf("no approval block with the command:\n%s", out)
	}
	id := m[1]
	if !strings.Contains(out, "I will write it.") || !strings.Contains(errOut, "waits for approval of 1 tool call(s); decide with `neuron approve "+id+"`") {
		t.Errorf("streamed text or the error line missing:\n%s\n%s", out, errOut)
	}

	code, out, _ = runCLI(t, "approvals", "list", "--addr", addr)
	if code != 0 || !regexp.MustCompile(id+` +toolu_1 +write +\{"path":"notes.txt"\} +assistant +1 `).MatchString(out) {
		t.Errorf("approvals list: exit %d:\n%s", code, out)
	}
	for _, bad := range [][]string{
		{"--call", "toolu_2"},
		{"--reject", "--edit", `{"path": "b"}`},
		{"--edit", `["not", "an", "object"]`},
	} {
		code, _, errOut := runCLI(t, append([]string{"approve", id, "--addr", addr}, bad...)...)
		if code != exitUsage {
			t.Errorf("approve %v: exit %d, want %d: %s", bad, code, exitUsage, errOut)
		}
	}
	if len(f.decisions) != 0 {
		t.Fatalf("a refused approve decided: %v", f.decisions)
	}
	// Watch from another terminal while the decision is made.
	wc, wout, werr := testCLI()
	watched := make(chan int)
	go func() { watched <- wc.main(context.Background(), []string{"workflows", "watch", id, "--addr", addr}) }()
	f.mu.Lock()
	for len(f.wfs[id].streams) == 0 || !f.wfs[id].caughtUp() {
		f.cond.Wait()
	}
	f.mu.Unlock()
	code, out, errOut = runCLI(t, "approve", id, "--edit", `{"path": "other.txt"}`, "--reason", "not there", "--addr", addr)
	if code != 0 || !strings.Contains(out, `toolu_1  approved with input {"path":"other.txt"}`) {
		t.Fatalf("approve: exit %d:\n%s\n%s", code, out, errOut)
	}
	d := f.decisions[id]
	if len(d) != 1 || !d[0].GetApproved() || d[0].GetEditedInput().GetStructValue().GetFields()["path"].GetStringValue() != "other.txt" || d[0].GetReason() != "not there" {
		t.Errorf("decisions %v", d)
	}
	code, out, errOut = <-watched, wout.String(), werr.String()
	if code != 0 {
		t.Fatalf("watch: exit %d:\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"1 tool call(s) wait for approval", "approval decision accepted", `→ write({"path":"other.txt"})`,
		"← wrote 5 bytes (13 bytes)", "workflow " + id + " COMPLETED", "answer (assistant):\n  approved Hello, world"} {
		if !strings.Contains(out, want) {
			t.Errorf("watch output lacks %q:\n%s", want, out)
		}
	}
	code, _, errOut = runCLI(t, "approve", id, "--addr", addr)
	if code != 19 || !strings.Contains(errOut, "waits for no approval") {
		t.Errorf("approve of an ended workflow: exit %d, want 19: %s", code, errOut)
	}
}

// TestRunWaitApproval: --wait-approval goes on after the decision to the
// workflow's end and prints its result.
func TestRunWaitApproval(t *testing.T) {
	f := newFakeOrch()
	f.lockstep = true
	addr := serveOrch(t, f)
	c, out, errOut := testCLI()
	done := make(chan int)
	go func() {
		done <- c.main(context.Background(), []string{"run", "assistant", "approve", "--wait-approval", "--workflow", "wf-w", "--addr", addr})
	}()
	f.mu.Lock()
	for f.wfs["wf-w"] == nil || len(f.wfs["wf-w"].wf.GetPendingApprovals()) == 0 {
		f.cond.Wait()
	}
	f.mu.Unlock()
	if code, o, e := runCLI(t, "approve", "wf-w", "--reject", "--reason", "no writes", "--addr", addr); code != 0 {
		t.Fatalf("approve: %d %s %s", code, o, e)
	}
	if code := <-done; code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"waiting for the decision", "approval decision accepted", "answer (assistant):\n  rejected (no writes) Hello, world"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
}

// TestApproveDecisions: every pending call is decided in one request.
func TestApproveDecisions(t *testing.T) {
	pending := []*orchestratorv1.PendingApproval{
		{ToolCall: &operatorv1.PendingToolCall{ToolUseId: "a", Name: "write", Input: writeInput}},
		{ToolCall: &operatorv1.PendingToolCall{ToolUseId: "b", Name: "shell", Input: structpb.NewStringValue("rm -rf /")}},
	}
	edit := structpb.NewStructValue(&structpb.Struct{})
	for _, tc := range []struct {
		name  string
		f     approveFlags
		edit  *structpb.Value
		want  string // decisions "a+ b-", or the error's text
		isErr bool
	}{
		{name: "all", want: "a+ b+"},
		{name: "reject all", f: approveFlags{reject: true}, want: "a- b-"},
		{name: "mixed", f: approveFlags{calls: listFlag{"a"}, rejects: listFlag{"b"}}, want: "a+ b-"},
		{name: "left undecided", f: approveFlags{calls: listFlag{"a"}}, isErr: true,
			want: `these would be left undecided: b (shell "rm -rf /"); add --call ID to decide them the same way, --reject-call ID to reject them, or name no call to decide all 2`},
		{name: "unknown", f: approveFlags{calls: listFlag{"c"}}, isErr: true, want: `does not wait on a call "c"; it waits on: a, b`},
		{name: "both", f: approveFlags{calls: listFlag{"a"}, rejects: listFlag{"a"}}, isErr: true, want: "both approved"},
		{name: "edit two", edit: edit, isErr: true, want: "--edit gives one call a new input, but 2 calls would be approved (a, b)"},
		{name: "edit one", f: approveFlags{calls: listFlag{"b"}, rejects: listFlag{"a"}}, edit: edit, want: "a- b+edited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, err := tc.f.decisions("wf", pending, tc.edit, "me")
			if tc.isErr {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %v, want one saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range ds {
				s := d.GetToolUseId()
				if d.GetApproved() {
					s += "+"
				} else {
					s += "-"
				}
				if d.GetEditedInput() != nil {
					s += "edited"
				}
				if d.GetDecidedBy() != "neuron approve (me)" {
					t.Errorf("decided_by %q", d.GetDecidedBy())
				}
				got = append(got, s)
			}
			if strings.Join(got, " ") != tc.want {
				t.Errorf("decisions %q, want %q", strings.Join(got, " "), tc.want)
			}
		})
	}
}

func TestTranscript(t *testing.T) {
	f := newFakeOrch()
	f.addEnded("wf-t")
	addr := serveOrch(t, f)
	code, out, errOut := runCLI(t, "workflows", "show", "wf-t", "--transcript", "--addr", addr)
	if code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"status     COMPLETED",
		"transcript:\n\n  step 1 · assistant · wf-t#1\n    input (USER):\n      what is layer0?\n",
		`    → read({"path":"notes.txt"})  [toolu_a]` + "\n      ← result, 120 bytes:\n        row\n",
		"        … 10 more line(s) (--json prints all of it)\n",
		"    output (COMPLETE):\n      asking the researcher\n",
		"      step 2 · researcher (depth 1, for wf-t#1) · wf-t#2\n        input (TASK):\n          find out\n",
		"  step 3 · assistant · wf-t#3\n",
		"    error: UNAVAILABLE: the model is down\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runCLI(t, "workflows", "show", "wf-t", "--transcript", "--json", "--addr", addr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 {
		t.Fatalf("--json: exit %d, %d lines, want 3:\n%s", code, len(lines), out)
	}
	for i, l := range lines {
		s := &orchestratorv1.TranscriptStep{}
		if err := protojson.Unmarshal([]byte(l), s); err != nil || s.GetStep() != uint64(i+1) {
			t.Errorf("line %d: %v, step %d", i+1, err, s.GetStep())
		}
	}
	code, _, errOut = runCLI(t, "workflows", "show", "wf-t", "--transcript", "--json", "--addr", addr, "--no-such")
	if code != exitUsage {
		t.Errorf("a bad flag: exit %d: %s", code, errOut)
	}
}

// TestChatPiped: chat reading lines from a pipe: an answer, an approval
// answered inline, Ctrl-C during a run (the workflow is canceled and the
// chat goes on), /cost, /history and /quit.
func TestChatPiped(t *testing.T) {
	f := newFakeOrch()
	f.lockstep = true
	addr := serveOrch(t, f)
	pr, pw := io.Pipe()
	sig := make(chan os.Signal, 1)
	c, out, _ := testCLI()
	c.stdin, c.interrupts = pr, sig
	done := make(chan int)
	go func() {
		done <- c.main(context.Background(), []string{"chat", "assistant", "--session", "s-1", "--addr", addr, "--state-addr", "127.0.0.1:1"})
	}()
	write := func(s string) {
		if _, err := io.WriteString(pw, s); err != nil {
			t.Fatal(err)
		}
	}
	write("hello\nplease approve\ny\n")
	write("slow\n")
	// Ctrl-C once the slow answer has begun.
	f.mu.Lock()
	for len(f.order) < 3 || len(f.wfs[f.order[2]].progress) == 0 || !f.wfs[f.order[2]].caughtUp() {
		f.cond.Wait()
	}
	slow := f.order[2]
	f.mu.Unlock()
	sig <- os.Interrupt
	write("/cost\n/history\n/quit\n")
	if code := <-done; code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	got := out.String()
	for _, want := range []string{
		"chat with assistant · session s-1 (go on later: neuron chat assistant --session s-1)",
		"you> Hello, world\n",
		"assistant asks before running 1 tool call(s):\n  write({\"path\":\"notes.txt\"})\n  approve? [y]es / [n]o / [e]dit: decision recorded",
		"→ write({\"path\":\"notes.txt\"})", "approved Hello, world\n",
		"^C canceling this answer (the chat goes on)", "(canceled)",
		"spent $0.03 in this chat (3 turn(s))",
		"this chat's turns:)\nyou: hello\nassistant: Hello, world\n",
		"session s-1 kept",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if len(f.cancels) != 1 || f.cancels[0] != slow {
		t.Errorf("cancels %v, want [%s]", f.cancels, slow)
	}
	for _, s := range f.starts {
		if s.GetInput().GetSessionId() != "s-1" || s.GetAgentId() != "assistant" {
			t.Errorf("a turn started without the session: %v", s)
		}
	}
}

// TestChatEditReject: an approval answered e runs the call with the
// input typed (a bad one is asked again), one answered n rejects it with
// the reason typed.
func TestChatEditReject(t *testing.T) {
	f := newFakeOrch()
	f.lockstep = true
	addr := serveOrch(t, f)
	c, out, _ := testCLI()
	c.stdin = strings.NewReader("approve this\ne\n[1, 2]\ne\n{\"path\": \"b.txt\"}\napprove that\nn\ntoo risky\n")
	c.interrupts = make(chan os.Signal)
	if code := c.main(context.Background(), []string{"chat", "assistant", "--addr", addr}); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	got := out.String()
	for _, want := range []string{"input as a JSON object:   not a JSON object; try again", `→ write({"path":"b.txt"})`,
		"approved Hello, world", "rejected (too risky) Hello, world", "session chat-"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if len(f.order) != 2 {
		t.Fatalf("%d turns, want 2", len(f.order))
	}
	d1, d2 := f.decisions[f.order[0]], f.decisions[f.order[1]]
	if len(d1) != 1 || !d1[0].GetApproved() || d1[0].GetEditedInput().GetStructValue().GetFields()["path"].GetStringValue() != "b.txt" {
		t.Errorf("edit: decisions %v", d1)
	}
	if len(d2) != 1 || d2[0].GetApproved() || d2[0].GetReason() != "too risky" || d2[0].GetDecidedBy() != "neuron chat" {
		t.Errorf("reject: decisions %v", d2)
	}
}
