// Package harness starts services in process for tests, the way the
// binaries start them: a test calls a service's own Run (its Config with
// a loopback listener), so what a test talks to has the production
// interceptor chain, limits and health. It also dials them and gives
// tests a logger.
package harness

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/secbear/neuron/pkg/grpcserver"
)

// ReadyTimeout bounds how long Serve waits for a service to answer its
// health check as SERVING. It starts once the service's code is built
// (it runs in the test binary), so it never covers a build.
const ReadyTimeout = 30 * time.Second

// Serve runs a service on a loopback listener until the test ends and
// returns its address once the service reports SERVING. run is the
// service's Run with the listener in its Config; it must serve until
// ctx ends and then return nil. A Run that fails, or returns before the
// test ends, fails the test. The service is dialled without TLS: run it
// in dev mode.
func Serve(t testing.TB, run func(ctx context.Context, lis net.Listener) error) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, lis) }()
	stopped := false
	t.Cleanup(func() {
		cancel()
		if stopped {
			return
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the service at %s stopped with: %v", addr, err)
			}
		case <-time.After(ReadyTimeout):
			t.Errorf("the service at %s did not stop within %v of its context ending", addr, ReadyTimeout)
		}
	})
	if err := waitServing(ctx, addr, done); err != nil {
		stopped = true
		t.Fatalf("starting the service at %s: %v", addr, err)
	}
	return addr
}

// waitServing polls the service's health until it is SERVING, it stops,
// or ReadyTimeout passes.
func waitServing(ctx context.Context, addr string, done <-chan error) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	deadline := time.Now().Add(ReadyTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		r, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case err := <-done:
			if err == nil {
				err = errors.New("Run returned before the test ended")
			}
			return err
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("not SERVING within " + ReadyTimeout.String())
		}
	}
}

// Dial connects to a service that Serve started (without TLS) and closes
// the connection when the test ends.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// Quiet is a logger that discards.
func Quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// Logger is a logger that writes to the test's log (shown for failed
// tests and with -v) until the test ends, and discards after: services
// stopping in the background may still log.
func Logger(t testing.TB) *slog.Logger {
	h := &testHandler{t: t, mu: &sync.Mutex{}, open: new(bool)}
	*h.open = true
	t.Cleanup(func() {
		h.mu.Lock()
		*h.open = false
		h.mu.Unlock()
	})
	return slog.New(h)
}

type testHandler struct {
	t     testing.TB
	mu    *sync.Mutex
	open  *bool
	attrs []slog.Attr
	group string
}

func (h *testHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *testHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !*h.open {
		return nil
	}
	line := r.Level.String() + " " + r.Message
	for _, a := range h.attrs {
		line += " " + a.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		if h.group != "" {
			a.Key = h.group + "." + a.Key
		}
		line += " " + a.String()
		return true
	})
	h.t.Log(line)
	return nil
}

func (h *testHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *testHandler) WithGroup(name string) slog.Handler {
	c := *h
	if c.group != "" {
		name = c.group + "." + name
	}
	c.group = name
	return &c
}

// ServeFake serves a test double (a fake operator, hook, middleware or a
// State server over an instrumented store) on loopback until the test
// ends, behind the same standard chain every service has
// (pkg/grpcserver, dev mode: error mapping, recovery, limits, health),
// and returns its address once it is SERVING. register adds the fake's
// services; opts add interceptors or server options as a service's Run
// would. A real service is started with Serve and its own Run instead.
func ServeFake(t testing.TB, name string, register func(*grpcserver.Server), opts ...grpcserver.Option) string {
	t.Helper()
	return Serve(t, func(ctx context.Context, lis net.Listener) error {
		srv, err := grpcserver.New(grpcserver.Config{Name: name, Dev: true, ShutdownTimeout: 2 * time.Second}, Quiet(), opts...)
		if err != nil {
			lis.Close()
			return err
		}
		register(srv)
		return srv.Serve(ctx, lis)
	})
}
