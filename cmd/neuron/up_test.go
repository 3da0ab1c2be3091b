package main

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/secbear/neuron/pkg/sandbox"
)

// TestUpDemoExit runs the whole system with the sample workflow, as
// `make run` does in CI, and checks what it reports and leaves behind.
func TestUpDemoExit(t *testing.T) {
	t.Parallel()
	s := newUpSetup(t)
	r := neuron(ctxFor(t), t, s.args("--demo-exit")...)
	if r.code != 0 {
		t.Fatalf("neuron up --demo-exit: want exit 0, got:\n%s", r)
	}
	out := r.stdout
	for name, addr := range map[string]string{"state": s.state, "operator": s.operator, "environment": s.environ, "orchestrator": s.orchestrator} {
		if !regexp.MustCompile(`(?m)^  ` + name + ` +SERVING on ` + regexp.QuoteMeta(addr) + ` `).MatchString(out) {
			t.Errorf("no SERVING line for %s on %s", name, addr)
		}
	}
	sandboxed := sandbox.Supported() == nil && sandbox.CgroupSupported() == nil
	wantRoute := "on the operator service directly"
	if sandboxed {
		wantRoute = "through the environment service's process sandbox"
	}
	wf := regexp.MustCompile(`dispatching assistant in workflow (demo-[0-9a-f]+)`).FindStringSubmatch(out)
	if wf == nil {
		t.Fatalf("no workflow id in the demo's output:\n%s", out)
	}
	for _, want := range []string{
		"route     agents run " + wantRoute,
		"model     SCRIPTED",
		"the answers are scripted, NOT a language model's",
		"workflow started (agent assistant)",
		"effect delegate applied: agent \"researcher\" ran (COMPLETE)",
		"answer (assistant):\n  [scripted answer] layer0 splits an agent system",
		"exit:     COMPLETE (workflow " + wf[1] + ")",
		"model:    scripted: the built-in deterministic model, NOT a language model",
		"tools:    write, write_memory",
		"cost:     $0 for the whole workflow, delegations included (the scripted model is free)",
		"  applied      delegate      agent \"researcher\" ran (COMPLETE)",
		"  applied      write_memory  written (revision ",
		`memory:   assistant/last_run = {"agent":"assistant","scripted":true,`,
		"  state      " + filepath.Join(s.dataDir, "state", "state.db"),
		"  journal    " + filepath.Join(s.dataDir, "orchestrator", "journal.db"),
		"neuron state get --global assistant/last_run --addr " + s.state,
		"neuron workflows show " + wf[1] + " --addr " + s.orchestrator,
		"  logs       " + filepath.Join(s.dataDir, "logs") + "/{state,operator,environment,orchestrator}.log",
		"  agents     neuron agents list (demo definitions: " + filepath.Join(s.dataDir, "demo-agents.yaml") + ")",
		"neuron up: all services stopped",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	for _, f := range []string{"demo-agents.yaml", "state/state.db", "orchestrator/journal.db", "logs/state.log",
		"logs/operator.log", "logs/environment.log", "logs/orchestrator.log"} {
		if _, err := os.Stat(filepath.Join(s.dataDir, f)); err != nil {
			t.Errorf("data dir: %v", err)
		}
	}
	if sandboxed {
		// The operator calls ran in the environment service's sandbox.
		log, _ := os.ReadFile(filepath.Join(s.dataDir, "logs", "environment.log"))
		if n := strings.Count(string(log), `"msg":"run complete"`); n != 3 {
			t.Errorf("environment.log records %d completed runs, want 3 (assistant, researcher, assistant)", n)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", r)
	}
}

// TestUpChildDies checks that a service that cannot start is reported with
// its log and the others are stopped, and that a taken address is refused
// before anything starts.
func TestUpChildDies(t *testing.T) {
	t.Parallel()
	t.Run("state cannot open its database", func(t *testing.T) {
		s := newUpSetup(t)
		// A directory where the State service's bbolt file belongs.
		if err := os.MkdirAll(filepath.Join(s.dataDir, "state", "state.db"), 0o700); err != nil {
			t.Fatal(err)
		}
		r := neuron(ctxFor(t), t, s.args()...)
		if r.code != exitFailure {
			t.Fatalf("want exit %d, got:\n%s", exitFailure, r)
		}
		logPath := filepath.Join(s.dataDir, "logs", "state.log")
		for _, want := range []string{
			"neuron up: state exited before it was SERVING (exit status 1); the end of " + logPath + ":\n    ",
			"state.db",
			"neuron: state exited; the other services were stopped (full log: " + logPath + ")\n",
		} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, r)
			}
		}
		if !strings.Contains(r.stdout, "neuron up: all services stopped") {
			t.Errorf("the others were not stopped:\n%s", r)
		}
	})
	t.Run("address taken", func(t *testing.T) {
		s := newUpSetup(t)
		ln, err := net.Listen("tcp", s.environ)
		if err != nil {
			t.Skipf("port taken meanwhile: %v", err)
		}
		defer ln.Close()
		r := neuron(ctxFor(t), t, s.args()...)
		want := "neuron: up: --environment-addr " + s.environ + " is not free"
		if r.code != exitFailure || !strings.HasPrefix(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 || r.stdout != "" {
			t.Fatalf("want exit %d and one line %q..., got:\n%s", exitFailure, want, r)
		}
		if _, err := os.Stat(filepath.Join(s.dataDir, "logs")); err == nil {
			t.Errorf("neuron up prepared the data dir although it could not start")
		}
	})
}
