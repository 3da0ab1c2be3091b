package k8s_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/state"
)

// TestProdSecrets runs secrets.sh, lays the Secrets it makes out as the
// prod pods mount them, and serves each service with exactly the TLS and
// auth settings the prod ConfigMaps give it; the callers then dial with
// exactly their own settings. So the script, the mounts, the variables
// and the servers agree, and the promises hold: mTLS with certificates
// checked against the Service names, tokens, and operators reading but
// never writing state.
func TestProdSecrets(t *testing.T) {
	for _, tool := range []string{"bash", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH: secrets.sh needs it", tool)
		}
	}
	kubectl(t)
	tg := target{dir: "overlays/prod", namespace: "neuron", mode: modeProd, components: []string{"components/lifecycle-events"}}
	r := render(t, tg)

	dir := t.TempDir()
	out := filepath.Join(dir, "secrets")
	cmd := exec.Command("bash", "secrets.sh", "-n", tg.namespace, "-o", out, "--lifecycle")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("secrets.sh: %v\n%s", err, b)
	}
	secrets := readSecrets(t, filepath.Join(out, "secrets.yaml"), tg.namespace)

	// Each pod's filesystem as its mounts make it, and its variables with
	// paths moved under that root.
	cfgs := map[string]map[string]string{}
	for _, s := range services {
		root := filepath.Join(dir, "pods", s.name)
		w := r.workload(t, s)
		c := w.container(t, s)
		mountPod(t, r, w, c, root, secrets)
		cfg, _ := r.config(t, s, c)
		for k, v := range cfg {
			if _, isFile := fileSecret(s, k); isFile {
				cfg[k] = filepath.Join(root, v)
				if _, err := os.Stat(cfg[k]); err != nil {
					t.Errorf("%s: %s = %s: not in the pod: %v", s.name, k, v, err)
				}
			}
		}
		cfgs[s.name] = cfg
	}
	if t.Failed() {
		t.FailNow()
	}

	addrs := map[string]string{}
	for _, s := range services {
		addrs[s.name] = serve(t, s, cfgs[s.name])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// peer is the client side of caller's calls to one peer: its
	// variables for it (e.g. NEURON_ORCHESTRATOR_STATE_*).
	peer := func(caller, p string) grpcclient.Config {
		s := svcNamed(t, caller)
		cfg, v := cfgs[caller], s.env+"_"+p
		return grpcclient.Config{CAFile: cfg[v+"_CA"], CertFile: cfg[v+"_CERT"], KeyFile: cfg[v+"_KEY"], TokenFile: cfg[v+"_TOKEN_FILE"]}
	}
	// dial connects to callee's loopback port, checking its certificate
	// against serverName as the in-cluster address would.
	dial := func(cc grpcclient.Config, callee, serverName string) *grpc.ClientConn {
		t.Helper()
		cc.Target, cc.ServerName, cc.MaxRetries, cc.Timeout = addrs[callee], serverName, -1, 10*time.Second
		conn, err := grpcclient.Dial(cc)
		if err != nil {
			t.Fatalf("dial %s: %v", callee, err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	host := func(addr string) string { h, _, _ := strings.Cut(addr, ":"); return h }

	// The orchestrator reads and writes state.
	sc := scope.Session("deploy-k8s-test")
	orchState := statev1.NewStateServiceClient(dial(peer("orchestrator", "STATE"), "state", host(cfgs["orchestrator"]["NEURON_ORCHESTRATOR_STATE_ADDR"])))
	val := structpb.NewStringValue("written by the orchestrator")
	if _, err := orchState.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: "k", Value: val}); err != nil {
		t.Fatalf("orchestrator Write: %v", err)
	}
	// The operator reads it, and may not write or delete.
	opState := statev1.NewStateServiceClient(dial(peer("operator", "STATE"), "state", host(cfgs["operator"]["NEURON_OPERATOR_STATE_ADDR"])))
	got, err := opState.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "k"})
	if err != nil || got.GetValue().GetStringValue() != val.GetStringValue() {
		t.Errorf("operator Read = %v, %v; want the orchestrator's value", got.GetValue(), err)
	}
	_, err = opState.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: "k", Value: structpb.NewStringValue("by the operator")})
	wantCode(t, "operator Write", err, codes.PermissionDenied)
	_, err = opState.Delete(ctx, &statev1.DeleteRequest{Scope: sc, Key: "k"})
	wantCode(t, "operator Delete", err, codes.PermissionDenied)

	// The orchestrator calls the operator and environment services at the
	// registry's addresses; unimplemented here, so passing auth shows as
	// UNIMPLEMENTED (or INVALID_ARGUMENT from validation).
	opAddr, envAddr := registryAddrs(t, r)
	_, err = operatorv1.NewOperatorServiceClient(dial(peer("orchestrator", "OPERATOR"), "operator", host(opAddr))).Execute(ctx, &operatorv1.ExecuteRequest{})
	wantPassed(t, "orchestrator -> operator Execute", err)
	_, err = environmentv1.NewEnvironmentServiceClient(dial(peer("orchestrator", "ENVIRONMENT"), "environment", host(envAddr))).Run(ctx, &environmentv1.RunRequest{})
	wantPassed(t, "orchestrator -> environment Run", err)

	// With components/lifecycle-events the operator publishes lifecycle
	// events, and can do nothing else on the orchestrator.
	lc := dial(peer("operator", "LIFECYCLE"), "orchestrator", host(cfgs["operator"]["NEURON_OPERATOR_LIFECYCLE_ADDR"]))
	_, err = lifecyclev1.NewLifecycleServiceClient(lc).Publish(ctx, &lifecyclev1.PublishRequest{})
	wantPassed(t, "operator -> orchestrator Publish", err)
	_, err = orchestratorv1.NewOrchestratorServiceClient(lc).Dispatch(ctx, &orchestratorv1.DispatchRequest{})
	wantCode(t, "operator -> orchestrator Dispatch", err, codes.PermissionDenied)

	// A client with the client certificate and token secrets.sh made.
	client := dial(grpcclient.Config{
		CAFile: filepath.Join(out, "ca.crt"), TokenFile: filepath.Join(out, "client.token"),
		CertFile: filepath.Join(out, "client.crt"), KeyFile: filepath.Join(out, "client.key"),
	}, "orchestrator", "neuron-orchestrator."+tg.namespace+".svc")
	_, err = orchestratorv1.NewOrchestratorServiceClient(client).Dispatch(ctx, &orchestratorv1.DispatchRequest{})
	wantPassed(t, "client -> orchestrator Dispatch", err)
	_, err = lifecyclev1.NewLifecycleServiceClient(client).Publish(ctx, &lifecyclev1.PublishRequest{})
	wantCode(t, "client -> orchestrator Publish", err, codes.PermissionDenied)

	// What is refused at the TLS layer: no client certificate; a server
	// certificate that does not name the address dialled.
	cc := peer("orchestrator", "STATE")
	cc.CertFile, cc.KeyFile = "", ""
	noCert := statev1.NewStateServiceClient(dial(cc, "state", "neuron-state"))
	_, err = noCert.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "k"})
	wantCode(t, "Read without a client certificate", err, codes.Unavailable)
	wrongName := statev1.NewStateServiceClient(dial(peer("orchestrator", "STATE"), "state", "neuron-operator"))
	_, err = wrongName.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "k"})
	wantCode(t, "Read from a server whose certificate names another Service", err, codes.Unavailable)
	// The environment service's certificate is valid, but its principal
	// has no rights on the state service.
	ecfg := cfgs["environment"]
	envAsState := statev1.NewStateServiceClient(dial(grpcclient.Config{
		CAFile: ecfg["NEURON_ENVIRONMENT_TLS_CLIENT_CA"], CertFile: ecfg["NEURON_ENVIRONMENT_TLS_CERT"], KeyFile: ecfg["NEURON_ENVIRONMENT_TLS_KEY"],
	}, "state", "neuron-state"))
	_, err = envAsState.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "k"})
	wantCode(t, "environment -> state Read", err, codes.PermissionDenied)
}

// readSecrets decodes secrets.sh's output strictly: name -> key -> value.
func readSecrets(t *testing.T, file, namespace string) map[string]map[string][]byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]byte{}
	for _, doc := range splitYAML(b) {
		var s corev1.Secret
		if err := yaml.UnmarshalStrict(doc, &s); err != nil {
			t.Fatalf("%s: %v\n%s", file, err, doc)
		}
		if s.Kind != "Secret" || s.Namespace != namespace {
			t.Errorf("%s: %s %s in namespace %q, want Secrets in %q", file, s.Kind, s.Name, s.Namespace, namespace)
		}
		if strings.HasSuffix(s.Name, "-tls") && s.Type != corev1.SecretTypeTLS {
			t.Errorf("Secret %s: type %q, want %s", s.Name, s.Type, corev1.SecretTypeTLS)
		}
		out[s.Name] = s.Data
	}
	return out
}

// mountPod writes, under root, the files c's volume mounts show it: the
// Secrets (from secrets) and ConfigMaps (from the rendering) it mounts.
func mountPod(t *testing.T, r *rendering, w workload, c corev1.Container, root string, secrets map[string]map[string][]byte) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		_, v, err := w.mountFor(c, m.MountPath)
		if err != nil {
			t.Fatal(err)
		}
		var data map[string][]byte
		switch {
		case v.Secret != nil:
			d, ok := secrets[v.Secret.SecretName]
			if !ok {
				if v.Secret.Optional == nil || !*v.Secret.Optional {
					t.Errorf("%s mounts Secret %s, which secrets.sh does not make", c.Name, v.Secret.SecretName)
				}
				continue
			}
			data = d
		case v.ConfigMap != nil:
			data = map[string][]byte{}
			for k, s := range r.configMaps[v.ConfigMap.Name].Data {
				data[k] = []byte(s)
			}
		}
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for k, b := range data {
			if err := os.WriteFile(filepath.Join(dir, k), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// registryAddrs returns an operator and an environment address from the
// orchestrator's agent registry.
func registryAddrs(t *testing.T, r *rendering) (op, env string) {
	t.Helper()
	for _, cm := range r.configMaps {
		data, ok := cm.Data["agents.yaml"]
		if !ok {
			continue
		}
		for _, line := range strings.Split(data, "\n") {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "- "))
			if len(f) == 2 && f[0] == "operator:" && op == "" {
				op = f[1]
			}
			if len(f) == 2 && f[0] == "environment:" && env == "" {
				env = f[1]
			}
		}
	}
	if op == "" || env == "" {
		t.Fatalf("agent registry: operator address %q, environment address %q", op, env)
	}
	return op, env
}

// serve starts s on a loopback port with the server settings of cfg and
// returns its address: the state service with a memory backend, the
// others with unimplemented handlers (what is checked is who gets past
// TLS and auth).
func serve(t *testing.T, s svc, cfg map[string]string) string {
	t.Helper()
	sc := grpcserver.Config{
		Name: s.name, Addr: "127.0.0.1:0",
		TLSCert: cfg[s.env+"_TLS_CERT"], TLSKey: cfg[s.env+"_TLS_KEY"],
		ClientCA: cfg[s.env+"_TLS_CLIENT_CA"], AuthPolicy: cfg[s.env+"_AUTH_POLICY"],
	}
	srv, err := grpcserver.New(sc, nil)
	if err != nil {
		t.Fatalf("%s: %v", s.name, err)
	}
	switch s.name {
	case "state":
		statev1.RegisterStateServiceServer(srv, state.NewServer(state.NewMemory()))
	case "operator":
		operatorv1.RegisterOperatorServiceServer(srv, operatorv1.UnimplementedOperatorServiceServer{})
	case "environment":
		environmentv1.RegisterEnvironmentServiceServer(srv, environmentv1.UnimplementedEnvironmentServiceServer{})
	case "orchestrator":
		orchestratorv1.RegisterOrchestratorServiceServer(srv, orchestratorv1.UnimplementedOrchestratorServiceServer{})
		lifecyclev1.RegisterLifecycleServiceServer(srv, lifecyclev1.UnimplementedLifecycleServiceServer{})
	}
	lis, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: serve: %v", s.name, err)
		}
	})
	return lis.Addr().String()
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v (code %v), want %v", what, err, got, want)
	}
}

// wantPassed: the call got past TLS and auth; the handler (unimplemented)
// or validation (an empty request) answered.
func wantPassed(t *testing.T, what string, err error) {
	t.Helper()
	switch status.Code(err) {
	case codes.Unimplemented, codes.InvalidArgument:
	default:
		t.Errorf("%s: %v; want it past TLS and auth (UNIMPLEMENTED or INVALID_ARGUMENT)", what, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s: timed out", what)
	}
}

func svcNamed(t *testing.T, name string) svc {
	t.Helper()
	for _, s := range services {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("no service %q", name)
	return svc{}
}
