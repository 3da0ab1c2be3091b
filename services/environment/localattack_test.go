package environment_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/environment"
)

// countingOperator is an operator service that counts its calls and
// answers each with out, or fails with err.
type countingOperator struct {
	operatorv1.UnimplementedOperatorServiceServer
	calls atomic.Int32
	out   *operatorv1.OperatorOutput
	err   error

	mu       sync.Mutex
	deadline time.Duration // time left on the last call's deadline
}

func (o *countingOperator) Execute(ctx context.Context, _ *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	o.calls.Add(1)
	if d, ok := ctx.Deadline(); ok {
		o.mu.Lock()
		o.deadline = time.Until(d)
		o.mu.Unlock()
	}
	if o.err != nil {
		return nil, o.err
	}
	return &operatorv1.ExecuteResponse{Output: o.out}, nil
}

func (o *countingOperator) ExecuteStream(*operatorv1.ExecuteStreamRequest, grpc.ServerStreamingServer[operatorv1.ExecuteStreamResponse]) error {
	o.calls.Add(1)
	return status.Error(codes.Unimplemented, "not in this test")
}

// startLocalEnv serves op on a real TCP port, and an environment service
// whose only backend is the local one, forwarding to op, as `--backend
// local --operator-addr ADDR --secrets-dir DIR` starts it (with the
// egress proxies and the credentials the specs name, so that only the
// backend can refuse them).
func startLocalEnv(t *testing.T, op *countingOperator) *env {
	t.Helper()
	opLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opSrv := grpc.NewServer()
	operatorv1.RegisterOperatorServiceServer(opSrv, op)
	go func() { _ = opSrv.Serve(opLis) }()
	t.Cleanup(opSrv.Stop)

	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	secrets := secretsDir(t, map[string]string{"ci-token": "tok-local-1234567890", "anthropic": sidecarKey})
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return environment.Run(ctx, environment.Config{
			Server:     grpcserver.Config{Name: "environment", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:        log,
			Listener:   lis,
			Backend:    "local",
			Operator:   grpcclient.Config{Target: opLis.Addr().String(), Dev: true, Plaintext: true, MaxRetries: -1, Timeout: time.Minute},
			SecretsDir: secrets,
		})
	})
	return &env{client: dialEnv(t, addr), logs: logs}
}

func isolation(b ...*environmentv1.IsolationBoundary) []*environmentv1.IsolationBoundary { return b }

var (
	processBoundary = &environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}
	allowAll        = &environmentv1.NetworkPolicy{DefaultAction: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW}
	denyAll         = &environmentv1.NetworkPolicy{DefaultAction: environmentv1.NetworkAction_NETWORK_ACTION_DENY}
)

func fileCred(name, path string) *environmentv1.CredentialRef {
	return &environmentv1.CredentialRef{Name: name, Injection: &environmentv1.CredentialInjection{
		Method: &environmentv1.CredentialInjection_File{File: &environmentv1.FileInjection{Path: path}}}}
}

func sidecarCred(name, host, header string) *environmentv1.CredentialRef {
	return &environmentv1.CredentialRef{Name: name, Injection: &environmentv1.CredentialInjection{
		Method: &environmentv1.CredentialInjection_Sidecar{Sidecar: &environmentv1.SidecarInjection{Host: host, Header: header}}}}
}

// The local backend isolates nothing, so every spec the attack tests
// send the process backend (isolation boundaries, credentials, a network
// policy, resource limits) is refused with FAILED_PRECONDITION naming
// what it asked for, and the operator service behind it is never called.
// Only a timeout is accepted, and enforced as the call's deadline.
func TestLocalBackendRefusesAttackSpecs(t *testing.T) {
	op := &countingOperator{out: &operatorv1.OperatorOutput{Message: content.Text("ran")}}
	e := startLocalEnv(t, op)
	const noIsolation = "the local backend runs the operator service without any isolation"
	for _, tc := range []struct {
		name string
		spec *environmentv1.EnvironmentSpec
		says []string
	}{
		// Isolation boundaries: the server finds no backend for them, or
		// the local backend refuses them.
		{"process boundary", boundary(processBoundary), []string{"isolation process needs the process backend", "no process backend", "configured: local"}},
		{"container boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{}}}),
			[]string{"isolation container needs a container backend", "configured: local"}},
		{"gvisor boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Gvisor{Gvisor: &environmentv1.GvisorIsolation{}}}),
			[]string{"isolation gvisor needs a container backend"}},
		{"microvm boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Microvm{Microvm: &environmentv1.MicroVmIsolation{}}}),
			[]string{"enforces isolation microvm"}},
		{"wasm boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Wasm{Wasm: &environmentv1.WasmIsolation{}}}),
			[]string{"enforces isolation wasm"}},
		{"custom boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_Custom{Custom: &environmentv1.CustomIsolation{BoundaryType: "acme.dev/enclave"}}}),
			[]string{"enforces isolation custom:acme.dev/enclave"}},
		{"network_policy boundary", boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_NetworkPolicy{NetworkPolicy: &environmentv1.NetworkPolicyIsolation{}}}),
			[]string{noIsolation, "isolation network_policy"}},
		// Credentials, whatever their injection.
		{"env_var credential", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{envCred("ci-token", "CI_TOKEN")}},
			[]string{noIsolation, "credentials"}},
		{"file credential", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{fileCred("ci-token", "/run/neuron-test-secrets/token")}},
			[]string{noIsolation, "credentials"}},
		{"sidecar credential", &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{sidecarCred("anthropic", "api.anthropic.com", "x-api-key")}},
			[]string{noIsolation, "credentials"}},
		// A network policy, even one that denies everything.
		{"network default deny", &environmentv1.EnvironmentSpec{Network: denyAll}, []string{noIsolation, "a network policy"}},
		{"empty network policy", &environmentv1.EnvironmentSpec{Network: &environmentv1.NetworkPolicy{}}, []string{noIsolation, "a network policy"}},
		{"network default allow", &environmentv1.EnvironmentSpec{Network: allowAll}, []string{noIsolation, "a network policy"}},
		{"network allow rule", &environmentv1.EnvironmentSpec{Network: &environmentv1.NetworkPolicy{Rules: []*environmentv1.NetworkRule{{
			Destination: "example.com", Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW}}}}, []string{noIsolation, "a network policy"}},
		// Each resource limit on its own.
		{"memory limit", &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Memory: proto.String("256Mi")}}, []string{noIsolation, "resource limits (memory)"}},
		{"process limit", &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{MaxProcesses: proto.Uint32(48)}}, []string{noIsolation, "resource limits (max_processes)"}},
		{"cpu limit", &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Cpu: proto.String("500m")}}, []string{noIsolation, "resource limits (cpu)"}},
		{"cpu time limit", &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{CpuTime: durationpb.New(30 * time.Second)}}, []string{noIsolation, "resource limits (cpu_time)"}},
		{"output limit", &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{MaxOutputBytes: proto.Uint64(1024)}}, []string{noIsolation, "resource limits (max_output_bytes)"}},
		{"disk limit", &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Disk: proto.String("1Gi")}}, []string{noIsolation, "resource limits (disk)"}},
		{"gpu", &environmentv1.EnvironmentSpec{Resources: &environmentv1.ResourceLimits{Gpu: proto.String("1")}}, []string{noIsolation, "resource limits (gpu)"}},
		// The README's restrictive spec, with and without its process
		// boundary: everything it asks for is named.
		{"restrictive spec", &environmentv1.EnvironmentSpec{
			Isolation:   isolation(processBoundary),
			Credentials: []*environmentv1.CredentialRef{envCred("ci-token", "CI_TOKEN")},
			Resources:   &environmentv1.ResourceLimits{Memory: proto.String("256Mi"), MaxProcesses: proto.Uint32(64), MaxOutputBytes: proto.Uint64(1 << 20), CpuTime: durationpb.New(30 * time.Second)},
			Network:     denyAll,
			Timeout:     durationpb.New(time.Minute),
		}, []string{"no process backend"}},
		{"restrictive spec without a boundary", &environmentv1.EnvironmentSpec{
			Credentials: []*environmentv1.CredentialRef{envCred("ci-token", "CI_TOKEN")},
			Resources:   &environmentv1.ResourceLimits{Memory: proto.String("256Mi"), MaxProcesses: proto.Uint32(64), MaxOutputBytes: proto.Uint64(1 << 20), CpuTime: durationpb.New(30 * time.Second)},
			Network:     denyAll,
			Timeout:     durationpb.New(time.Minute),
		}, []string{noIsolation, "credentials, a network policy, resource limits (", "memory", "max_processes", "max_output_bytes", "cpu_time"}},
		// The sidecar attack's spec: a sidecar key and an allowed network.
		{"sidecar attack spec", &environmentv1.EnvironmentSpec{
			Credentials: []*environmentv1.CredentialRef{sidecarCred("anthropic", "api.anthropic.com", "x-api-key")},
			Network:     allowAll,
		}, []string{noIsolation, "credentials", "a network policy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.run(t, `/tool bash {"command": "cat /etc/shadow"}`, tc.spec)
			wantCode(t, err, codes.FailedPrecondition, tc.says...)
		})
	}
	if n := op.calls.Load(); n != 0 {
		t.Fatalf("the operator service was called %d times for specs the local backend must refuse", n)
	}

	// Control: a timeout alone (and an empty resources message) is run,
	// with the timeout as the operator call's deadline.
	resp, err := e.run(t, "hello", &environmentv1.EnvironmentSpec{Timeout: durationpb.New(7 * time.Second), Resources: &environmentv1.ResourceLimits{}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBackend() != "local" || text(resp) != "ran" || op.calls.Load() != 1 {
		t.Errorf("backend %q, text %q, %d operator calls; want local, \"ran\", 1", resp.GetBackend(), text(resp), op.calls.Load())
	}
	op.mu.Lock()
	left := op.deadline
	op.mu.Unlock()
	if left <= 0 || left > 7*time.Second {
		t.Errorf("the operator call had %v left on its deadline, want at most the spec's 7s timeout", left)
	}
}

// Secret-looking strings (API keys, bearer tokens, private keys, JWTs,
// password= assignments) are scrubbed from what a local run returns, as
// from any backend's: the output's text, its sub-dispatch records and
// annotations, an error from the operator service, and the logs.
func TestLocalBackendScrubsOutput(t *testing.T) {
	const (
		apiKey  = "sk-ant-api03-LOCALLEAK0123456789abcdefghijklmnop"
		ghToken = "ghp_LOCALLEAK0123456789abcdefghijklmnopqrstu"
		jwt     = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJsb2NhbGxlYWsifQ.c2lnbmF0dXJlTE9DQUxMRUFL"
		pemBody = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQLOCALLEAK"
		bearer  = "LOCALLEAKbearer0123456789abcdefXYZ"
		passwd  = "LOCALLEAK-hunter2-pass"
	)
	pem := "-----BEGIN PRIVATE KEY-----\n" + pemBody + "\n-----END PRIVATE KEY-----"
	leaky := "key " + apiKey + "\nAuthorization: Bearer " + bearer + "\n" + pem + "\ntoken " + jwt + " password=" + passwd
	ann, err := structpb.NewStruct(map[string]any{"github": ghToken, "note": "api key " + apiKey})
	if err != nil {
		t.Fatal(err)
	}
	op := &countingOperator{out: &operatorv1.OperatorOutput{
		Message:    content.Text(leaky),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata: &operatorv1.OperatorMetadata{SubDispatches: []*operatorv1.SubDispatchRecord{{
			Name: "bash", Error: "curl: (22) Authorization: Bearer " + bearer + " rejected; " + ghToken,
		}}},
		Annotations: ann,
	}}
	e := startLocalEnv(t, op)
	secrets := []string{apiKey, ghToken, jwt, pemBody, bearer, passwd, "LOCALLEAK"}

	resp, err := e.run(t, "show me the keys", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBackend() != "local" {
		t.Fatalf("backend %q, want local", resp.GetBackend())
	}
	raw, _ := proto.Marshal(resp)
	for _, s := range secrets {
		if strings.Contains(string(raw), s) {
			t.Errorf("%q came back from a local run: %q", s, text(resp))
		}
	}
	got := text(resp)
	if n := strings.Count(got, "[REDACTED]"); n < 5 {
		t.Errorf("%d redactions in the text, want one per secret: %q", n, got)
	}
	if !strings.Contains(got, "key [REDACTED]") || !strings.Contains(got, "Authorization: Bearer [REDACTED]") {
		t.Errorf("the text around the secrets was not kept: %q", got)
	}
	if r := resp.GetOutput().GetMetadata().GetSubDispatches(); len(r) != 1 || !strings.Contains(r[0].GetError(), "[REDACTED]") {
		t.Errorf("sub-dispatch record not scrubbed: %v", r)
	}
	if a := resp.GetOutput().GetAnnotations().GetFields()["github"].GetStringValue(); a != "[REDACTED]" {
		t.Errorf("annotation not scrubbed: %q", a)
	}

	// An error from the operator service keeps its code, loses the secret.
	op.err = status.Error(codes.PermissionDenied, "the model provider refused x-api-key: "+apiKey+" (Authorization: Bearer "+bearer+")")
	_, err = e.run(t, "again", nil)
	wantCode(t, err, codes.PermissionDenied, "the model provider refused", "[REDACTED]")
	for _, s := range secrets {
		if strings.Contains(status.Convert(err).Message(), s) {
			t.Errorf("%q came back in the error: %q", s, status.Convert(err).Message())
		}
		if strings.Contains(e.logs.String(), s) {
			t.Errorf("%q is in the service's logs", s)
		}
	}
	if n := op.calls.Load(); n != 2 {
		t.Errorf("%d operator calls, want 2", n)
	}
}

// acceptAll is a backend that enforces anything and records each run;
// with startEgress it also starts and stops the invocation's egress
// proxy, when it has one.
type acceptAll struct {
	startEgress bool
	mu          sync.Mutex
	runs        []*environment.Invocation
}

func (*acceptAll) Name() string                               { return "accept-all" }
func (*acceptAll) Check(*environmentv1.EnvironmentSpec) error { return nil }
func (b *acceptAll) Run(_ context.Context, inv *environment.Invocation) (*environment.Result, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.runs = append(b.runs, inv)
	if b.startEgress && inv.Egress != nil {
		stop, err := inv.Egress("unused.sock")
		if err != nil {
			return nil, err
		}
		stop()
	}
	return &environment.Result{Output: &operatorv1.OperatorOutput{Message: content.Text("ran")}, Usage: &environmentv1.ResourceUsage{}}, nil
}

func (b *acceptAll) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.runs)
}

// A spec that allows any network egress (or needs the proxy for a
// sidecar credential) is refused when the service runs no egress proxy,
// even by a backend that would accept it; one that denies everything
// still runs. With a proxy configured, the same specs run, with an
// egress starter.
func TestFailClosedWithoutEgressProxy(t *testing.T) {
	secrets := environment.MapSecrets{"anthropic": sidecarKey}
	needsProxy := map[string]*environmentv1.EnvironmentSpec{
		"network default allow": {Network: allowAll},
		"network allow rule": {Network: &environmentv1.NetworkPolicy{Rules: []*environmentv1.NetworkRule{{
			Destination: "api.example.com", Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW}}}},
		"network_policy boundary allowing a range": boundary(&environmentv1.IsolationBoundary{Kind: &environmentv1.IsolationBoundary_NetworkPolicy{NetworkPolicy: &environmentv1.NetworkPolicyIsolation{
			Rules: []*environmentv1.NetworkRule{{Destination: "203.0.113.0/24", Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW}}}}}),
		"sidecar credential, network denied": {Network: denyAll, Credentials: []*environmentv1.CredentialRef{sidecarCred("anthropic", "api.anthropic.com", "x-api-key")}},
	}
	noProxy := map[string]*environmentv1.EnvironmentSpec{
		"no network policy":    {},
		"network default deny": {Network: denyAll},
		"deny rule only": {Network: &environmentv1.NetworkPolicy{Rules: []*environmentv1.NetworkRule{{
			Destination: "api.example.com", Action: environmentv1.NetworkAction_NETWORK_ACTION_DENY}}}},
	}
	run := func(s *environment.Server, spec *environmentv1.EnvironmentSpec) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := s.Run(ctx, &environmentv1.RunRequest{Input: &operatorv1.OperatorInput{Message: content.Text("hi")}, Spec: spec})
		return err
	}

	b := &acceptAll{}
	s, err := environment.NewServer(environment.ServerConfig{Backends: []environment.Backend{b}, Default: b.Name(), Secrets: secrets})
	if err != nil {
		t.Fatal(err)
	}
	for name, spec := range needsProxy {
		err := run(s, spec)
		if !strings.Contains(errString(err), "the spec allows network egress, but this environment service runs no egress proxy") {
			t.Errorf("%s: %v, want a refusal naming the missing egress proxy", name, err)
		}
		wantCode(t, err, codes.FailedPrecondition)
	}
	if n := b.count(); n != 0 {
		t.Fatalf("the backend ran %d invocations needing an egress proxy that does not exist", n)
	}
	for name, spec := range noProxy {
		if err := run(s, spec); err != nil {
			t.Errorf("%s: %v, want it run without a proxy", name, err)
		}
	}
	for _, inv := range b.runs {
		if inv.Egress != nil {
			t.Errorf("an invocation that allows nothing got an egress starter")
		}
	}

	// With an egress proxy configured, the same specs run.
	var started atomic.Int32
	b2 := &acceptAll{startEgress: true}
	s2, err := environment.NewServer(environment.ServerConfig{
		Backends: []environment.Backend{b2}, Default: b2.Name(), Secrets: secrets,
		Egress: func(string, environment.NetworkPolicy, []environment.Credential, *slog.Logger) (func(), error) {
			started.Add(1)
			return func() {}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, spec := range needsProxy {
		if err := run(s2, spec); err != nil {
			t.Errorf("%s with an egress proxy: %v", name, err)
		}
	}
	if n := b2.count(); n != len(needsProxy) {
		t.Fatalf("%d runs with an egress proxy configured, want %d", n, len(needsProxy))
	}
	for i, inv := range b2.runs {
		if inv.Egress == nil {
			t.Errorf("run %d: no egress starter for a spec that allows egress", i)
		}
	}
	if n := started.Load(); int(n) != len(needsProxy) {
		t.Errorf("the egress factory started %d proxies, want %d", n, len(needsProxy))
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
