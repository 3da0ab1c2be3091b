package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSteerThroughUp: against `neuron up`, a run of an agent whose write
// calls need approval stops and exits 4 with the command to run; after a
// restart of every service the call is listed, approved from the CLI,
// and the workflow goes on to its end, which workflows watch follows and
// the transcript shows.
func TestSteerThroughUp(t *testing.T) {
	t.Parallel()
	setup := newUpSetup(t)
	up := startUpIn(t, setup, nil, "--isolation", "none")
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
	script := `{"scripted": {"turns": [{"tool_calls": [{"name": "write", "arguments": {"path": "x.txt", "content": "hi"}}]}, {"text": "saved it"}]}}`
	r := cli("run", "careful", "save x.txt", "--metadata", script)
	if r.code != exitAwaitingApproval {
		t.Fatalf("run: want exit %d:\n%s", exitAwaitingApproval, r)
	}
	m := regexp.MustCompile(`(?m)^dispatching careful in workflow (run-[0-9a-f]{12})$`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no workflow id:\n%s", r)
	}
	id := m[1]
	for _, want := range []string{
		"workflow " + id + " waits for approval of 1 tool call(s):",
		`write({"content":"hi","path":"x.txt"})`,
		"approve:  neuron approve " + id + " --addr " + setup.orchestrator,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("run's stdout lacks %q:\n%s", want, r)
		}
	}

	// Every service restarts while the workflow waits.
	up.stop(t)
	startUpIn(t, setup, nil, "--isolation", "none")

	r = cli("approvals", "list")
	if r.code != 0 || !regexp.MustCompile(id+` +\S+ +write +\{"content":"hi","path":"x.txt"\} +careful `).MatchString(r.stdout) {
		t.Fatalf("approvals list after the restart:\n%s", r)
	}
	if r = cli("approve", id, "--call", "no-such-call"); r.code != exitUsage || !strings.Contains(r.stderr, "it waits on:") {
		t.Errorf("approve of an unknown call: want exit 2 naming the pending ones:\n%s", r)
	}
	if r = cli("approve", id, "--reason", "fine"); r.code != 0 || !strings.Contains(r.stdout, "approved") {
		t.Fatalf("approve:\n%s", r)
	}
	r = cli("workflows", "watch", id)
	if r.code != 0 {
		t.Fatalf("watch: want exit 0:\n%s", r)
	}
	for _, want := range []string{"1 tool call(s) wait for approval", "accepted", "the workflow resumes", "workflow " + id + " COMPLETED: 2 operator call(s)", "answer (careful):"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("watch lacks %q:\n%s", want, r)
		}
	}
	if n := strings.Count(r.stdout, "the workflow resumes"); n != 1 {
		t.Errorf("the decision is shown %d times, want once:\n%s", n, r)
	}
	r = cli("workflows", "show", id, "--transcript")
	if r.code != 0 {
		t.Fatalf("show --transcript:\n%s", r)
	}
	for _, want := range []string{"transcript:", "input (USER):\n      save x.txt", "output (SUSPENDED)",
		`→ write({"content":"hi","path":"x.txt"})`, "← result, 26 bytes", `Created "x.txt" (2 bytes).`, "output (COMPLETE):"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the transcript lacks %q:\n%s", want, r)
		}
	}
	if r = cli("approve", id); r.code != exitStatusBase+9 {
		t.Errorf("approve of a workflow that waits for nothing: want exit 19:\n%s", r)
	}
}
