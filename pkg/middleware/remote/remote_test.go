package remote_test

import (
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/middleware/internal/boundarytest"
	"github.com/secbear/neuron/pkg/middleware/remote"
)

// What the middleware does at each boundary (verdicts, failures,
// deadlines, subscriptions) is the boundaries' shared suite
// (internal/boundarytest), run by the tests of pkg/middleware/dispatch,
// store and exec. These are the tests of starting one.

var (
	before = middlewarev1.Phase_PHASE_BEFORE
	after  = middlewarev1.Phase_PHASE_AFTER
)

func TestNew(t *testing.T) {
	ctx := context.Background()
	unreachable := func(t *testing.T) middlewarev1.MiddlewareServiceClient {
		return middlewarev1.NewMiddlewareServiceClient(boundarytest.Dial(t, boundarytest.ClosedAddr(t)))
	}
	t.Run("Describe unreachable, fail-closed: an error", func(t *testing.T) {
		_, err := remote.New(ctx, unreachable(t), remote.Config{Timeout: boundarytest.Quick})
		if !errors.Is(err, errs.Unavailable) || !strings.Contains(err.Error(), "Describe") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("Describe slow, fail-closed: an error in time", func(t *testing.T) {
		_, client := boundarytest.ServePolicy(t, boundarytest.BlockedDescribe{})
		start := time.Now()
		_, err := remote.New(ctx, client, remote.Config{Timeout: boundarytest.Quick})
		if !errors.Is(err, errs.Unavailable) || time.Since(start) > boundarytest.Within {
			t.Fatalf("got %v after %v", err, time.Since(start))
		}
	})
	t.Run("Describe unreachable, fail-open: everything is sent", func(t *testing.T) {
		m, err := remote.New(ctx, unreachable(t), remote.Config{Timeout: boundarytest.Quick, FailOpen: true})
		if err != nil || m.Name() == "" {
			t.Fatalf("got %v, %v", m, err)
		}
		for _, b := range boundarytest.Boundaries {
			for _, ph := range boundarytest.Phases {
				if !m.Wants(b, ph) {
					t.Errorf("%v %v not sent", b, ph)
				}
			}
		}
	})
	t.Run("only what Describe lists is sent", func(t *testing.T) {
		p := &boundarytest.Policy{Name: "p", Subs: []*middlewarev1.Subscription{{Boundary: middlewarev1.Boundary_BOUNDARY_STORE, Phase: after}}}
		m := boundarytest.StartPolicy(t, p, remote.Config{})
		for _, b := range boundarytest.Boundaries {
			for _, ph := range boundarytest.Phases {
				if want := b == middlewarev1.Boundary_BOUNDARY_STORE && ph == after; m.Wants(b, ph) != want {
					t.Errorf("%v %v sent: %v, want %v", b, ph, !want, want)
				}
			}
		}
	})
	for _, tt := range []struct {
		name string
		subs []*middlewarev1.Subscription
	}{
		{"no subscriptions", []*middlewarev1.Subscription{}},
		{"unspecified phase", []*middlewarev1.Subscription{{Boundary: middlewarev1.Boundary_BOUNDARY_STORE}}},
		{"unknown boundary", []*middlewarev1.Subscription{{Boundary: 9, Phase: before}}},
	} {
		t.Run(tt.name+": an error", func(t *testing.T) {
			_, client := boundarytest.ServePolicy(t, &boundarytest.Policy{Name: "bad", Subs: tt.subs})
			if _, err := remote.New(ctx, client, remote.Config{FailOpen: true}); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestFlagsAndDial(t *testing.T) {
	ctx := context.Background()
	var f remote.Flags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	f.Bind(fs)
	if f.Client.Timeout != remote.DefaultTimeout {
		t.Errorf("default timeout %v", f.Client.Timeout)
	}
	m, closeFn, err := remote.Dial(ctx, f, nil)
	if m != nil || err != nil || closeFn == nil {
		t.Fatalf("no address: got %v, %v", m, err)
	}
	closeFn()

	_, addr := boundarytest.Listen(t, func(s *grpc.Server) {
		middlewarev1.RegisterMiddlewareServiceServer(s, &boundarytest.Policy{Name: "dialed"})
	})
	if err := fs.Parse([]string{"--middleware-addr", addr, "--middleware-timeout", "300ms", "--middleware-fail-open"}); err != nil {
		t.Fatal(err)
	}
	if f.Client.Target != addr || f.Client.Timeout != 300*time.Millisecond || !f.FailOpen {
		t.Fatalf("flags not bound: %+v", f)
	}
	f.Client.Dev = true
	m, closeFn, err = remote.Dial(ctx, f, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if timeout, failOpen := m.Settings(); m.Name() != "dialed" || timeout != 300*time.Millisecond || !failOpen {
		t.Fatalf("Dial: name %q timeout %v failOpen %v", m.Name(), timeout, failOpen)
	}

	f.FailOpen = false
	f.Client.Target = boundarytest.ClosedAddr(t)
	if _, _, err := remote.Dial(ctx, f, nil); !errors.Is(err, errs.Unavailable) || !strings.Contains(err.Error(), f.Client.Target) {
		t.Fatalf("unreachable middleware, fail-closed: %v", err)
	}
}

// lateContext has a deadline that has passed by the clock while its own
// timer has not run yet (Err is nil): the moment a middleware's server,
// timing the same deadline, may already have ended the call.
type lateContext struct{ context.Context }

func (lateContext) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// expiredMiddleware answers Describe, and every Intercept call with
// DEADLINE_EXCEEDED, as a server whose deadline passed.
type expiredMiddleware struct {
	middlewarev1.MiddlewareServiceClient
}

func (expiredMiddleware) Describe(context.Context, *middlewarev1.DescribeRequest, ...grpc.CallOption) (*middlewarev1.DescribeResponse, error) {
	return &middlewarev1.DescribeResponse{Name: "late", Subscriptions: boundarytest.Subscribe(boundarytest.Boundaries...)}, nil
}

func (expiredMiddleware) InterceptDispatch(context.Context, *middlewarev1.InterceptDispatchRequest, ...grpc.CallOption) (*middlewarev1.InterceptDispatchResponse, error) {
	return nil, status.Error(codes.DeadlineExceeded, "deadline exceeded")
}

// TestDeadlinePassedIsTheCallerGivingUp: a middleware call that fails once
// the caller's deadline has passed is the caller giving up, even before
// the caller's context says so: DEADLINE_EXCEEDED, and fail-open does not
// let the call proceed.
func TestDeadlinePassedIsTheCallerGivingUp(t *testing.T) {
	m, err := remote.New(context.Background(), expiredMiddleware{}, remote.Config{FailOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	invoked := false
	err = m.DispatchClientInterceptor()(lateContext{context.Background()}, "/layer0.operator.v1.OperatorService/Execute",
		&operatorv1.ExecuteRequest{Input: boundarytest.Input(boundarytest.Continue)}, &operatorv1.ExecuteResponse{}, nil,
		func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			invoked = true
			return nil
		})
	boundarytest.WantStatus(t, err, codes.DeadlineExceeded)
	if invoked {
		t.Fatal("the agent was called after the caller's deadline")
	}
}
