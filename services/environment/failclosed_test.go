package environment_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/local"
)

func boundary(b *environmentv1.IsolationBoundary) *environmentv1.EnvironmentSpec {
	return &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{b}}
}

func envCred(name, v string) *environmentv1.CredentialRef {
	return &environmentv1.CredentialRef{Name: name, Injection: &environmentv1.CredentialInjection{
		Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: v}}}}
}

// Specs the service cannot enforce are refused before anything runs,
// with FAILED_PRECONDITION naming what is missing; malformed ones are
// INVALID_ARGUMENT and unknown credentials NOT_FOUND.
func TestFailClosed(t *testing.T) {
	e := startEnv(t, envOptions{secrets: environment.MapSecrets{"k": "v-123456789"}})
	for _, tc := range []struct {
		name string
		spec *environmentv1.EnvironmentSpec
		code codes.Code
		says []string
	}{
		{"gvisor without a container backend", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Gvisor{Gvisor: &environmentv1.GvisorIsolation{}}}),
			codes.FailedPrecondition, []string{"container backend"}},
		{"container without a container backend", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{}}}),
			codes.FailedPrecondition, []string{"container backend", "process"}},
		{"microvm", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Microvm{Microvm: &environmentv1.MicroVmIsolation{}}}),
			codes.FailedPrecondition, []string{"microvm"}},
		{"wasm", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Wasm{Wasm: &environmentv1.WasmIsolation{}}}),
			codes.FailedPrecondition, []string{"wasm"}},
		{"custom", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Custom{Custom: &environmentv1.CustomIsolation{BoundaryType: "acme.dev/enclave"}}}),
			codes.FailedPrecondition, []string{"custom:acme.dev/enclave"}},
		{"gpu", &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Gpu: proto.String("1")}},
			codes.FailedPrecondition, []string{"GPU"}},
		{"file credential over the users file", fileSpec("/etc/passwd"), codes.FailedPrecondition, []string{`"/etc/passwd"`, "users"}},
		{"file credential as the loader's preload list", fileSpec("/etc/ld.so.preload"), codes.FailedPrecondition, []string{"dynamic loader"}},
		{"file credential under /proc", fileSpec("/proc/self/environ"), codes.FailedPrecondition, []string{"/proc"}},
		{"file credential over a system directory", fileSpec("/usr/bin"), codes.FailedPrecondition, []string{"system directory"}},
		{"file credential in the workspace's grants", fileSpec("/usr/lib/neuron-secret"), codes.FailedPrecondition, []string{"file credential", "granted"}},
		{"credential as LD_PRELOAD", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{envCred("k", "LD_PRELOAD")}},
			codes.FailedPrecondition, []string{"LD_PRELOAD", "dynamic loader"}},
		{"credential as PATH", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{envCred("k", "path")}},
			codes.FailedPrecondition, []string{`"path"`, "programs run"}},
		{"credential as BASH_ENV", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{envCred("k", "BASH_ENV")}},
			codes.FailedPrecondition, []string{"BASH_ENV"}},
		{"file credential hiding system files", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{Name: "k", Injection: &environmentv1.CredentialInjection{
			Method: &environmentv1.CredentialInjection_File{File: &environmentv1.FileInjection{Path: "/usr/local/neuron-secret/k"}}}}}},
			codes.FailedPrecondition, []string{"file credential", "granted"}},
		{"unknown credential", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{envCred("nope", "X")}},
			codes.NotFound, []string{`"nope"`}},
		{"same variable twice", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{envCred("k", "X"), envCred("k", "X")}},
			codes.InvalidArgument, []string{"X is injected twice"}},
		{"bad memory quantity", &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Memory: proto.String("lots")}},
			codes.InvalidArgument, []string{"resources.memory", "512Mi"}},
		{"bad network destination", &environmentv1.EnvironmentSpec{Network: &environmentv1.NetworkPolicy{Rules: []*environmentv1.NetworkRule{{
			Destination: "http://x/", Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW}}}},
			codes.InvalidArgument, []string{"network.rules[0]"}},
		{"timeout over the maximum", &environmentv1.EnvironmentSpec{Timeout: durationpb.New(48 * time.Hour)},
			codes.InvalidArgument, []string{"spec.timeout"}},
		{"sidecar with a bad header", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{Name: "k", Injection: &environmentv1.CredentialInjection{
			Method: &environmentv1.CredentialInjection_Sidecar{Sidecar: &environmentv1.SidecarInjection{Host: "api.example.com", Header: "x api key"}}}}}},
			codes.InvalidArgument, []string{"header"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.run(t, "hi", tc.spec)
			wantCode(t, err, tc.code, tc.says...)
		})
	}
	// Validation from the contract runs first: a missing spec.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := e.client.Run(ctx, &environmentv1.RunRequest{Input: &operatorv1.OperatorInput{}})
	wantCode(t, err, codes.InvalidArgument)
}

// The local backend forwards to a running operator service, and refuses
// anything that asks for isolation.
func TestLocalBackend(t *testing.T) {
	bin := operatorBinary(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port := freePort(t)
	cmd := exec.CommandContext(ctx, bin, "--dev", "--addr", "127.0.0.1:"+port, "--tools", "", "--log-format", "text")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	operator := grpcclient.Config{Target: "127.0.0.1:" + port, Dev: true, Plaintext: true, Timeout: time.Minute}
	// What `--backend local --operator-addr 127.0.0.1:PORT` starts.
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return environment.Run(ctx, environment.Config{
			Server:   grpcserver.Config{Name: "environment", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:      harness.Logger(t),
			Listener: lis,
			Backend:  "local",
			Operator: operator,
		})
	})
	es := dialEnv(t, addr)
	in := &operatorv1.OperatorInput{Message: textContent("hello local")}
	var (
		resp *environmentv1.RunResponse
		err  error
	)
	for i := 0; i < 100; i++ { // the operator process may still be starting
		resp, err = es.Run(ctx, &environmentv1.RunRequest{Input: in, Spec: &environmentv1.EnvironmentSpec{}})
		if err == nil || !strings.Contains(err.Error(), "connect") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBackend() != "local" || !strings.Contains(text(resp), "You said: hello local") {
		t.Errorf("response %v", resp)
	}
	// RunStream goes through the operator service's ExecuteStream: the
	// answer's text deltas, the model call, then Run's result.
	s, err := es.RunStream(ctx, &environmentv1.RunStreamRequest{Input: in, Spec: &environmentv1.EnvironmentSpec{}})
	if err != nil {
		t.Fatal(err)
	}
	got := readStream(s)
	if all, _ := got.deltas(1); got.err != nil || all != text(resp) || text(got.result) != text(resp) ||
		strings.Join(got.kinds(), " ") != "text:1 model:1" {
		t.Errorf("RunStream on the local backend: %v, progress %v, result %v", got.err, got.progress, got.result)
	}
	conn, err := grpcclient.Dial(operator)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lb := local.New(operatorv1.NewOperatorServiceClient(conn))
	for _, spec := range []*environmentv1.EnvironmentSpec{
		boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}),
		{Resources: &environmentv1.ResourceLimits{Memory: proto.String("1Gi")}},
		{Network: &environmentv1.NetworkPolicy{}},
	} {
		if err := lb.Check(spec); err == nil || !strings.Contains(err.Error(), "without any isolation") {
			t.Errorf("local backend accepted %v: %v", spec, err)
		}
	}
	// With no process boundary configured, a process spec names the gap.
	_, err = es.Run(ctx, &environmentv1.RunRequest{Input: in, Spec: boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}})})
	wantCode(t, err, codes.FailedPrecondition, "no process backend")
}

// fileSpec is a spec injecting credential "k" as a file at path.
func fileSpec(path string) *environmentv1.EnvironmentSpec {
	return &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{fileCred("k", path)}}
}
