package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(realMain(os.Args[1:]))
}

// realMain runs neuron with args on the process's streams and signals and
// returns the exit code.
func realMain(args []string) int {
	sigs := []os.Signal{syscall.SIGINT, syscall.SIGTERM}
	if len(args) > 0 && args[0] == "chat" {
		// Ctrl-C in a chat cancels the current run, not the chat.
		sigs = sigs[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	defer stop()
	c := &cli{
		stdin:    os.Stdin,
		stdout:   os.Stdout,
		stderr:   os.Stderr,
		getenv:   os.Getenv,
		terminal: isTerminal(os.Stdout),
	}
	return c.main(ctx, args)
}

// cli is one invocation of neuron: its standard streams and environment.
// Commands write only through it, so tests can run them in process.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// terminal is true when stdout is a terminal: run draws a live
	// progress line instead of plain lines.
	terminal bool
	// interrupts, when set, delivers Ctrl-C to chat (tests); nil: chat
	// subscribes to SIGINT.
	interrupts <-chan os.Signal
}

// usage is the top-level help, with the exit codes.
const usage = `neuron: the command line of the layer0 agent services

Usage:
  neuron up [flags]                       start the four services locally (dev mode) and keep them up
  neuron run AGENT TASK... [flags]        dispatch AGENT with TASK through the orchestrator, streaming its answer
  neuron chat AGENT [--session S]         talk with AGENT: streamed answers, approvals inline, /history /cost /quit
  neuron agents apply|diff|list|get|delete  define, change and remove agents
  neuron workflows list|show|watch|signal|cancel
  neuron approvals list [--workflow ID]   tool calls waiting for a person's approval
  neuron approve WORKFLOW [--call ID]... [--reject] [--reason R] [--edit JSON]
  neuron state get|put|delete|list|search  read and write the State service
  neuron events [flags]                   tail lifecycle events (budget, compaction, observability)
  neuron files ls|get|put|rm --workflow ID  the files of a workspace that lasts (environment service)
  neuron help [COMMAND]

Run 'neuron COMMAND --help' for a command's flags. Client commands talk to
the orchestrator at 127.0.0.1:7070 (state: the State service at
127.0.0.1:7072) unless --addr or NEURON_ORCHESTRATOR_ADDR /
NEURON_STATE_ADDR say otherwise; --json prints one protojson object per line.

Exit codes:
  0      success
  1      error (a service failed to start or died; a file could not be written)
  2      usage error (bad flags or arguments)
  3      the workflow ended without completing (exit kind not COMPLETE, failed or canceled)
  4      the workflow waits for approval of tool calls (neuron approve decides them)
  10+N   the service answered with gRPC status code N, e.g. 15 NOT_FOUND (5),
         24 UNAVAILABLE (14: is 'neuron up' running?), 11 CANCELED (Ctrl-C)
`

// main runs the command named by args[0] and returns the exit code.
func (c *cli) main(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "up":
		err = c.cmdUp(ctx, rest)
	case "run":
		err = c.cmdRun(ctx, rest)
	case "agents", "agent":
		err = c.cmdAgents(ctx, rest)
	case "workflows", "workflow", "wf":
		err = c.cmdWorkflows(ctx, rest)
	case "approvals", "approval":
		err = c.cmdApprovals(ctx, rest)
	case "approve":
		err = c.cmdApprove(ctx, rest)
	case "chat":
		err = c.cmdChat(ctx, rest)
	case "state":
		err = c.cmdState(ctx, rest)
	case "events":
		err = c.cmdEvents(ctx, rest)
	case "files":
		err = c.cmdFiles(ctx, rest)
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && rest[0] != "help" {
			return c.main(ctx, []string{rest[0], "--help"})
		}
		fmt.Fprint(c.stdout, usage)
		return exitOK
	default:
		err = usageErrorf("", "unknown command %q", cmd)
	}
	return c.report(err)
}
