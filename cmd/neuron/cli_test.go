package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
)

// TestCLI exercises the client commands against one `neuron up` (agents on
// the operator directly, so sessions work). Subtests run in order: later
// ones look at the workflows earlier ones made.
func TestCLI(t *testing.T) {
	t.Parallel()
	up := startUp(t, "--isolation", "none")
	if !strings.Contains(up.output(), "route     agents run on the operator service directly (--isolation none)") {
		t.Errorf("neuron up does not say where agents run:\n%s", up.output())
	}
	orch := []string{"--addr", up.orchestrator}
	st := []string{"--addr", up.state}
	run := func(t *testing.T, args ...string) result {
		t.Helper()
		return neuron(ctxFor(t), t, args...)
	}
	mustExit := func(t *testing.T, r result, code int) {
		t.Helper()
		if r.code != code {
			t.Fatalf("want exit %d, got:\n%s", code, r)
		}
	}

	var plainWF string
	t.Run("run plain", func(t *testing.T) {
		r := run(t, append([]string{"run", "assistant", "what", "is", "layer0?"}, orch...)...)
		mustExit(t, r, 0)
		m := regexp.MustCompile(`(?m)^dispatching assistant in workflow (run-[0-9a-f]{12})$`).FindStringSubmatch(r.stdout)
		if m == nil {
			t.Fatalf("no workflow id:\n%s", r)
		}
		plainWF = m[1]
		for _, want := range []string{
			"assistant    workflow started (agent assistant)",
			"assistant    operator call " + plainWF + "#1: COMPLETE, 1 effect(s), cost $0",
			"researcher   operator call " + plainWF + "#2: COMPLETE",
			"assistant    effect delegate applied: agent \"researcher\" ran (COMPLETE)",
			"assistant    effect write_memory applied: written (revision",
			"workflow completed: 3 operator call(s), spent $0, exit COMPLETE",
			"answer (assistant):\n  [scripted answer]",
			"model:    scripted",
			"tools:    write, write_memory (in the last operator call)",
			"cost:     $0 for the whole workflow",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("stdout lacks %q:\n%s", want, r)
			}
		}
		if strings.Contains(r.stdout, "\r") || strings.Contains(r.stdout, "\033[") {
			t.Errorf("piped output has terminal control characters:\n%q", r.stdout)
		}
	})

	t.Run("run json", func(t *testing.T) {
		r := run(t, append([]string{"run", "assistant", "hello", "--json"}, orch...)...)
		mustExit(t, r, 0)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		var types []string
		for i, l := range lines {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(l), &obj); err != nil || len(obj) != 1 {
				t.Fatalf("line %d is not one JSON object with one field: %q", i+1, l)
			}
			for k, v := range obj {
				switch k {
				case "event":
					ev := &lifecyclev1.LifecycleEvent{}
					if err := protojson.Unmarshal(v, ev); err != nil {
						t.Fatalf("line %d: not a LifecycleEvent: %v", i+1, err)
					}
					types = append(types, ev.GetObservable().GetEventType())
				case "progress":
					if err := protojson.Unmarshal(v, &orchestratorv1.StepProgress{}); err != nil {
						t.Fatalf("line %d: not a StepProgress: %v", i+1, err)
					}
				case "result":
					if i != len(lines)-1 {
						t.Errorf("the result is line %d of %d, want last", i+1, len(lines))
					}
					resp := &orchestratorv1.DispatchResponse{}
					if err := protojson.Unmarshal(v, resp); err != nil {
						t.Fatalf("not a DispatchResponse: %v", err)
					}
					if len(resp.GetEffects()) != 2 || !resp.GetEffects()[0].GetApplied() || !resp.GetEffects()[1].GetApplied() {
						t.Errorf("effects %v, want 2 applied", resp.GetEffects())
					}
					if !strings.HasPrefix(resp.GetOutput().GetMessage().GetBlocks()[0].GetText().GetText(), "[scripted answer]") {
						t.Errorf("answer %v", resp.GetOutput().GetMessage())
					}
				default:
					t.Fatalf("line %d: unexpected field %q", i+1, k)
				}
			}
		}
		// Every event of the workflow's log, from its start to its end.
		if len(types) == 0 || types[0] != "orchestrator.workflow.started" || types[len(types)-1] != "orchestrator.workflow.completed" {
			t.Errorf("event types %q: want orchestrator.workflow.started first and orchestrator.workflow.completed last", types)
		}
		if n := strings.Count(strings.Join(types, " "), eventDispatchDone); n != 3 {
			t.Errorf("%d %s events, want 3", n, eventDispatchDone)
		}
	})

	t.Run("run quiet with a session", func(t *testing.T) {
		r := run(t, append([]string{"run", "--session", "s1", "--quiet", "assistant", "hi"}, orch...)...)
		mustExit(t, r, 0)
		if !strings.HasPrefix(r.stdout, "[scripted answer]") || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("--quiet: want the answer only:\n%s", r)
		}
		// The operator recorded the turn in the session's history.
		l := run(t, append([]string{"state", "list", "--session", "s1", "conversation/"}, st...)...)
		mustExit(t, l, 0)
		if !strings.Contains(l.stdout, "conversation/") {
			t.Errorf("no conversation history in session s1:\n%s", l)
		}
	})

	t.Run("run not completed", func(t *testing.T) {
		// The researcher has max_turns 4; this script wants 5.
		turn := `{"tool_calls": [{"name": "write", "arguments": {"path": "x.txt", "content": "x"}}]}`
		script := `{"scripted": {"turns": [` + strings.Repeat(turn+",", 4) + turn + `]}}`
		r := run(t, append([]string{"run", "researcher", "loop", "--metadata", script}, orch...)...)
		mustExit(t, r, exitNotCompleted)
		if !strings.Contains(r.stderr, "ended without completing: exit MAX_TURNS") {
			t.Errorf("stderr does not say why:\n%s", r)
		}
	})

	t.Run("workflows list", func(t *testing.T) {
		r := run(t, append([]string{"workflows", "list"}, orch...)...)
		mustExit(t, r, 0)
		if !regexp.MustCompile(`(?m)^` + plainWF + ` +COMPLETED +assistant +3 +\$0 `).MatchString(r.stdout) {
			t.Errorf("no COMPLETED row for %s:\n%s", plainWF, r)
		}
		j := run(t, append([]string{"workflows", "list", "--json", "--status", "completed"}, orch...)...)
		mustExit(t, j, 0)
		for _, l := range strings.Split(strings.TrimSpace(j.stdout), "\n") {
			w := &orchestratorv1.Workflow{}
			if err := protojson.Unmarshal([]byte(l), w); err != nil || w.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
				t.Errorf("--json --status completed: line %q (%v)", l, err)
			}
		}
	})

	t.Run("workflows show", func(t *testing.T) {
		r := run(t, append([]string{"workflows", "show", plainWF}, orch...)...)
		mustExit(t, r, 0)
		for _, want := range []string{"status     COMPLETED", "steps      3 operator call(s)", "model      scripted (not a language model)",
			"last output:\n  [scripted answer]", "steps:"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("stdout lacks %q:\n%s", want, r)
			}
		}
		if !regexp.MustCompile(`(?m)^  2 +  researcher +TASK +done +COMPLETE +\$0 +0$`).MatchString(r.stdout) {
			t.Errorf("no step 2 of the delegated researcher:\n%s", r)
		}
		j := run(t, append([]string{"workflows", "show", plainWF, "--json"}, orch...)...)
		mustExit(t, j, 0)
		var obj struct {
			Workflow json.RawMessage `json:"workflow"`
			Steps    []step          `json:"steps"`
		}
		if err := json.Unmarshal([]byte(j.stdout), &obj); err != nil || len(obj.Steps) != 3 {
			t.Fatalf("--json: %v, %d steps:\n%s", err, len(obj.Steps), j)
		}
		w := &orchestratorv1.Workflow{}
		if err := protojson.Unmarshal(obj.Workflow, w); err != nil || w.GetWorkflowId() != plainWF {
			t.Errorf("--json workflow: %v %v", w, err)
		}
	})

	t.Run("workflows signal and cancel an ended workflow", func(t *testing.T) {
		r := run(t, append([]string{"workflows", "signal", plainWF, "user_feedback", `{"note": "late"}`}, orch...)...)
		mustExit(t, r, exitStatusBase+9) // FAILED_PRECONDITION: it has ended
		if !strings.HasPrefix(r.stderr, "neuron: FAILED_PRECONDITION: ") {
			t.Errorf("stderr: %q", r.stderr)
		}
		c := run(t, append([]string{"workflows", "cancel", plainWF}, orch...)...)
		mustExit(t, c, 0)
		if c.stdout != "workflow "+plainWF+": COMPLETED\n" {
			t.Errorf("cancelling an ended workflow returns it unchanged; got %q", c.stdout)
		}
	})

	t.Run("state", func(t *testing.T) {
		p := run(t, append([]string{"state", "put", "notes/today", `{"text": "the quick brown fox"}`, "--session", "cli"}, st...)...)
		mustExit(t, p, 0)
		if !regexp.MustCompile(`^notes/today written in scope session:"cli": revision \d+\n$`).MatchString(p.stdout) {
			t.Errorf("put: %q", p.stdout)
		}
		mustExit(t, run(t, append([]string{"state", "put", "--session", "cli", "notes/raw", "plain words", "--text"}, st...)...), 0)
		g := run(t, append([]string{"state", "get", "notes/today", "--session", "cli"}, st...)...)
		mustExit(t, g, 0)
		if g.stdout != "{\n  \"text\": \"the quick brown fox\"\n}\n" {
			t.Errorf("get: %q", g.stdout)
		}
		gj := run(t, append([]string{"state", "get", "notes/raw", "--session", "cli", "--json"}, st...)...)
		mustExit(t, gj, 0)
		rr := &statev1.ReadResponse{}
		if err := protojson.Unmarshal([]byte(gj.stdout), rr); err != nil || rr.GetValue().GetStringValue() != "plain words" || rr.GetRevision() == 0 {
			t.Errorf("get --json: %q (%v)", gj.stdout, err)
		}
		l := run(t, append([]string{"state", "list", "notes/", "--session", "cli"}, st...)...)
		mustExit(t, l, 0)
		if !regexp.MustCompile(`(?s)KEY +REVISION\nnotes/raw +\d+\nnotes/today +\d+\n$`).MatchString(l.stdout) {
			t.Errorf("list: %q", l.stdout)
		}
		s := run(t, append([]string{"state", "search", "brown", "fox", "--session", "cli"}, st...)...)
		mustExit(t, s, 0)
		if !regexp.MustCompile(`(?m)^notes/today +[0-9.]+ +\d+ +.*fox`).MatchString(s.stdout) {
			t.Errorf("search: %q", s.stdout)
		}
		// What the demo agent remembered, in the global scope.
		m := run(t, append([]string{"state", "get", "--global", memoryKey}, st...)...)
		mustExit(t, m, 0)
		if !strings.Contains(m.stdout, `"summary": "delegated research on the layer0 protocols and wrote notes.md"`) {
			t.Errorf("the assistant's memory: %q", m.stdout)
		}
		// Scopes are disjoint.
		x := run(t, append([]string{"state", "get", "notes/today", "--global"}, st...)...)
		mustExit(t, x, exitStatusBase+5)
		if !strings.HasPrefix(x.stderr, "neuron: NOT_FOUND: ") || strings.Count(x.stderr, "\n") != 1 {
			t.Errorf("a missing key: want one NOT_FOUND line, got %q", x.stderr)
		}
	})

	t.Run("events after", func(t *testing.T) {
		r := run(t, append([]string{"events", "--after", "0", "--workflow", plainWF, "--count", "3"}, orch...)...)
		mustExit(t, r, 0)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 3 {
			t.Fatalf("--count 3: %d lines:\n%s", len(lines), r)
		}
		for i, want := range []string{"dispatch requested by neuron run", "workflow started (agent assistant)", "operator call " + plainWF + "#1"} {
			if !regexp.MustCompile(`^\d+  \d\d:\d\d:\d\d\.\d{3}  ` + plainWF + `  assistant  ` + regexp.QuoteMeta(want)).MatchString(lines[i]) {
				t.Errorf("line %d %q: want %q", i+1, lines[i], want)
			}
		}
		// --after skips what came before: start after the first event.
		seq := strings.Fields(lines[0])[0]
		j := run(t, append([]string{"events", "--after", seq, "--workflow", plainWF, "--count", "1", "--json"}, orch...)...)
		mustExit(t, j, 0)
		resp := &lifecyclev1.SubscribeResponse{}
		if err := protojson.Unmarshal([]byte(j.stdout), resp); err != nil {
			t.Fatalf("--json: %v: %q", err, j.stdout)
		}
		if got := resp.GetEvent().GetObservable().GetEventType(); got != "orchestrator.workflow.started" {
			t.Errorf("the event after %s is %q, want orchestrator.workflow.started", seq, got)
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			args   []string
			code   int
			prefix string
		}{
			{"unknown agent", append([]string{"run", "nobody", "hi"}, orch...), exitStatusBase + 5, "neuron: NOT_FOUND: agent \"nobody\" is not in the agent registry"},
			{"unknown workflow", append([]string{"workflows", "show", "no-such-workflow"}, orch...), exitStatusBase + 5, "neuron: NOT_FOUND: "},
			{"state at the orchestrator", []string{"state", "get", "k", "--global", "--addr", up.orchestrator}, exitStatusBase + 12, "neuron: UNIMPLEMENTED: "},
			{"no scope", append([]string{"state", "get", "k"}, st...), exitUsage, "neuron state get: name a scope"},
			{"two scopes", append([]string{"state", "list", "--global", "--session", "s"}, st...), exitUsage, "neuron state list: name one scope"},
			{"no task", append([]string{"run", "assistant"}, orch...), exitUsage, "neuron run: want AGENT and TASK"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := run(t, tc.args...)
				mustExit(t, r, tc.code)
				if !strings.HasPrefix(r.stderr, tc.prefix) || strings.Count(r.stderr, "\n") != 1 {
					t.Errorf("stderr: want one line starting %q, got %q", tc.prefix, r.stderr)
				}
			})
		}
		// --json reports the error as JSON too, on the last line (after the
		// run's own neuron.run.requested event).
		r := run(t, append([]string{"run", "nobody", "hi", "--json"}, orch...)...)
		mustExit(t, r, exitStatusBase+5)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		var obj struct {
			Error struct {
				Code     string `json:"code"`
				ExitCode int    `json:"exit_code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &obj); err != nil || obj.Error.Code != "NOT_FOUND" || obj.Error.ExitCode != 15 {
			t.Errorf("--json error: %q (%v)", r.stdout, err)
		}
	})
}

// TestNothingListening checks the error when no service answers: one
// line, UNAVAILABLE, exit 24.
func TestNothingListening(t *testing.T) {
	t.Parallel()
	addr := refusingAddr(t)
	for _, args := range [][]string{
		{"run", "assistant", "hi", "--addr", addr},
		{"workflows", "list", "--addr", addr},
		{"state", "list", "--global", "--addr", addr},
		{"events", "--addr", addr},
	} {
		t.Run(args[0], func(t *testing.T) {
			r := neuron(ctxFor(t), t, args...)
			if r.code != exitStatusBase+14 {
				t.Fatalf("want exit 24, got:\n%s", r)
			}
			want := "neuron: UNAVAILABLE: cannot reach the "
			if !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, addr+": connection refused; is `neuron up` running?") ||
				strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("stderr: want one line %q..., got %q", want, r.stderr)
			}
		})
	}
}
