package environment_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/workspace"
)

// byRef stands in for a backend that hands credentials over by
// reference (the kubernetes backend) and runs no sandbox sessions.
type byRef struct{ *acceptAll }

func (byRef) Name() string             { return "by-ref" }
func (byRef) SecretsByReference() bool { return true }

// TestByReferenceSidecar: for a by-reference backend the server resolves
// a sidecar credential's value from its own secrets (its egress proxy
// injects it; the kubernetes backend serves that proxy to the pod) and
// leaves the others unresolved (the platform hands them over); and
// CreateSandbox on a backend that runs no sessions is FAILED_PRECONDITION
// naming the backends that do.
func TestByReferenceSidecar(t *testing.T) {
	const key = "sk-sidecar-by-ref-0123456789"
	b := byRef{&acceptAll{}}
	var proxied []environment.Credential
	store, err := workspace.Open(t.TempDir(), 1<<20, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := environment.NewServer(environment.ServerConfig{
		Backends: []environment.Backend{b}, Default: b.Name(), Workspaces: store,
		Secrets: environment.MapSecrets{"OPENAI_API_KEY": key, "agent-token": "never-resolved-0123456789"},
		Egress: func(_ string, _ environment.NetworkPolicy, creds []environment.Credential, _ *slog.Logger) (func(), error) {
			proxied = creds
			return func() {}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec := &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{
		{Name: "OPENAI_API_KEY", Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_Sidecar{Sidecar: &environmentv1.SidecarInjection{Host: "api.openai.com"}}}},
		{Name: "agent-token", Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "AGENT_TOKEN"}}}},
	}}
	b.startEgress = true
	if _, err := s.Run(context.Background(), &environmentv1.RunRequest{Input: &operatorv1.OperatorInput{Message: content.Text("hi")}, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	if b.count() != 1 {
		t.Fatalf("%d runs", b.count())
	}
	inv := b.runs[0]
	if inv.Credentials[0].Value != key || inv.Credentials[1].Value != "" {
		t.Errorf("credential values %q, %q: want the sidecar's resolved and the env var's by reference", inv.Credentials[0].Value, inv.Credentials[1].Value)
	}
	if len(proxied) != 2 || proxied[0].Value != key {
		t.Errorf("the egress proxy got %+v, want the sidecar's value", proxied)
	}

	_, err = s.CreateSandbox(context.Background(), &environmentv1.CreateSandboxRequest{Spec: &environmentv1.EnvironmentSpec{}})
	if errs.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "process and docker") {
		t.Errorf("CreateSandbox on a backend without sessions: %v, want FAILED_PRECONDITION naming the ones with", err)
	}
}
