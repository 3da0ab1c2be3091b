package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/sandbox"
)

// TestFilesAfterDemo: after the demo workflow of `neuron up` ran in the
// process sandbox, the notes.md its assistant wrote is in the workflow's
// workspace, readable with `neuron files get`; ls lists it; put adds a
// file; paths leaving the workspace are refused.
func TestFilesAfterDemo(t *testing.T) {
	t.Parallel()
	if err := sandbox.Supported(); err != nil {
		t.Skipf("the demo runs sandboxed only where Landlock is: %v", err)
	}
	if err := sandbox.CgroupSupported(); err != nil {
		t.Skipf("the demo runs sandboxed only with a cgroup: %v", err)
	}
	up := startUp(t, "--demo")
	var wf string
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out := up.output()
		if strings.Contains(out, "neuron files get notes.md --workflow ") {
			wf = regexp.MustCompile(`dispatching assistant in workflow (demo-[0-9a-f]+)`).FindStringSubmatch(out)[1]
			break
		}
	}
	if wf == "" {
		t.Fatalf("the demo did not finish, or did not say how to read notes.md:\n%s", up.output())
	}
	if want := "neuron files get notes.md --workflow " + wf + " --addr " + up.environ; !strings.Contains(up.output(), want) {
		t.Errorf("the demo's output lacks %q:\n%s", want, up.output())
	}
	env := []string{"--workflow", wf, "--addr", up.environ}
	run := func(args ...string) result {
		t.Helper()
		return neuron(ctxFor(t), t, append(args, env...)...)
	}
	g := run("files", "get", "notes.md")
	if g.code != 0 || !strings.HasPrefix(g.stdout, "# Notes\n\nlayer0 splits an agent system") {
		t.Fatalf("neuron files get notes.md:\n%s", g)
	}
	l := run("files", "ls")
	if l.code != 0 || !regexp.MustCompile(`(?m)^0\d{3} +\d+ +\S+ \S+ +notes\.md$`).MatchString(l.stdout) {
		t.Errorf("neuron files ls:\n%s", l)
	}
	src := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(src, []byte("from the host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if p := run("files", "put", src, "inbox/in.txt"); p.code != 0 || !strings.Contains(p.stdout, "inbox/in.txt: 14 bytes written") {
		t.Errorf("neuron files put:\n%s", p)
	}
	dest := filepath.Join(t.TempDir(), "out.txt")
	if r := run("files", "get", "inbox/in.txt", dest); r.code != 0 {
		t.Errorf("neuron files get to a file:\n%s", r)
	} else if b, _ := os.ReadFile(dest); string(b) != "from the host\n" {
		t.Errorf("downloaded %q", b)
	}
	for _, p := range []string{"../../../etc/passwd", "/etc/passwd"} {
		r := run("files", "get", p)
		if r.code != exitStatusBase+3 || !strings.HasPrefix(r.stderr, "neuron: INVALID_ARGUMENT: ") {
			t.Errorf("neuron files get %s: want INVALID_ARGUMENT (exit %d):\n%s", p, exitStatusBase+3, r)
		}
	}
	if r := neuron(ctxFor(t), t, "files", "ls", "--addr", up.environ); r.code != exitUsage {
		t.Errorf("neuron files ls without a workspace: want a usage error:\n%s", r)
	}
}
