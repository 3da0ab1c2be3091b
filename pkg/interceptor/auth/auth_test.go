package auth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/secbear/neuron/pkg/errs"
)

func TestAllowed(t *testing.T) {
	p := Principal{Name: "op", Allow: []string{"/layer0.state.v1.StateService/Read", "/layer0.operator.v1.OperatorService/*"}}
	tests := map[string]bool{
		"/layer0.state.v1.StateService/Read":            true,
		"/layer0.state.v1.StateService/ReadMore":        false,
		"/layer0.state.v1.StateService/Write":           false,
		"/layer0.operator.v1.OperatorService/Execute":   true,
		"/layer0.operator.v1.OperatorServiceX/Execute":  false,
		"/layer0.orchestrator.v1.OrchestratorService/Q": false,
	}
	for m, want := range tests {
		if got := p.Allowed(m); got != want {
			t.Errorf("%s: %v, want %v", m, got, want)
		}
	}
	all := Principal{Allow: []string{"*"}}
	if !all.Allowed("/any/Method") {
		t.Error("* must allow everything")
	}
}

func TestNewPolicyRejects(t *testing.T) {
	long := "0123456789abcdef"
	tests := []struct {
		name string
		ps   []Principal
		want string
	}{
		{"empty", nil, "no principals"},
		{"no name", []Principal{{Allow: []string{"*"}}}, "name is empty"},
		{"duplicate", []Principal{{Name: "a", Allow: []string{"*"}}, {Name: "a", Allow: []string{"*"}}}, "twice"},
		{"no allow", []Principal{{Name: "a"}}, "allow is empty"},
		{"bad pattern", []Principal{{Name: "a", Allow: []string{"State/Read"}}}, "must be"},
		{"short token", []Principal{{Name: "a", Tokens: []string{"short"}, Allow: []string{"*"}}}, "shorter"},
		{"shared token", []Principal{{Name: "a", Tokens: []string{long}, Allow: []string{"*"}}, {Name: "b", Tokens: []string{long}, Allow: []string{"*"}}}, "shared"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPolicy(tt.ps)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want error containing %q", err, tt.want)
			}
		})
	}
}

func TestLoadPolicyUnknownField(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.json")
	os.WriteFile(path, []byte(`{"principals":[{"name":"a","allow":["*"],"alow":["x"]}]}`), 0o600)
	if _, err := LoadPolicy(path); err == nil || !strings.Contains(err.Error(), "alow") {
		t.Fatalf("typo in policy accepted: %v", err)
	}
}

// fakeTransport lets grpc.Method work in a unit test.
type fakeTransport struct{ grpc.ServerTransportStream }

func (fakeTransport) Method() string { return "/layer0.state.v1.StateService/Write" }

func TestInterceptorWithFakeHandler(t *testing.T) {
	p, err := NewPolicy([]Principal{{Name: "reader", Tokens: []string{"reader-token-0123456789"}, Allow: []string{"/layer0.state.v1.StateService/Read"}}})
	if err != nil {
		t.Fatal(err)
	}
	ic := UnaryServerInterceptor(p)
	ctx := grpc.NewContextWithServerTransportStream(context.Background(), fakeTransport{})
	ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer reader-token-0123456789"))
	called := false
	_, err = ic(ctx, nil, &grpc.UnaryServerInfo{FullMethod: fakeTransport{}.Method()}, func(context.Context, any) (any, error) {
		called = true
		return nil, nil
	})
	if !errors.Is(err, errs.PermissionDenied) || called {
		t.Fatalf("write with read-only token: err=%v called=%v", err, called)
	}
}
