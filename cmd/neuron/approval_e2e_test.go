//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// servicePIDs returns the pids of the processes running binary name
// with dataDir on their command line: the children of one neuron up.
func servicePIDs(t *testing.T, name, dataDir string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(cmdline, []byte{0})
		if filepath.Base(string(args[0])) == name && bytes.Contains(cmdline, []byte(dataDir)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// The done-when of issue 21: a run streams and stops before a tool call
// that needs approval; the orchestrator and the operator are SIGKILLed
// while it waits; after a restart the call is approved from the CLI,
// the tool runs, the workflow completes, and its full transcript shows.
func TestApprovalAcrossSIGKILL(t *testing.T) {
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
  instructions: You keep notes.
  tools: {builtin: [write]}
  toolApprovals: {write: APPROVAL_POLICY_ALWAYS}
  metadata:
    scripted:
      turns:
      - text: I will write the notes now.
        tool_calls: [{name: write, arguments: {path: notes.md, content: "hello notes"}}]
      - text: The notes are written.
  route: {operator: {address: %s}}
`, setup.operator)
	if err := os.WriteFile(file, []byte(def), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := cli("agents", "apply", "-f", file); r.code != 0 {
		t.Fatalf("apply:\n%s", r)
	}
	r := cli("run", "careful", "keep notes")
	if r.code != exitAwaitingApproval || !strings.Contains(r.stdout, "I will write the notes now.") || !strings.Contains(r.stdout, "write(") {
		t.Fatalf("run: want exit %d with the streamed text and the pending write:\n%s", exitAwaitingApproval, r)
	}
	m := regexp.MustCompile(`neuron approve (\S+)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("run did not print the approve command:\n%s", r)
	}
	id := m[1]
	workspace := filepath.Join(setup.dataDir, "operator", "workspace")
	if found := findFile(t, workspace, "notes.md"); found != "" {
		t.Fatalf("the tool ran before its approval: %s", found)
	}

	// SIGKILL the orchestrator and the operator while the workflow waits.
	up.crashed = true
	for _, name := range []string{"orchestrator", "operator"} {
		pids := servicePIDs(t, name, setup.dataDir)
		if len(pids) != 1 {
			t.Fatalf("%s processes of this neuron up: %v", name, pids)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	select { // neuron up sees them die and stops the rest
	case <-up.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("neuron up did not stop after its services were killed:\n%s", up.output())
	}
	<-up.read

	up = startUpIn(t, setup, nil, "--isolation", "none")
	r = cli("approvals", "list")
	if r.code != 0 || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "write") {
		t.Fatalf("approvals list after the restart:\n%s", r)
	}
	if r = cli("approve", id); r.code != 0 {
		t.Fatalf("approve:\n%s", r)
	}
	r = cli("workflows", "watch", id)
	if r.code != 0 || !strings.Contains(r.stdout, "The notes are written.") {
		t.Fatalf("watch after the approval:\n%s", r)
	}
	found := findFile(t, workspace, "notes.md")
	if found == "" {
		t.Fatalf("the approved write did not run: no notes.md under %s", workspace)
	}
	if b, _ := os.ReadFile(found); string(b) != "hello notes" {
		t.Fatalf("notes.md = %q", b)
	}
	r = cli("workflows", "show", id, "--transcript")
	for _, want := range []string{"keep notes", "write", "notes.md", "I will write the notes now.", "The notes are written."} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("the transcript lacks %q:\n%s", want, r)
		}
	}
}

// findFile returns the path of a file called name under dir, or "".
func findFile(t *testing.T, dir, name string) string {
	t.Helper()
	var found string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == name {
			found = p
		}
		return nil
	})
	return found
}
