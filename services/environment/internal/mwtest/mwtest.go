// Package mwtest is the exec-boundary middleware set-up the environment
// service's middleware tests share (the service's own, through
// environment.Run, and the binary's, in cmd/environment): a
// MiddlewareService subscribed to the exec boundary before and after,
// served on a loopback port for the test's life, that records what it
// was shown.
//
// It is a test helper: no program should import it.
package mwtest

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
)

// Policy is a MiddlewareService at the exec boundary (before and after)
// that answers each InterceptExec with Decide and records one line per
// call, made by Decide's caller through Record.
type Policy struct {
	middlewarev1.UnimplementedMiddlewareServiceServer
	// Name is what Describe answers.
	Name string
	// Decide answers an InterceptExec; nil continues.
	Decide func(r *middlewarev1.InterceptExecRequest) (*middlewarev1.InterceptExecResponse, error)
	// Line is the line recorded for each call; nil records the phase.
	Line func(r *middlewarev1.InterceptExecRequest) string

	mu    sync.Mutex
	calls []string
}

// Describe subscribes to the exec boundary, before and after.
func (p *Policy) Describe(context.Context, *middlewarev1.DescribeRequest) (*middlewarev1.DescribeResponse, error) {
	return &middlewarev1.DescribeResponse{Name: p.Name, Subscriptions: []*middlewarev1.Subscription{
		{Boundary: middlewarev1.Boundary_BOUNDARY_EXEC, Phase: middlewarev1.Phase_PHASE_BEFORE},
		{Boundary: middlewarev1.Boundary_BOUNDARY_EXEC, Phase: middlewarev1.Phase_PHASE_AFTER},
	}}, nil
}

// InterceptExec records the call and answers with Decide.
func (p *Policy) InterceptExec(_ context.Context, r *middlewarev1.InterceptExecRequest) (*middlewarev1.InterceptExecResponse, error) {
	line := r.GetPhase().String()
	if p.Line != nil {
		line = p.Line(r)
	}
	p.mu.Lock()
	p.calls = append(p.calls, line)
	p.mu.Unlock()
	if p.Decide == nil {
		return Verdict(middlewarev1.VerdictKind_VERDICT_KIND_CONTINUE, ""), nil
	}
	return p.Decide(r)
}

// Calls returns the recorded lines, in order.
func (p *Policy) Calls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...)
}

// Seen returns the recorded lines joined by newlines.
func (p *Policy) Seen() string { return strings.Join(p.Calls(), "\n") }

// Verdict is a response of kind k with reason.
func Verdict(k middlewarev1.VerdictKind, reason string) *middlewarev1.InterceptExecResponse {
	return &middlewarev1.InterceptExecResponse{Verdict: &middlewarev1.Verdict{Kind: k, Reason: reason}}
}

// Serve serves p on a loopback port until the test ends and returns its
// address.
func Serve(t testing.TB, p middlewarev1.MiddlewareServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	middlewarev1.RegisterMiddlewareServiceServer(s, p)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}
