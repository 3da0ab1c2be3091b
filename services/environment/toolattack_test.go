package environment_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// The file-tool attacks drive the operator's read and write tools (not
// bash) against the process backend. A single call goes through the
// scripted model's "/tool <name> {...}" rule, whose answer quotes the
// tool result; an attack that needs a symbolic link in the workspace
// first runs a script (input metadata "scripted") of one turn per tool
// call, and is judged by the output's sub_dispatches records.

// tool runs one call of the operator's tool name with args and returns
// the scripted model's final text ("[scripted model] <name> returned: ..."
// or "... failed: ...").
func (e *env) tool(t *testing.T, name string, args map[string]any) (string, *environmentv1.RunResponse) {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.run(t, "/tool "+name+" "+string(b), nil)
	if err != nil {
		t.Fatalf("Run(%s %s): %v", name, b, err)
	}
	return text(resp), resp
}

// call is one tool call of a scripted turn.
type call struct {
	name string
	args map[string]any
}

// script runs the calls one per turn, in order, as the scripted model's
// script, ending with the text "done", and returns the response after
// checking that every call left a record.
func (e *env) script(t *testing.T, calls ...call) *environmentv1.RunResponse {
	t.Helper()
	var turns []any
	for _, c := range calls {
		turns = append(turns, map[string]any{"tool_calls": []any{map[string]any{"name": c.name, "arguments": c.args}}})
	}
	turns = append(turns, map[string]any{"text": "done"})
	s, err := structpb.NewStruct(map[string]any{"turns": turns})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := e.client.Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{
			Message:  content.Text("Run the script."),
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"scripted": structpb.NewStructValue(s)}},
		},
		Spec: &environmentv1.EnvironmentSpec{},
	})
	if err != nil {
		t.Fatalf("Run(script): %v", err)
	}
	if got := text(resp); got != "done" {
		t.Fatalf("the script did not play to its end: final text %q", got)
	}
	if n := len(resp.GetOutput().GetMetadata().GetSubDispatches()); n != len(calls) {
		t.Fatalf("%d tool calls recorded, want %d: %v", n, len(calls), resp.GetOutput().GetMetadata())
	}
	return resp
}

// record is the sub-dispatch record of the i-th call of resp.
func record(resp *environmentv1.RunResponse, i int) *operatorv1.SubDispatchRecord {
	return resp.GetOutput().GetMetadata().GetSubDispatches()[i]
}

// leaks reports whether secret appears anywhere in resp.
func leaks(resp *environmentv1.RunResponse, secret string) bool {
	b, _ := proto.Marshal(resp)
	j, _ := protojson.Marshal(resp)
	return strings.Contains(string(b), secret) || strings.Contains(string(j), secret)
}

func bashCall(command string) call {
	return call{"bash", map[string]any{"command": command, "timeout_seconds": 30}}
}

func readCall(path string) call { return call{"read", map[string]any{"path": path}} }

// up climbs from any workspace to the root: "up + /abs/path" is a
// relative path naming /abs/path.
const up = "../../../../../../../../../../../.."

// The read tool cannot read outside the workspace: not through "..", not
// by an absolute path, not through a symbolic or hard link made inside
// the workspace. Each attempt is a tool error, and the secret never
// comes back.
func TestAttackReadTool(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	const marker, homeMarker = "READTOOL-SECRET-8843", "READTOOL-HOME-SECRET-2209"
	outside := secretFile(t, os.TempDir(), marker)
	home, _ := os.UserHomeDir()
	inHome := secretFile(t, home, homeMarker)

	// One call through the "/tool" rule, which quotes the tool result.
	for _, tc := range []struct{ name, path, secret string }{
		{"dot-dot to a file outside", up + outside, marker},
		{"dot-dot to etc shadow", up + "/etc/shadow", "root:"},
		{"dot-dot to a home directory key", up + inHome, homeMarker},
		{"absolute path outside", outside, marker},
		{"absolute etc shadow", "/etc/shadow", "root:"},
		{"absolute home directory key", inHome, homeMarker},
		{"absolute pid 1 environment", "/proc/1/environ", "PATH="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, resp := e.tool(t, "read", map[string]any{"path": tc.path})
			if !strings.HasPrefix(got, "[scripted model] read failed:") {
				t.Errorf("read of %s did not fail: %q", tc.path, got)
			}
			if r := record(resp, 0); r.GetName() != "read" || r.GetSuccess() {
				t.Errorf("sub-dispatch record %v, want a failed read", r)
			}
			if leaks(resp, tc.secret) {
				t.Errorf("%q came back: %q", tc.secret, got)
			}
		})
	}

	// A link made inside the workspace (by the bash tool, in the same
	// invocation), then read with the read tool.
	for _, tc := range []struct {
		name, link, read, secret string
	}{
		{"absolute symlink to a file outside", "ln -s " + outside + " link", "link", marker},
		{"relative symlink to a file outside", "ln -s " + up + outside + " link", "link", marker},
		{"symlink to etc shadow", "ln -s /etc/shadow link", "link", "root:"},
		{"relative symlink to etc shadow", "ln -s " + up + "/etc/shadow link", "link", "root:"},
		{"symlink to a directory outside", "ln -s " + filepath.Dir(outside) + " dir", "dir/" + filepath.Base(outside), marker},
		{"symlink to a home directory key", "ln -s " + inHome + " link", "link", homeMarker},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.script(t, bashCall(tc.link), readCall(tc.read))
			if r := record(resp, 0); !r.GetSuccess() {
				t.Fatalf("could not make the link in the workspace: %v", r)
			}
			r := record(resp, 1)
			if r.GetName() != "read" || r.GetSuccess() {
				t.Errorf("read through the link did not fail: %v", r)
			}
			if !strings.Contains(r.GetError(), "escapes the workspace") {
				t.Errorf("read failed for another reason than the escape: %q", r.GetError())
			}
			if leaks(resp, tc.secret) || strings.Contains(e.logs.String(), tc.secret) {
				t.Errorf("%q came back in the response or the service's logs", tc.secret)
			}
		})
	}

	// A hard link looks like an ordinary file of the workspace to the
	// read tool; only the sandbox keeps it from being made (Landlock
	// refuses linking a file from outside its hierarchies: EXDEV).
	t.Run("hard link to a file outside", func(t *testing.T) {
		if !sameDevice(t, e.workDir, outside) {
			t.Skipf("%s and %s are on different filesystems: a hard link could not be made anyway", e.workDir, outside)
		}
		resp := e.script(t, bashCall("ln "+outside+" hard && echo LINKED"), readCall("hard"))
		if r := record(resp, 0); r.GetSuccess() {
			t.Errorf("the sandbox let a hard link to a file outside be made: %v", r)
		}
		if r := record(resp, 1); r.GetSuccess() {
			t.Errorf("read through a hard link succeeded: %v", r)
		}
		if leaks(resp, marker) || strings.Contains(e.logs.String(), marker) {
			t.Errorf("%q came back in the response or the service's logs", marker)
		}
	})

	// Control: the same script reads a file of the workspace, directly
	// and through a symbolic link inside it.
	t.Run("control: inside the workspace", func(t *testing.T) {
		resp := e.script(t, bashCall("echo INSIDE-1234 > notes.txt && ln -s notes.txt link"), readCall("link"), readCall("notes.txt"))
		for i := range 3 {
			if r := record(resp, i); !r.GetSuccess() {
				t.Errorf("call %d failed inside the workspace: %v", i, r)
			}
		}
		got, _ := e.tool(t, "read", map[string]any{"path": "missing.txt"})
		if !strings.Contains(got, "does not exist in the workspace") {
			t.Errorf("read of a missing workspace file: %q", got)
		}
	})
}

// The write and edit tools cannot change anything outside the workspace:
// not through "..", an absolute path, or a symbolic link to a directory
// or a file outside.
func TestAttackWriteTool(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	const marker = "WRITETOOL-SECRET-6120"
	victim := secretFile(t, os.TempDir(), marker)
	dir := filepath.Dir(victim)
	write := func(path string) map[string]any { return map[string]any{"path": path, "content": "pwned\n"} }

	for _, tc := range []struct {
		name, tool string
		args       map[string]any
	}{
		{"write through dot-dot", "write", write(up + dir + "/pwned-dotdot")},
		{"write an absolute path", "write", write(dir + "/pwned-absolute")},
		{"overwrite a file outside through dot-dot", "write", write(up + victim)},
		{"overwrite a file outside by its absolute path", "write", write(victim)},
		{"edit a file outside through dot-dot", "edit", map[string]any{"path": up + victim, "old_string": marker, "new_string": "pwned"}},
		{"edit a file outside by its absolute path", "edit", map[string]any{"path": victim, "old_string": marker, "new_string": "pwned"}},
		{"write into the home directory", "write", write(filepath.Join(os.Getenv("HOME"), ".neuron-attack-pwned"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, resp := e.tool(t, tc.tool, tc.args)
			if !strings.HasPrefix(got, "[scripted model] "+tc.tool+" failed:") {
				t.Errorf("%s was not refused: %q", tc.tool, got)
			}
			if r := record(resp, 0); r.GetSuccess() {
				t.Errorf("sub-dispatch record %v, want a failure", r)
			}
		})
	}
	for _, tc := range []struct{ name, link, path string }{
		{"write through a symlink to a directory outside", "ln -s " + dir + " out", "out/pwned-link"},
		{"write through a relative symlink to a directory outside", "ln -s " + up + dir + " out", "out/pwned-relative"},
		{"overwrite a file outside through a symlink", "ln -s " + victim + " victim", "victim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.script(t, bashCall(tc.link), call{"write", write(tc.path)})
			if r := record(resp, 0); !r.GetSuccess() {
				t.Fatalf("could not make the link in the workspace: %v", r)
			}
			if r := record(resp, 1); r.GetSuccess() || !strings.Contains(r.GetError(), "escapes the workspace") {
				t.Errorf("write through the link was not refused as an escape: %v", r)
			}
		})
	}

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		if en.Name() != filepath.Base(victim) {
			t.Errorf("a file was written outside the workspace: %s", filepath.Join(dir, en.Name()))
		}
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != marker+"\n" {
		t.Errorf("the file outside the workspace changed: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(os.Getenv("HOME"), ".neuron-attack-pwned")); err == nil {
		os.Remove(filepath.Join(os.Getenv("HOME"), ".neuron-attack-pwned"))
		t.Error("a file was written into the home directory")
	}
	// Control: writing inside the workspace works.
	got, _ := e.tool(t, "write", write("inside/notes.txt"))
	if !strings.Contains(got, "write returned") || !strings.Contains(got, "Created") {
		t.Errorf("write inside the workspace: %q", got)
	}
}

// sameDevice reports whether a and b are on the same filesystem.
func sameDevice(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev
}
