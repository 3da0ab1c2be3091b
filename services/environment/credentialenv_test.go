package environment_test

import (
	"slices"
	"testing"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/operator/provider/providers"
)

func sidecar(host string) environment.Credential {
	return environment.Credential{Name: host, Value: "secret", Injection: &environmentv1.CredentialInjection{
		Method: &environmentv1.CredentialInjection_Sidecar{Sidecar: &environmentv1.SidecarInjection{Host: host}}}}
}

// CredentialEnv gives the operator an env_var credential's variable, and
// for a sidecar credential of a provider's public API host that
// provider's base URL through the egress proxy (plain http over its
// socket) and a placeholder key, never the secret.
func TestCredentialEnv(t *testing.T) {
	envVar := environment.Credential{Name: "tok", Value: "v1", Injection: &environmentv1.CredentialInjection{
		Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "GITHUB_TOKEN"}}}}
	got := environment.CredentialEnv([]environment.Credential{
		sidecar("API.Anthropic.com"), envVar, sidecar("api.openai.com"), sidecar("generativelanguage.googleapis.com"), sidecar("example.com"),
	})
	want := []string{
		"ANTHROPIC_API_KEY=" + environment.SidecarPlaceholder,
		"ANTHROPIC_BASE_URL=http://api.anthropic.com",
		"GEMINI_API_KEY=" + environment.SidecarPlaceholder,
		"GITHUB_TOKEN=v1",
		"GOOGLE_GEMINI_BASE_URL=http://generativelanguage.googleapis.com",
		"OPENAI_API_KEY=" + environment.SidecarPlaceholder,
		"OPENAI_BASE_URL=http://api.openai.com/v1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("CredentialEnv\n got %q\nwant %q", got, want)
	}
}

// Every provider with a public API has its sidecar wiring, derived from
// providers.All: its base URL variable and its first key variable.
func TestCredentialEnvCoversProviders(t *testing.T) {
	for _, d := range providers.All() {
		if d.Host == "" {
			continue
		}
		got := environment.CredentialEnv([]environment.Credential{sidecar(d.Host)})
		want := []string{d.BaseURLEnv + "=http://" + d.Host + d.BasePath, d.KeyEnv[0] + "=" + environment.SidecarPlaceholder}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("provider %q: %q, want %q", d.Name, got, want)
		}
	}
}
