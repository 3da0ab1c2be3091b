package environment_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/environment"
)

// loggingBackend logs what a sandbox could make a backend, bridge or
// proxy log: the injected value itself and transforms of it, as a key,
// a host name and inside an error.
type loggingBackend struct{ secret string }

func (loggingBackend) Name() string { return "logging" }

func (loggingBackend) Check(*environmentv1.EnvironmentSpec) error { return nil }

func (b loggingBackend) Run(_ context.Context, inv *environment.Invocation) (*environment.Result, error) {
	inv.Log.Info("state read failed", "key", b.secret)
	inv.Log.Warn("egress denied", "host", strings.ToUpper(b.secret)+".attacker.example")
	inv.Log.With("scope", base64.StdEncoding.EncodeToString([]byte(b.secret))).Error("refused " + b.secret)
	return &environment.Result{Output: &operatorv1.OperatorOutput{Message: content.Text("done")}}, nil
}

// Every log line of an invocation, whoever writes it, is scrubbed of
// the invocation's injected values.
func TestInvocationLogsScrubbed(t *testing.T) {
	const secret = "tok-log-side-channel-83117"
	e := startEnv(t, envOptions{
		secrets:   environment.MapSecrets{"api": secret},
		extra:     []environment.Backend{loggingBackend{secret: secret}},
		container: "logging",
	})
	spec := &environmentv1.EnvironmentSpec{
		Isolation: []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{}}}},
		Credentials: []*environmentv1.CredentialRef{{Name: "api", Injection: &environmentv1.CredentialInjection{
			Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "API_TOKEN"}},
		}}},
	}
	if _, err := e.run(t, "hi", spec); err != nil {
		t.Fatal(err)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "egress denied") || !strings.Contains(logs, "[REDACTED]") {
		t.Fatalf("the backend's lines are missing or unscrubbed:\n%s", logs)
	}
	for _, form := range []string{secret, strings.ToUpper(secret), base64.StdEncoding.EncodeToString([]byte(secret))} {
		if strings.Contains(logs, form) {
			t.Errorf("the logs hold %q:\n%s", form, logs)
		}
	}
}
