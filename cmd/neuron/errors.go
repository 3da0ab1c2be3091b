package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/secbear/neuron/pkg/errs"
)

// Exit codes; see the package documentation and usage.
const (
	exitOK           = 0
	exitFailure      = 1
	exitUsage        = 2
	exitNotCompleted = 3
	// exitAwaitingApproval: the workflow waits for a person to approve
	// or reject tool calls (neuron approve).
	exitAwaitingApproval = 4
	// exitStatusBase plus a gRPC code is the exit code for a status
	// error, as in the operator's one-shot mode.
	exitStatusBase = 10
)

// usageError is a bad command line: exit 2.
type usageError struct {
	cmd string // "run", "state get", ...; empty for the top level
	msg string
}

// usageErrorf is a usage error of cmd.
func usageErrorf(cmd, format string, a ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, a...)}
}

func (e *usageError) Error() string { return e.msg }

// exitError ends the command with a given exit code. An empty message
// prints nothing (the command already said why).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// rpcError is a failed call to a service, with what the user was talking
// to, for the hint.
type rpcError struct {
	service string // "orchestrator", "state"
	addr    string
	// hints by code, specific to the command; they win over the generic ones.
	hints map[codes.Code]string
	err   error
}

func (e *rpcError) Error() string { return e.err.Error() }
func (e *rpcError) Unwrap() error { return e.err }

// codeNames are the canonical gRPC code names, as in the protos' comments.
var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
	codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
	codes.Unauthenticated: "UNAUTHENTICATED",
}

// codeName is the canonical name of c, such as NOT_FOUND.
func codeName(c codes.Code) string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("CODE_%d", uint32(c))
}

// exitCodeFor is the exit code of a status error with code c.
func exitCodeFor(c codes.Code) int { return exitStatusBase + int(c) }

// statusLine is the one-line description of a status error from a call
// to service at addr, without the "neuron: " prefix: "<CODE>: <message>;
// <what to do>".
func statusLine(e *rpcError) (codes.Code, string) {
	st, ok := status.FromError(e.err)
	if !ok {
		return codes.Unknown, e.err.Error()
	}
	msg := oneLine(st.Message())
	if st.Code() == codes.Unavailable && strings.Contains(msg, "connection refused") {
		msg = fmt.Sprintf("cannot reach the %s at %s: connection refused", e.service, e.addr)
	}
	line := codeName(st.Code()) + ": " + msg
	if h := hintFor(e, st); h != "" {
		line += "; " + h
	}
	return st.Code(), line
}

// hintFor says what to do about a status error.
func hintFor(e *rpcError, st *status.Status) string {
	if h, ok := e.hints[st.Code()]; ok {
		return h
	}
	switch st.Code() {
	case codes.Unavailable:
		if errs.Reason(st.Err()) == "OPERATOR_RETRYABLE" {
			return "the operator failed in a way a retry may fix: run it again"
		}
		return "is `neuron up` running? (or point --addr at the " + e.service + ")"
	case codes.Unimplemented:
		return fmt.Sprintf("is %s really the %s? (set --addr)", e.addr, e.service)
	case codes.DeadlineExceeded:
		return "the call took too long: raise --timeout"
	case codes.Canceled:
		return "interrupted"
	case codes.Unauthenticated, codes.PermissionDenied:
		return "pass a token allowed to make this call with --token-file"
	case codes.InvalidArgument:
		return "check the arguments (--help lists them)"
	case codes.Internal:
		return "the service failed; its log says why (`neuron up` keeps logs in <data-dir>/logs)"
	}
	return ""
}

// oneLine joins the lines of s, so every error stays on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// report prints err (if any) and returns the exit code.
func (c *cli) report(err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var (
		ue *usageError
		ee *exitError
		re *rpcError
	)
	switch {
	case errors.As(err, &ue):
		cmd := "neuron"
		if ue.cmd != "" {
			cmd += " " + ue.cmd
		}
		fmt.Fprintf(c.stderr, "%s: %s (see '%s --help')\n", cmd, ue.msg, cmd)
		return exitUsage
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintf(c.stderr, "neuron: %s\n", ee.msg)
		}
		return ee.code
	case errors.As(err, &re):
		code, line := statusLine(re)
		fmt.Fprintf(c.stderr, "neuron: %s\n", line)
		return exitCodeFor(code)
	}
	fmt.Fprintf(c.stderr, "neuron: %s\n", oneLine(err.Error()))
	return exitFailure
}
