package agents_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/operator"
)

// startOperator runs the operator service on the scripted model (it
// echoes the user's message) with the effect tools only.
func startOperator(t *testing.T, stateAddr string) string {
	t.Helper()
	return harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg := operator.DefaultConfig()
		cfg.Server = grpcserver.Config{Name: "operator", Dev: true, ShutdownTimeout: 2 * time.Second}
		cfg.Log, cfg.Listener = harness.Quiet(), lis
		cfg.Model = "scripted"
		cfg.Tools = nil
		cfg.State = grpcclient.Config{Target: stateAddr}
		return operator.Run(ctx, cfg)
	})
}

// TestPythonClient: a Python program (testdata/agent_client.py, on
// stubs generated from proto/) creates an agent, reads it, updates it
// with the revision it read, is refused a stale update and an unknown
// tool, lists it by label and dispatches it on the real operator.
func TestPythonClient(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	stubs, missing := testenv.PythonStubs(t, root)
	if missing != "" {
		t.Skip(missing)
	}
	stateAddr := startState(t)
	opAddr := startOperator(t, stateAddr)
	o := startOrch(t, t.TempDir(), stateAddr, "agents: [{id: placeholder, operator: 127.0.0.1:1}]\n")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound, not an assertion
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.Python, filepath.Join("testdata", "agent_client.py"),
		"--orchestrator", o.addr, "--operator", opAddr, "--name", "py-helper", "--text", "hello from python")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+stubs, "PYTHONDONTWRITEBYTECODE=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("agent_client.py: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.Bytes(), stderr.Bytes())
	}
	steps := map[string]map[string]any{}
	for _, line := range bytes.Split(bytes.TrimSpace(stdout.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("not a JSON line: %q\nstdout:\n%s", line, stdout.Bytes())
		}
		steps[m["step"].(string)] = m
	}
	t.Logf("agent_client.py:\n%s", stdout.Bytes())
	if s := steps["get"]; s == nil || s["instructions"] != "You are terse." || s["revision"] != steps["create"]["revision"] {
		t.Errorf("get: %v, want the created definition at the created revision", s)
	}
	if s := steps["update"]; s == nil || s["instructions"] != "You are very terse." || s["revision"] == steps["create"]["revision"] {
		t.Errorf("update: %v, want a new revision with the new instructions", s)
	}
	if s := steps["stale_update"]; s == nil || s["code"] != "FAILED_PRECONDITION" {
		t.Errorf("stale update: %v, want FAILED_PRECONDITION", s)
	}
	if s := steps["bad_create"]; s == nil || s["code"] != "INVALID_ARGUMENT" || !strings.Contains(s["message"].(string), "tools.builtin") {
		t.Errorf("unknown tool: %v, want INVALID_ARGUMENT naming tools.builtin", s)
	}
	if s := steps["list"]; s == nil || !slices.Equal(toStrings(s["names"]), []string{"py-helper"}) {
		t.Errorf("list: %v, want [py-helper]", s)
	}
	if s := steps["dispatch"]; s == nil || s["text"] != "[scripted model] You said: hello from python" {
		t.Errorf("dispatch: %v, want the scripted model's echo", s)
	}
	got, err := o.agents.GetAgent(ctx, &agentv1.GetAgentRequest{Name: "py-helper"})
	if err != nil || got.GetAgent().GetDefinition().GetInstructions() != "You are very terse." {
		t.Errorf("through Go: %v, %v; want the updated definition", got, err)
	}
}

func toStrings(v any) []string {
	var out []string
	list, _ := v.([]any)
	for _, x := range list {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}
