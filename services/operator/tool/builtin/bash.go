package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/operator/tool"
)

// Limits of the bash tool.
const (
	// DefaultBashTimeout bounds a command when the model gives no
	// timeout_seconds and the policy no Timeout.
	DefaultBashTimeout = 2 * time.Minute
	// MaxBashTimeout is the largest timeout_seconds the model may ask for.
	MaxBashTimeout = 600 * time.Second
	// DefaultBashMaxOutput caps stdout, and separately stderr, when the
	// policy sets no MaxOutput; two full streams still fit the registry's
	// default output limit (64 KiB).
	DefaultBashMaxOutput = 30 << 10
)

// bashSchema is the input schema of the bash tool.
const bashSchema = `{
  "type": "object",
  "properties": {
    "command": {"type": "string", "minLength": 1, "description": "The shell command to run, e.g. \"go test ./...\" or \"ls -la src\". Pipes, redirections, && and multi-line scripts work."},
    "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 600, "description": "Wall-clock limit in seconds (default 120). On expiry the command and everything it started are killed."}
  },
  "required": ["command"],
  "additionalProperties": false
}`

// Bash is the "bash" tool: it runs a shell command (bash -c, or sh -c
// where bash is not installed) in the workspace, confined by
// sandbox.Run, and reports its stdout, stderr and exit status.
//
// A command that exits non-zero, is killed by a signal or times out is an
// error result, so the model sees is_error: Call returns the labelled
// output as its string and the exit status as the error ("Exit code:
// 2"), which the registry joins into one message. Treating a failed
// command as a failed call is what lets the model (and the loop's
// circuit breaker) notice it without parsing the text. A command that
// could not be started at all (no sandbox on this kernel, bad policy) is
// an error with no output.
//
// The process running the tool must call sandbox.Main first thing in main.
type Bash struct {
	policy  sandbox.Policy
	timeout time.Duration // default per call
	shell   string
}

// NewBash returns the bash tool working in workspace (which replaces
// p.Workspace, made absolute) under policy p. p.Timeout, when set, is the
// default timeout instead of DefaultBashTimeout (the model may still ask
// for up to MaxBashTimeout); a zero p.MaxOutput becomes
// DefaultBashMaxOutput. Everything else in p applies as documented by
// sandbox.Policy; a nil p.Env is sandbox.DefaultEnv, and p.PrivateTmp is
// recommended so that temporary files stay out of the workspace.
// Problems with the workspace or the kernel are reported by Call.
func NewBash(workspace string, p sandbox.Policy) *Bash {
	if abs, err := filepath.Abs(workspace); err == nil {
		workspace = abs
	}
	p.Workspace = workspace
	if p.MaxOutput == 0 {
		p.MaxOutput = DefaultBashMaxOutput
	}
	timeout := min(p.Timeout, MaxBashTimeout)
	if timeout <= 0 {
		timeout = DefaultBashTimeout
	}
	shell := "/bin/bash"
	if _, err := os.Stat(shell); err != nil {
		shell = "/bin/sh"
	}
	return &Bash{policy: p, timeout: timeout, shell: shell}
}

// Spec implements tool.Tool. Its Timeout leaves room above
// MaxBashTimeout so that the tool's own timeout, which kills the command
// and reports its output, fires before the registry's.
func (b *Bash) Spec() tool.Spec {
	return tool.Spec{
		Name: "bash",
		Description: fmt.Sprintf("Run a shell command with %s -c in the workspace (the working directory) and get its stdout, stderr and exit code. "+
			"The command runs in a sandbox: it can read and write only inside the workspace, can read and run the system's programs and libraries, "+
			"and by default cannot see anything else ($HOME, /tmp, /proc and the host's credentials are out of reach; $TMPDIR is writable). "+
			"Its environment is minimal: no API keys or tokens are set. Stdin is empty, so interactive commands get end-of-file. "+
			"Each of stdout and stderr is cut after %d bytes (use head, tail or grep to see the part you need). "+
			"The default timeout is %v; set timeout_seconds (at most 600) for longer commands. "+
			"Background processes are killed when the command ends, so do not start servers to use in a later call. "+
			"A non-zero exit code, a signal or a timeout is reported as an error.",
			b.shell, b.policy.MaxOutput, b.timeout),
		Schema:  json.RawMessage(bashSchema),
		Tier:    tool.SideEffecting,
		Timeout: MaxBashTimeout + 30*time.Second,
	}
}

// Call implements tool.Tool.
func (b *Bash) Call(ctx context.Context, in json.RawMessage) (string, error) {
	var args struct {
		Command        string `json:"command"`
		TimeoutSeconds *int64 `json:"timeout_seconds"`
	}
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&args); err != nil {
		return "", tool.Errorf(errs.InvalidArgument, "invalid arguments: %v", err)
	}
	if strings.TrimSpace(args.Command) == "" {
		return "", tool.Errorf(errs.InvalidArgument, "command is empty; give the shell command to run")
	}
	p := b.policy
	p.Timeout = b.timeout
	if s := args.TimeoutSeconds; s != nil {
		if *s < 1 || time.Duration(*s)*time.Second > MaxBashTimeout {
			return "", tool.Errorf(errs.InvalidArgument, "timeout_seconds is %d; it must be between 1 and %d", *s, int(MaxBashTimeout/time.Second))
		}
		p.Timeout = time.Duration(*s) * time.Second
	}

	res, err := sandbox.Run(ctx, p, []string{b.shell, "-c", args.Command}, nil)
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		kind := errs.Canceled
		if errors.Is(err, context.DeadlineExceeded) {
			kind = errs.DeadlineExceeded
		}
		if res == nil {
			return "", tool.Errorf(kind, "The command was not run: %v.", err)
		}
		return formatOutput(res), tool.Errorf(kind, "The command was stopped before it finished (%v); it and every process it started were killed.", err)
	case errors.Is(err, sandbox.ErrUnsupported):
		return "", tool.Errorf(errs.Unavailable, "bash is unavailable on this host: %v", err)
	case err != nil:
		return "", tool.Errorf(errs.Internal, "bash could not start the command: %v", err)
	}

	out := formatOutput(res)
	switch {
	case res.TimedOut:
		return out, tool.Errorf(errs.DeadlineExceeded, "Timed out after %v: the command and every process it started were killed. Set timeout_seconds (at most %d) for a longer limit, or do less in one call.", p.Timeout, int(MaxBashTimeout/time.Second))
	case res.Signal != "":
		return out, tool.Errorf(errs.FailedPrecondition, "Killed by signal %s%s.", res.Signal, signalHint(res.Signal))
	case res.ExitCode != 0:
		return out, tool.Errorf(errs.FailedPrecondition, "Exit code: %d", res.ExitCode)
	}
	return out + "Exit code: 0", nil
}

// formatOutput labels the two streams, saying when one was cut.
func formatOutput(res *sandbox.Result) string {
	var sb strings.Builder
	section := func(name string, data []byte, size int64) {
		switch {
		case size == 0:
			fmt.Fprintf(&sb, "--- %s: empty ---\n", name)
			return
		case int64(len(data)) < size:
			fmt.Fprintf(&sb, "--- %s (truncated: the first %d of %d bytes) ---\n", name, len(data), size)
		default:
			fmt.Fprintf(&sb, "--- %s ---\n", name)
		}
		sb.Write(data)
		if data[len(data)-1] != '\n' {
			sb.WriteByte('\n')
		}
	}
	section("stdout", res.Stdout, res.StdoutSize)
	section("stderr", res.Stderr, res.StderrSize)
	return sb.String()
}

// signalHint explains the signals the sandbox's limits send.
func signalHint(sig string) string {
	switch sig {
	case "SIGXCPU":
		return " (the CPU time limit was reached)"
	case "SIGXFSZ":
		return " (the file size limit was reached)"
	}
	return ""
}
