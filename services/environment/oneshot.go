package environment

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/status"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/telemetry"
	"github.com/secbear/neuron/services/operator/provider/providers"
)

// One-shot exit codes of the operator binary (see operator.RunOneShot).
const (
	exitComplete   = 0
	exitConfig     = 2
	exitNotDone    = 3
	exitStatusBase = 10
)

// OneShotArgs are the arguments every backend passes to the operator
// binary after its configured ones: one-shot mode with JSON logs on
// stderr.
func OneShotArgs() []string { return []string{"--one-shot", "--log-format", "json"} }

// DecodeOutput turns what the one-shot operator wrote on stdout, and its
// exit code, into its output or the error it reported. stderr is quoted
// (its last line) when the operator failed without a status. A backend
// calls it only for a process that exited by itself, not one it killed.
func DecodeOutput(stdout, stderr []byte, exitCode int) (*operatorv1.OperatorOutput, error) {
	switch {
	case exitCode == exitComplete || exitCode == exitNotDone:
		out := &operatorv1.OperatorOutput{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(bytes.TrimSpace(stdout), out); err != nil {
			return nil, fmt.Errorf("the operator exited %d but its stdout is not an OperatorOutput (%v): %w", exitCode, err, errs.Internal)
		}
		return out, nil
	case exitCode >= exitStatusBase && exitCode < exitStatusBase+17:
		st := &status.Status{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(bytes.TrimSpace(stdout), st); err != nil || st.GetCode() == 0 {
			return nil, fmt.Errorf("the operator failed with exit code %d (%s) without a status on stdout: %w", exitCode, LastLine(stderr), errs.Internal)
		}
		return nil, errs.FromGRPC(grpcstatus.FromProto(st).Err())
	case exitCode == exitConfig:
		return nil, fmt.Errorf("the operator binary refused its configuration (%s); check the environment service's operator flags: %w", LastLine(stderr), errs.Internal)
	default:
		return nil, fmt.Errorf("the operator exited with code %d (%s): %w", exitCode, LastLine(stderr), errs.Internal)
	}
}

// LastLine is the last non-empty line of b (an operator's stderr), at
// most 500 bytes, for error messages. It is valid UTF-8 (each byte that
// is not, a U+FFFD): a status message must be.
func LastLine(b []byte) string {
	_, b = telemetry.CutSpans(b) // not a diagnostic
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	s := strings.TrimSpace(lines[len(lines)-1])
	if s == "" {
		return "no diagnostic output"
	}
	if len(s) > 500 {
		s = s[:500] + "..."
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// SidecarPlaceholder is the API key the operator is given for a
// credential the egress proxy injects: providers refuse to start without
// a key, and the proxy replaces this one on the way out.
const SidecarPlaceholder = "injected-by-the-egress-proxy"

// sidecarEnv returns the environment variables that point the provider
// whose public API is at host (providers.All) at the egress proxy, and
// give it a placeholder key: its base URL variable and its first key
// variable. Plain http:// is right: the request travels over the proxy's
// Unix socket, and the proxy speaks TLS to the real host. A host no
// provider has gets nothing.
func sidecarEnv(host string) []string {
	for _, d := range providers.All() {
		if d.Host != "" && strings.EqualFold(d.Host, host) && len(d.KeyEnv) > 0 {
			return []string{d.BaseURLEnv + "=http://" + d.Host + d.BasePath, d.KeyEnv[0] + "=" + SidecarPlaceholder}
		}
	}
	return nil
}

// CredentialEnv returns the environment entries (KEY=VALUE, sorted) the
// operator gets for creds: each env_var credential's variable, and for
// each sidecar credential of a model API host the operator knows, its
// provider's base URL through the egress proxy and a placeholder key.
// Credentials injected as files or by reference are not included.
func CredentialEnv(creds []Credential) []string {
	var env []string
	for _, c := range creds {
		switch m := c.Injection.GetMethod().(type) {
		case *environmentv1.CredentialInjection_EnvVar:
			env = append(env, m.EnvVar.GetVarName()+"="+c.Value)
		case *environmentv1.CredentialInjection_Sidecar:
			env = append(env, sidecarEnv(m.Sidecar.GetHost())...)
		}
	}
	sort.Strings(env)
	return env
}

// SidecarEnv returns the environment entries (sorted) of creds' sidecar
// credentials alone: for each of a model API host the operator knows,
// its provider's base URL through the egress proxy and a placeholder key
// (as CredentialEnv). It holds no credential's value.
func SidecarEnv(creds []Credential) []string {
	var env []string
	for _, c := range creds {
		if s := c.Injection.GetSidecar(); s != nil {
			env = append(env, sidecarEnv(s.GetHost())...)
		}
	}
	sort.Strings(env)
	return env
}
