package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
)

// TestApprovalAcrossProcesses runs the real binary one-shot: one process
// suspends on a write that needs approval and exits; a second process,
// sharing only $NEURON_RESUME_KEY, resumes the token with an approval
// and the write happens; a process with another key refuses the token.
// The operator keeps nothing between the two: the token carries it all.
func TestApprovalAcrossProcesses(t *testing.T) {
	bin := buildOperator(t)
	ws := t.TempDir()
	const script = `"metadata":{"scripted":{"turns":[` +
		`{"text":"writing","tool_calls":[{"name":"write","arguments":{"path":"approved.txt","content":"yes\n"}}]},` +
		`{"text":"written"}]}}`
	const config = `"config":{"toolApprovals":{"write":"TOOL_APPROVAL_ALWAYS"}}`
	oneShot := func(t *testing.T, key, stdin string) (int, string) {
		t.Helper()
		cmd := exec.Command(bin, "--one-shot", "--dev", "--model", "scripted", "--workspace", ws, "--log-level", "error")
		cmd.Env = append(os.Environ(), "NEURON_RESUME_KEY="+key)
		cmd.Stdin = strings.NewReader(stdin)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String() + stderr.String()
	}
	key := strings.Repeat("ab", 32)

	code, out := oneShot(t, key, `{"message":{"blocks":[{"text":{"text":"write it"}}]},`+config+`,`+script+`}`)
	if code != 3 {
		t.Fatalf("exit %d, want 3 (suspended): %s", code, out)
	}
	first := &operatorv1.OperatorOutput{}
	if err := protojson.Unmarshal([]byte(strings.TrimSpace(strings.SplitN(out, "\n", 2)[0])), first); err != nil {
		t.Fatalf("stdout is not an OperatorOutput: %v\n%s", err, out)
	}
	s := first.GetExitReason().GetSuspension()
	if first.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_SUSPENDED || len(s.GetToolCalls()) != 1 || s.GetToolCalls()[0].GetName() != "write" {
		t.Fatalf("exit %v", first.GetExitReason())
	}
	if _, err := os.Stat(filepath.Join(ws, "approved.txt")); !os.IsNotExist(err) {
		t.Fatalf("the write ran before approval (%v)", err)
	}
	resume := `{"message":{"blocks":[{"text":{"text":"approved"}}]},` + config + `,` + script +
		`,"resume":{"resumeToken":"` + s.GetResumeToken() + `","toolDecisions":[{"toolUseId":"` + s.GetToolCalls()[0].GetToolUseId() + `","approved":true,"decidedBy":"alice"}]}}`

	code, out = oneShot(t, strings.Repeat("cd", 32), resume)
	if code != 13 || !strings.Contains(out, "resume_token") {
		t.Fatalf("another key: exit %d, want 13 (INVALID_ARGUMENT): %s", code, out)
	}
	if _, err := os.Stat(filepath.Join(ws, "approved.txt")); !os.IsNotExist(err) {
		t.Fatalf("a refused resume wrote the file (%v)", err)
	}

	code, out = oneShot(t, key, resume)
	if code != 0 || !strings.Contains(out, "written") {
		t.Fatalf("resume: exit %d, want 0: %s", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "approved.txt")); err != nil || string(b) != "yes\n" {
		t.Fatalf("approved write: %q, %v", b, err)
	}
}
