package builtin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/builtin"
)

// TestMain lets the test binary act as the sandbox trampoline.
func TestMain(m *testing.M) {
	sandbox.Main()
	os.Exit(m.Run())
}

func requireBashSandbox(t *testing.T) {
	t.Helper()
	if err := sandbox.Supported(); err != nil {
		t.Skipf("the sandbox cannot run on this kernel: %v", err)
	}
}

// newBash returns a bash tool over a fresh workspace.
func newBash(t *testing.T, p sandbox.Policy) (*builtin.Bash, string) {
	t.Helper()
	requireBashSandbox(t)
	ws := t.TempDir()
	return builtin.NewBash(ws, p), ws
}

func callBash(t *testing.T, ctx context.Context, b *builtin.Bash, input string) (string, error) {
	t.Helper()
	return b.Call(ctx, json.RawMessage(input))
}

func checkBash(t *testing.T, out string, err error, wantOut string, wantErr string, wantKind *errs.Kind) {
	t.Helper()
	if out != wantOut {
		t.Errorf("output:\n%s\nwant:\n%s", out, wantOut)
	}
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("error %q, want none", err)
	case wantErr != "" && (err == nil || err.Error() != wantErr):
		t.Errorf("error %v, want %q", err, wantErr)
	case wantKind != nil && !errors.Is(err, wantKind):
		t.Errorf("error %v does not wrap %v", err, wantKind)
	}
}

func TestBashSpec(t *testing.T) {
	b := builtin.NewBash(t.TempDir(), sandbox.Policy{})
	s := b.Spec()
	if s.Name != "bash" || s.Tier != tool.SideEffecting || s.Timeout != builtin.MaxBashTimeout+30*time.Second {
		t.Errorf("spec %q %v %v", s.Name, s.Tier, s.Timeout)
	}
	var schema struct {
		Type       string `json:"type"`
		Properties map[string]struct {
			Type      string `json:"type"`
			MinLength *int   `json:"minLength"`
			Minimum   *int   `json:"minimum"`
			Maximum   *int   `json:"maximum"`
		} `json:"properties"`
		Required             []string `json:"required"`
		AdditionalProperties *bool    `json:"additionalProperties"`
	}
	if err := json.Unmarshal(s.Schema, &schema); err != nil {
		t.Fatal(err)
	}
	cmd, to := schema.Properties["command"], schema.Properties["timeout_seconds"]
	if schema.Type != "object" || len(schema.Properties) != 2 ||
		cmd.Type != "string" || cmd.MinLength == nil || *cmd.MinLength != 1 ||
		to.Type != "integer" || *to.Minimum != 1 || *to.Maximum != 600 ||
		len(schema.Required) != 1 || schema.Required[0] != "command" ||
		schema.AdditionalProperties == nil || *schema.AdditionalProperties {
		t.Errorf("schema %s", s.Schema)
	}
	if err := tool.NewRegistry().Register(b); err != nil {
		t.Fatalf("Register: %v", err)
	}
}

func TestBashEcho(t *testing.T) {
	b, ws := newBash(t, sandbox.Policy{})
	out, err := callBash(t, context.Background(), b, `{"command":"echo hello; pwd"}`)
	checkBash(t, out, err, "--- stdout ---\nhello\n"+ws+"\n--- stderr: empty ---\nExit code: 0", "", nil)
}

func TestBashWritesWorkspace(t *testing.T) {
	b, ws := newBash(t, sandbox.Policy{PrivateTmp: true})
	out, err := callBash(t, context.Background(), b, `{"command":"mkdir -p sub && printf data > sub/f && t=$(mktemp) && echo tmp > \"$t\" && cat \"$t\""}`)
	checkBash(t, out, err, "--- stdout ---\ntmp\n--- stderr: empty ---\nExit code: 0", "", nil)
	if got, err := os.ReadFile(filepath.Join(ws, "sub", "f")); err != nil || string(got) != "data" {
		t.Errorf("sub/f = %q, %v", got, err)
	}
	if entries, _ := os.ReadDir(ws); len(entries) != 1 {
		t.Errorf("workspace holds %v, want only sub (mktemp must use the private tmp)", entries)
	}
}

func TestBashNonZeroExit(t *testing.T) {
	b, _ := newBash(t, sandbox.Policy{})
	out, err := callBash(t, context.Background(), b, `{"command":"echo out; echo err >&2; exit 3"}`)
	checkBash(t, out, err, "--- stdout ---\nout\n--- stderr ---\nerr\n", "Exit code: 3", errs.FailedPrecondition)

	// Through the registry the model sees one error result.
	r := tool.NewRegistry()
	if err := r.Register(b); err != nil {
		t.Fatal(err)
	}
	o := r.Call(context.Background(), "bash", json.RawMessage(`{"command":"echo out; exit 3"}`))
	if !o.IsError || o.Content != "--- stdout ---\nout\n--- stderr: empty ---\n\nExit code: 3" {
		t.Errorf("outcome %+v", o)
	}
}

func TestBashEscapeRefused(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, ws := newBash(t, sandbox.Policy{})
	if err := os.Symlink(secret, filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, command, stderr, exit string
	}{
		{"read /etc/shadow", "cat /etc/shadow", "cat: /etc/shadow: Permission denied\n", "Exit code: 1"},
		{"read outside", "cat " + secret, "cat: " + secret + ": Permission denied\n", "Exit code: 1"},
		{"read through a symlink", "cat link", "cat: link: Permission denied\n", "Exit code: 1"},
		{"write outside", "echo x > " + outside + "/new", "/bin/bash: line 1: " + outside + "/new: Permission denied\n", "Exit code: 1"},
		{"list /root", "ls /root", "ls: cannot open directory '/root': Permission denied\n", "Exit code: 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, _ := json.Marshal(map[string]string{"command": tt.command})
			out, err := callBash(t, context.Background(), b, string(in))
			checkBash(t, out, err, "--- stdout: empty ---\n--- stderr ---\n"+tt.stderr, tt.exit, errs.FailedPrecondition)
		})
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was created outside the workspace: %v", err)
	}
}

func TestBashEnvironmentHidesSecrets(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
	t.Setenv("GITHUB_TOKEN", "ghp-secret")
	b, ws := newBash(t, sandbox.Policy{})
	out, err := callBash(t, context.Background(), b, `{"command":"env | sort"}`)
	want := "--- stdout ---\n" +
		"HOME=" + ws + "\nLANG=C.UTF-8\nPATH=/usr/local/bin:/usr/bin:/bin\nPWD=" + ws +
		"\nSHLVL=1\nTMPDIR=" + ws + "\n_=/usr/bin/env\n" +
		"--- stderr: empty ---\nExit code: 0"
	checkBash(t, out, err, want, "", nil)
	if strings.Contains(out, "secret") {
		t.Errorf("a parent secret leaked into the child: %s", out)
	}
}

func TestBashTimeout(t *testing.T) {
	b, ws := newBash(t, sandbox.Policy{})
	start := time.Now()
	out, err := callBash(t, context.Background(), b, `{"command":"echo started; echo $$ > pid; sleep 100 & sleep 100","timeout_seconds":1}`)
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("call took %v with a 1s timeout", elapsed)
	}
	checkBash(t, out, err, "--- stdout ---\nstarted\n--- stderr: empty ---\n",
		"Timed out after 1s: the command and every process it started were killed. Set timeout_seconds (at most 600) for a longer limit, or do less in one call.",
		errs.DeadlineExceeded)
	pid, _ := os.ReadFile(filepath.Join(ws, "pid"))
	if _, err := os.Stat("/proc/" + strings.TrimSpace(string(pid))); err == nil {
		t.Errorf("the shell (pid %s) survived the timeout", bytes.TrimSpace(pid))
	}
}

func TestBashDefaultTimeoutFromPolicy(t *testing.T) {
	b, _ := newBash(t, sandbox.Policy{Timeout: 500 * time.Millisecond})
	out, err := callBash(t, context.Background(), b, `{"command":"sleep 100"}`)
	checkBash(t, out, err, "--- stdout: empty ---\n--- stderr: empty ---\n",
		"Timed out after 500ms: the command and every process it started were killed. Set timeout_seconds (at most 600) for a longer limit, or do less in one call.",
		errs.DeadlineExceeded)
}

func TestBashCanceled(t *testing.T) {
	b, _ := newBash(t, sandbox.Policy{})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	out, err := callBash(t, ctx, b, `{"command":"echo started; sleep 100"}`)
	checkBash(t, out, err, "--- stdout ---\nstarted\n--- stderr: empty ---\n",
		"The command was stopped before it finished (context canceled); it and every process it started were killed.",
		errs.Canceled)
}

func TestBashTruncatedOutput(t *testing.T) {
	b, _ := newBash(t, sandbox.Policy{MaxOutput: 16})
	out, err := callBash(t, context.Background(), b, `{"command":"head -c 1000 /dev/zero | tr '\\0' a; printf abc >&2"}`)
	checkBash(t, out, err, "--- stdout (truncated: the first 16 of 1000 bytes) ---\naaaaaaaaaaaaaaaa\n--- stderr ---\nabc\nExit code: 0", "", nil)
}

func TestBashLimitSignal(t *testing.T) {
	b, _ := newBash(t, sandbox.Policy{Limits: sandbox.Limits{FileSizeBytes: 100}})
	out, err := callBash(t, context.Background(), b, `{"command":"exec head -c 1000 /dev/zero > big"}`)
	checkBash(t, out, err, "--- stdout: empty ---\n--- stderr: empty ---\n",
		"Killed by signal SIGXFSZ (the file size limit was reached).", errs.FailedPrecondition)
}

func TestBashInvalidInput(t *testing.T) {
	b := builtin.NewBash(t.TempDir(), sandbox.Policy{})
	tests := []struct{ name, input, want string }{
		{"empty command", `{"command":"  "}`, "command is empty; give the shell command to run"},
		{"zero timeout", `{"command":"true","timeout_seconds":0}`, "timeout_seconds is 0; it must be between 1 and 600"},
		{"timeout too long", `{"command":"true","timeout_seconds":601}`, "timeout_seconds is 601; it must be between 1 and 600"},
		{"unknown field", `{"command":"true","cwd":"/"}`, `invalid arguments: json: unknown field "cwd"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := b.Call(context.Background(), json.RawMessage(tt.input))
			checkBash(t, out, err, "", tt.want, errs.InvalidArgument)
		})
	}
}
