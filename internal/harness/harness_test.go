package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthOnly is a Run that serves only the health service, SERVING after
// delay.
func healthOnly(delay time.Duration) func(ctx context.Context, lis net.Listener) error {
	return func(ctx context.Context, lis net.Listener) error {
		s := grpc.NewServer()
		hs := health.NewServer()
		hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		healthpb.RegisterHealthServer(s, hs)
		go func() {
			time.Sleep(delay)
			hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		}()
		go func() { <-ctx.Done(); s.GracefulStop() }()
		if err := s.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	}
}

// Serve returns only once the service is SERVING, and the address
// answers.
func TestServeWaitsUntilServing(t *testing.T) {
	addr := Serve(t, healthOnly(100*time.Millisecond))
	r, err := healthpb.NewHealthClient(Dial(t, addr)).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health right after Serve: %v %v; want SERVING", r, err)
	}
}

// A Run that fails before serving fails Serve with its error.
func TestServeReportsARunThatFails(t *testing.T) {
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		Serve(ft, func(context.Context, net.Listener) error { return errors.New("bad flag") })
	}()
	if ft.fatal == "" || !strings.Contains(ft.fatal, "bad flag") {
		t.Fatalf("Serve of a failing Run: fatal %q; want it to name the error", ft.fatal)
	}
}

type fakeT struct {
	testing.TB
	fatal string
}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	panic("fatal")
}
