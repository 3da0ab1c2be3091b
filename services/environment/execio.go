package environment

import (
	"context"
	"os"
	"syscall"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
)

// StreamExecutor is implemented by backends that run the commands of
// sandbox sessions with their input and output streamed (Exec): as
// Executor, but the command reads wiring.Stdin and writes
// wiring.Stdout and wiring.Stderr while it runs, and receives
// wiring.Signals. ExecResult's Stdout and Stderr stay empty.
type StreamExecutor interface {
	ExecStream(ctx context.Context, inv *Invocation, argv []string, wiring ExecWiring) (*ExecResult, error)
}

// ExecWiring is how a streamed sandbox command is connected.
type ExecWiring struct {
	// Stdin, Stdout and Stderr are the command's standard streams: the
	// command's ends of pipes (or, with TTY, all three the follower end
	// of a pseudo-terminal), handed to it as they are. The caller closes
	// them after ExecStream returns.
	Stdin, Stdout, Stderr *os.File
	// TTY says the three are a pseudo-terminal, which becomes the
	// command's controlling terminal. For a SandboxHost backend it is
	// raw, and carries bytes to and from a terminal of the backend's.
	TTY bool
	// Signals are delivered to the command's process group.
	Signals <-chan syscall.Signal
	// Resizes, with TTY, carries each new window size the client asks
	// for once the terminal has it. A backend whose command runs on a
	// terminal of its own (a container's) applies them there; others
	// may ignore it.
	Resizes <-chan *environmentv1.TerminalSize
}

// SandboxHost is implemented by StreamExecutor backends that keep a
// sandbox session on their platform (a long-lived container) rather
// than starting a fresh sandbox per command: CreateSandbox calls
// OpenSandbox with an invocation made from the sandbox's spec (its
// credentials resolved, its Egress set when the spec allows network,
// its Workspace the sandbox's), ExecStream then runs each command in
// that sandbox, and CloseSandbox (CloseSandbox, the idle timeout, the
// service stopping) removes it and its workspace. The workspace's files
// are reached through the backend's WorkspaceHost.
type SandboxHost interface {
	OpenSandbox(ctx context.Context, inv *Invocation) error
	CloseSandbox(ctx context.Context, name string) error
}
