package environment

import (
	"context"
	"os"
	"syscall"
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
	// command's controlling terminal.
	TTY bool
	// Signals are delivered to the command's process group.
	Signals <-chan syscall.Signal
}
