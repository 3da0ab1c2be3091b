package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSteerThroughUp: against `neuron up`, `neuron run --wait-approval`
// of an agent whose write calls need approval waits while another
// terminal lists the call, is refused a decision naming no pending call,
// and approves it; the run then goes on to its end and prints the
// answer. (TestApprovalAcrossSIGKILL covers the crash, watch and the
// transcript.)
func TestSteerThroughUp(t *testing.T) {
	t.Parallel()
	setup := newUpSetup(t)
	startUpIn(t, setup, nil, "--isolation", "none")
	orch := []string{"--addr", setup.orchestrator}
	cli := func(args ...string) result {
		t.Helper()
		return neuron(ctxFor(t), t, append(args, orch...)...)
	}
	file := filepath.Join(t.TempDir(), "careful.yaml")
	def := fmt.Sprintf(`name: careful
definition:
  instructions: You write files only when a person agrees.
  tools: {builtin: [read, write]}
  toolApprovals: {write: APPROVAL_POLICY_ALWAYS}
  limits: {maxTurns: 4}
  route: {operator: {address: %s}}
`, setup.operator)
	if err := os.WriteFile(file, []byte(def), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := cli("agents", "apply", "-f", file); r.code != 0 {
		t.Fatalf("apply:\n%s", r)
	}
	const id = "steer-wait-1"
	script := `{"scripted": {"turns": [{"tool_calls": [{"name": "write", "arguments": {"path": "x.txt", "content": "hi"}}]}, {"text": "saved it"}]}}`
	ran := make(chan result, 1)
	ctx := ctxFor(t)
	go func() {
		ran <- neuron(ctx, t, append([]string{"run", "careful", "save x.txt", "--metadata", script, "--workflow", id, "--wait-approval"}, orch...)...)
	}()
	// Another terminal: wait until the call is listed.
	for {
		r := cli("approvals", "list", "--workflow", id)
		if r.code != 0 && r.code != exitStatusBase+5 { // NOT_FOUND: not started yet
			t.Fatalf("approvals list:\n%s", r)
		}
		if regexp.MustCompile(id + ` +\S+ +write +\{"content":"hi","path":"x.txt"\} +careful `).MatchString(r.stdout) {
			break
		}
		select {
		case r := <-ran:
			t.Fatalf("run ended before the call was approved:\n%s", r)
		case <-ctx.Done():
			t.Fatal("the call was never listed")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if r := cli("approve", id, "--call", "no-such-call"); r.code != exitUsage || !strings.Contains(r.stderr, "it waits on:") {
		t.Errorf("approve of an unknown call: want exit 2 naming the pending ones:\n%s", r)
	}
	if r := cli("approve", id, "--reason", "fine"); r.code != 0 || !strings.Contains(r.stdout, "approved") {
		t.Fatalf("approve:\n%s", r)
	}
	r := <-ran
	if r.code != 0 {
		t.Fatalf("run --wait-approval: want exit 0 after the approval:\n%s", r)
	}
	for _, want := range []string{
		"workflow " + id + " waits for approval of 1 tool call(s):",
		`write({"content":"hi","path":"x.txt"})`,
		"waiting for the decision",
		"the workflow resumes",
		"answer (careful):",
		"exit:     COMPLETE (workflow " + id + ")",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("run's stdout lacks %q:\n%s", want, r)
		}
	}
	// The resumed call ran while the run watched: its text streamed in
	// before the answer block.
	if streamed, _, _ := strings.Cut(r.stdout, "\nanswer (careful):"); !strings.Contains(streamed, "\n[scripted model]") {
		t.Errorf("the resumed call's text was not streamed before the answer:\n%s", r)
	}
	if r := cli("approve", id); r.code != exitStatusBase+9 || !strings.Contains(r.stderr, "waits for no approval") {
		t.Errorf("approve of a workflow that waits for nothing: want exit 19:\n%s", r)
	}
}
