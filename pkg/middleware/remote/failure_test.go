package remote

import (
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// quick is the middleware deadline of the failure tests; callers have a
// much longer one, which must not matter.
const quick = 150 * time.Millisecond

// within is how long a refused or proceeding call may take at most.
const within = 2 * time.Second

// TestFailPolicy: a middleware that cannot answer (down, or slower than
// the timeout) fails a call UNAVAILABLE quickly when fail-closed, and lets
// it proceed when fail-open.
func TestFailPolicy(t *testing.T) {
	// down: the middleware answered Describe, then stopped.
	down := func(t *testing.T, failOpen bool) *Middleware {
		s, addr := listen(t, func(s *grpc.Server) { middlewarev1.RegisterMiddlewareServiceServer(s, &policy{name: "gone"}) })
		m, err := New(context.Background(), middlewarev1.NewMiddlewareServiceClient(dial(t, addr)), Config{Timeout: quick, FailOpen: failOpen})
		if err != nil {
			t.Fatal(err)
		}
		s.Stop()
		return m
	}
	// unreachable: nothing ever listened; fail-open starts anyway.
	unreachable := func(t *testing.T, failOpen bool) *Middleware {
		m, err := New(context.Background(), middlewarev1.NewMiddlewareServiceClient(dial(t, closedAddr(t))), Config{Timeout: quick, FailOpen: failOpen})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	slow := func(t *testing.T, failOpen bool) *Middleware {
		return startPolicy(t, &policy{name: "slow", slow: true}, Config{Timeout: quick, FailOpen: failOpen})
	}
	tests := []struct {
		name     string
		failOpen bool
		mw       func(*testing.T, bool) *Middleware
	}{
		{"down, fail-closed", false, down},
		{"down, fail-open", true, down},
		{"unreachable, fail-open", true, unreachable},
		{"slow, fail-closed", false, slow},
		{"slow, fail-open", true, slow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.mw(t, tt.failOpen)
			// Far longer than quick: the middleware's own deadline must
			// end its calls, not the caller's.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()

			t.Run("dispatch", func(t *testing.T) {
				a, conn := dispatchTo(t, m)
				start := time.Now()
				out, err := callAgent(ctx, conn, "execute", "forbidden")
				if d := time.Since(start); d > within {
					t.Errorf("took %v", d)
				}
				if tt.failOpen {
					if err != nil || out != "echo: forbidden" || !equal(a.got(), []string{"forbidden"}) {
						t.Fatalf("fail-open did not proceed: %v %q %q", err, out, a.got())
					}
					return
				}
				wantStatus(t, err, codes.Unavailable, m.Name())
				if len(a.got()) != 0 {
					t.Fatalf("fail-closed dispatched anyway")
				}
			})
			t.Run("store", func(t *testing.T) {
				mem, c, _ := stateBehind(t, m)
				sc := scope.Global()
				start := time.Now()
				_, err := c.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: "forbidden", Value: structpb.NewStringValue("v")})
				if d := time.Since(start); d > within {
					t.Errorf("took %v", d)
				}
				_, readErr := mem.Read(ctx, sc, "forbidden")
				if tt.failOpen {
					if err != nil || readErr != nil {
						t.Fatalf("fail-open did not proceed: %v, stored: %v", err, readErr)
					}
					return
				}
				wantStatus(t, err, codes.Unavailable, m.Name())
				if readErr == nil {
					t.Fatal("fail-closed wrote anyway")
				}
			})
			t.Run("exec", func(t *testing.T) {
				a, conn := execBehind(t, m)
				msgs, err := stream(t, conn, "forbidden")
				if tt.failOpen {
					if err != nil || len(msgs) != 2 || !equal(a.got(), []string{"forbidden"}) {
						t.Fatalf("fail-open did not proceed: %v %v", err, msgs)
					}
					return
				}
				wantStatus(t, err, codes.Unavailable, m.Name())
			})
		})
	}
}

// TestCallerGivesUp: when the caller's own deadline ends first, the call
// fails DEADLINE_EXCEEDED (not a verdict, not fail-open).
func TestCallerGivesUp(t *testing.T) {
	m := startPolicy(t, &policy{name: "slow", slow: true}, Config{Timeout: time.Minute, FailOpen: true})
	a, conn := dispatchTo(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), quick)
	defer cancel()
	_, err := callAgent(ctx, conn, "execute", "hello")
	wantStatus(t, err, codes.DeadlineExceeded)
	if len(a.got()) != 0 {
		t.Fatal("dispatched after the caller gave up")
	}
}

// TestSubscriptions: only the boundary/phase pairs Describe lists are
// sent.
func TestSubscriptions(t *testing.T) {
	p := &policy{name: "before-only", subs: []*middlewarev1.Subscription{{Boundary: dispatchBoundary, Phase: before}}}
	m := startPolicy(t, p, Config{})
	a, conn := dispatchTo(t, m)
	out, err := callAgent(context.Background(), conn, "execute", "tell secret")
	if err != nil || out != "secret answer" {
		t.Fatalf("got %q, %v; want the unmodified output", out, err)
	}
	if _, err := callAgent(context.Background(), conn, "execute", "forbidden"); errs.Code(err) != codes.PermissionDenied {
		t.Fatalf("before not applied: %v", err)
	}
	_, c, _ := stateBehind(t, m)
	if _, err := c.Write(context.Background(), &statev1.WriteRequest{Scope: scope.Global(), Key: "forbidden", Value: structpb.NewStringValue("v")}); err != nil {
		t.Fatalf("store not subscribed, yet: %v", err)
	}
	_, econn := execBehind(t, m)
	if msgs, err := stream(t, econn, "forbidden"); err != nil || len(msgs) != 2 {
		t.Fatalf("exec not subscribed, yet: %v %v", msgs, err)
	}
	want := map[point]int{{dispatchBoundary, before}: 2}
	for _, b := range []middlewarev1.Boundary{dispatchBoundary, storeBoundary, execBoundary} {
		for _, ph := range []middlewarev1.Phase{before, after} {
			if got := p.callsAt(b, ph); got != want[point{b, ph}] {
				t.Errorf("%s: %d calls, want %d", point{b, ph}, got, want[point{b, ph}])
			}
		}
	}
	if got := a.got(); !equal(got, []string{"tell secret"}) {
		t.Errorf("agent received %q", got)
	}
}

func TestNew(t *testing.T) {
	ctx := context.Background()
	t.Run("Describe unreachable, fail-closed: an error", func(t *testing.T) {
		_, err := New(ctx, middlewarev1.NewMiddlewareServiceClient(dial(t, closedAddr(t))), Config{Timeout: quick})
		if !errors.Is(err, errs.Unavailable) || !strings.Contains(err.Error(), "Describe") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("Describe slow, fail-closed: an error in time", func(t *testing.T) {
		_, addr := listen(t, func(s *grpc.Server) { middlewarev1.RegisterMiddlewareServiceServer(s, &blockedDescribe{}) })
		start := time.Now()
		_, err := New(ctx, middlewarev1.NewMiddlewareServiceClient(dial(t, addr)), Config{Timeout: quick})
		if !errors.Is(err, errs.Unavailable) || time.Since(start) > within {
			t.Fatalf("got %v after %v", err, time.Since(start))
		}
	})
	t.Run("Describe unreachable, fail-open: everything is sent", func(t *testing.T) {
		m, err := New(ctx, middlewarev1.NewMiddlewareServiceClient(dial(t, closedAddr(t))), Config{Timeout: quick, FailOpen: true})
		if err != nil || m.Name() == "" || !m.wants(storeBoundary, after) || !m.wants(dispatchBoundary, before) {
			t.Fatalf("got %v, %v", m, err)
		}
	})
	for _, tt := range []struct {
		name string
		subs []*middlewarev1.Subscription
	}{
		{"no subscriptions", []*middlewarev1.Subscription{}},
		{"unspecified phase", []*middlewarev1.Subscription{{Boundary: storeBoundary}}},
		{"unknown boundary", []*middlewarev1.Subscription{{Boundary: 9, Phase: before}}},
	} {
		t.Run(tt.name+": an error", func(t *testing.T) {
			p := &policy{name: "bad", subs: tt.subs}
			_, addr := listen(t, func(s *grpc.Server) { middlewarev1.RegisterMiddlewareServiceServer(s, p) })
			if _, err := New(ctx, middlewarev1.NewMiddlewareServiceClient(dial(t, addr)), Config{FailOpen: true}); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// blockedDescribe answers Describe only when the caller gives up.
type blockedDescribe struct {
	middlewarev1.UnimplementedMiddlewareServiceServer
}

func (blockedDescribe) Describe(ctx context.Context, _ *middlewarev1.DescribeRequest) (*middlewarev1.DescribeResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestFlagsAndDial(t *testing.T) {
	ctx := context.Background()
	var f Flags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	f.Bind(fs)
	if f.Client.Timeout != DefaultTimeout {
		t.Errorf("default timeout %v", f.Client.Timeout)
	}
	m, closeFn, err := Dial(ctx, f, nil)
	if m != nil || err != nil || closeFn == nil {
		t.Fatalf("no address: got %v, %v", m, err)
	}
	closeFn()

	_, addr := listen(t, func(s *grpc.Server) { middlewarev1.RegisterMiddlewareServiceServer(s, &policy{name: "dialed"}) })
	if err := fs.Parse([]string{"--middleware-addr", addr, "--middleware-timeout", "300ms", "--middleware-fail-open"}); err != nil {
		t.Fatal(err)
	}
	if f.Client.Target != addr || f.Client.Timeout != 300*time.Millisecond || !f.FailOpen {
		t.Fatalf("flags not bound: %+v", f)
	}
	f.Client.Dev = true
	m, closeFn, err = Dial(ctx, f, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if m.Name() != "dialed" || m.timeout != 300*time.Millisecond || !m.failOpen {
		t.Fatalf("Dial: name %q timeout %v failOpen %v", m.Name(), m.timeout, m.failOpen)
	}

	f.FailOpen = false
	f.Client.Target = closedAddr(t)
	if _, _, err := Dial(ctx, f, nil); !errors.Is(err, errs.Unavailable) || !strings.Contains(err.Error(), f.Client.Target) {
		t.Fatalf("unreachable middleware, fail-closed: %v", err)
	}
}
