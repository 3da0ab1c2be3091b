package remote

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
)

// DefaultTimeout is the deadline of each middleware call when
// Config.Timeout is zero.
const DefaultTimeout = 2 * time.Second

// Config configures a Middleware.
type Config struct {
	// Timeout is the deadline of each middleware call (Describe included),
	// applied even when the caller's deadline is longer; default
	// DefaultTimeout.
	Timeout time.Duration
	// FailOpen: when the middleware cannot answer (unreachable, timeout,
	// error), the call proceeds and a warning is logged. False (the
	// default): the call fails with UNAVAILABLE naming the middleware.
	FailOpen bool
	// Log receives verdicts and failures (default: discarded).
	Log *slog.Logger
}

// Flags is the command-line configuration of a middleware client.
type Flags struct {
	// Client says how to reach the middleware; Client.Timeout is the
	// deadline of each middleware call.
	Client grpcclient.Config
	// FailOpen is Config.FailOpen.
	FailOpen bool
}

// Bind registers --middleware-addr, --middleware-timeout, the TLS and
// token flags of pkg/grpcclient, and --middleware-fail-open.
func (f *Flags) Bind(fs *flag.FlagSet) {
	if f.Client.Timeout == 0 {
		f.Client.Timeout = DefaultTimeout // so --help shows the real default
	}
	f.Client.BindFlags(fs, "middleware")
	if fl := fs.Lookup("middleware-timeout"); fl != nil {
		fl.Usage = "deadline of each call to the middleware service, however long the intercepted call's"
	}
	fs.BoolVar(&f.FailOpen, "middleware-fail-open", f.FailOpen,
		"when the middleware cannot answer, let calls proceed (logged) instead of failing them UNAVAILABLE; also start when its Describe fails")
}

// Dial connects to the middleware named by f and calls New. With no
// address it returns (nil, a no-op, nil): no middleware is configured. The
// returned function closes the connection. Unless f.Client.MaxRetries is
// set, calls are not retried: the per-call deadline is short and the fail
// policy, not a retry loop, decides what an unanswered call means.
func Dial(ctx context.Context, f Flags, log *slog.Logger) (*Middleware, func(), error) {
	noop := func() {}
	if f.Client.Target == "" {
		return nil, noop, nil
	}
	c := f.Client
	if c.MaxRetries == 0 {
		c.MaxRetries = -1
	}
	conn, err := grpcclient.Dial(c)
	if err != nil {
		return nil, noop, fmt.Errorf("--middleware-addr: %w", err)
	}
	m, err := newMiddleware(ctx, middlewarev1.NewMiddlewareServiceClient(conn),
		Config{Timeout: c.Timeout, FailOpen: f.FailOpen, Log: log}, "middleware at "+c.Target)
	if err != nil {
		conn.Close()
		return nil, noop, err
	}
	return m, func() { conn.Close() }, nil
}
