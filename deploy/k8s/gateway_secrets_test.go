package k8s_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/a2apb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/gateway"
)

// gatewaySvc is the gateway as the rendering helpers name it (it is not
// in services: it is an opt-in component).
var gatewaySvc = svc{name: "gateway", port: 7076, kind: "Deployment", stateless: true, env: "NEURON_GATEWAY"}

// TestGatewaySecrets runs secrets.sh --gateway, lays the Secrets out as
// the prod pods (overlays/prod with components/gateway) mount them, and
// checks what the gateway's production auth promises: with exactly its
// mounted certificate the gateway may call what it needs of the
// orchestrator (start, watch, get, cancel and decide workflows; read the
// agents) and nothing else, and of the State service (its five methods:
// search, and its durable lanes and schedules); the
// gateway itself, run with its pod's settings, refuses clients without
// the token secrets.sh wrote (UNAUTHENTICATED on gRPC, 401 on A2A
// JSON-RPC, MCP and chat) and lets the token through.
func TestGatewaySecrets(t *testing.T) {
	for _, tool := range []string{"bash", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH: secrets.sh needs it", tool)
		}
	}
	kubectl(t)
	tg := target{dir: "overlays/prod", namespace: "neuron", mode: modeProd, components: []string{"components/gateway"}}
	r := render(t, tg)
	dir := t.TempDir()
	out := filepath.Join(dir, "secrets")
	if b, err := exec.Command("bash", "secrets.sh", "-n", tg.namespace, "-o", out, "--gateway").CombinedOutput(); err != nil {
		t.Fatalf("secrets.sh --gateway: %v\n%s", err, b)
	}
	secrets := readSecrets(t, filepath.Join(out, "secrets.yaml"), tg.namespace)

	// Each pod's files and variables, as in TestProdSecrets.
	pod := func(s svc) map[string]string {
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
		return cfg
	}
	orchCfg, stateCfg, gwCfg := pod(svcNamed(t, "orchestrator")), pod(svcNamed(t, "state")), pod(gatewaySvc)
	if t.Failed() {
		t.FailNow()
	}
	orchAddr := serveOrchestratorStub(t, orchCfg)
	stateAddr := serve(t, svcNamed(t, "state"), stateCfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The gateway's client side, exactly as its variables configure it.
	peerOf := func(p, addr string) grpcclient.Config {
		v := "NEURON_GATEWAY_" + p
		host, _, _ := strings.Cut(gwCfg[v+"_ADDR"], ":")
		return grpcclient.Config{Target: addr, ServerName: host, CAFile: gwCfg[v+"_CA"], CertFile: gwCfg[v+"_CERT"],
			KeyFile: gwCfg[v+"_KEY"], TokenFile: gwCfg[v+"_TOKEN_FILE"], MaxRetries: -1, Timeout: 10 * time.Second}
	}
	dial := func(cc grpcclient.Config) *grpc.ClientConn {
		t.Helper()
		conn, err := grpcclient.Dial(cc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	oc := dial(peerOf("ORCHESTRATOR", orchAddr))
	orch, agents := orchestratorv1.NewOrchestratorServiceClient(oc), agentv1.NewAgentServiceClient(oc)
	_, err := orch.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{})
	wantPassed(t, "gateway -> orchestrator StartWorkflow", err)
	_, err = orch.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{})
	wantPassed(t, "gateway -> orchestrator GetWorkflow", err)
	_, err = orch.CancelWorkflow(ctx, &orchestratorv1.CancelWorkflowRequest{})
	wantPassed(t, "gateway -> orchestrator CancelWorkflow", err)
	_, err = orch.DecideApprovals(ctx, &orchestratorv1.DecideApprovalsRequest{})
	wantPassed(t, "gateway -> orchestrator DecideApprovals", err)
	if ws, err := orch.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{}); err == nil {
		_, err = ws.Recv()
		wantPassed(t, "gateway -> orchestrator WatchWorkflow", err)
	} else {
		wantPassed(t, "gateway -> orchestrator WatchWorkflow", err)
	}
	_, err = agents.GetAgent(ctx, &agentv1.GetAgentRequest{})
	wantPassed(t, "gateway -> orchestrator GetAgent", err)
	_, err = agents.ListAgents(ctx, &agentv1.ListAgentsRequest{})
	wantPassed(t, "gateway -> orchestrator ListAgents", err)
	// Nothing else: not Dispatch, not the agents' definitions, not the
	// lifecycle bus.
	_, err = orch.Dispatch(ctx, &orchestratorv1.DispatchRequest{})
	wantCode(t, "gateway -> orchestrator Dispatch", err, codes.PermissionDenied)
	_, err = orch.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{})
	wantCode(t, "gateway -> orchestrator ListWorkflows", err, codes.PermissionDenied)
	_, err = agents.CreateAgent(ctx, &agentv1.CreateAgentRequest{})
	wantCode(t, "gateway -> orchestrator CreateAgent", err, codes.PermissionDenied)
	_, err = lifecyclev1.NewLifecycleServiceClient(oc).Publish(ctx, &lifecyclev1.PublishRequest{})
	wantCode(t, "gateway -> orchestrator Publish", err, codes.PermissionDenied)

	// State: state_search, and the durable lanes, schedules and push
	// configs in its own scope.
	st := statev1.NewStateServiceClient(dial(peerOf("STATE", stateAddr)))
	sc := scope.Custom(gateway.StateScope)
	if _, err := st.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: "k", Value: structpb.NewStringValue("v")}); err != nil {
		t.Errorf("gateway -> state Write: %v", err)
	}
	if _, err := st.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "k"}); err != nil {
		t.Errorf("gateway -> state Read: %v", err)
	}
	if _, err := st.List(ctx, &statev1.ListRequest{Scope: sc}); err != nil {
		t.Errorf("gateway -> state List: %v", err)
	}
	if _, err := st.Search(ctx, &statev1.SearchRequest{Scope: sc, Query: "anything"}); err != nil {
		t.Errorf("gateway -> state Search: %v", err)
	}
	if _, err := st.Delete(ctx, &statev1.DeleteRequest{Scope: sc, Key: "k"}); err != nil {
		t.Errorf("gateway -> state Delete: %v", err)
	}

	// The gateway itself, with its pod's server settings, in front of
	// those two.
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gcfg := gateway.Config{
		Server: grpcserver.Config{Name: "gateway", TLSCert: gwCfg["NEURON_GATEWAY_TLS_CERT"], TLSKey: gwCfg["NEURON_GATEWAY_TLS_KEY"],
			AuthPolicy: gwCfg["NEURON_GATEWAY_AUTH_POLICY"], ShutdownTimeout: 2 * time.Second},
		Listener: glis, HTTPListener: hlis,
		Orchestrator: peerOf("ORCHESTRATOR", orchAddr), State: peerOf("STATE", stateAddr),
	}
	gctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gateway.Run(gctx, gcfg) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("gateway: %v", err)
		}
	})

	ca, err := os.ReadFile(filepath.Join(out, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	tlsCfg := &tls.Config{RootCAs: pool, ServerName: "neuron-gateway." + tg.namespace + ".svc", MinVersion: tls.VersionTLS12}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: 20 * time.Second}
	token, err := os.ReadFile(filepath.Join(out, "gateway-client.token"))
	if err != nil {
		t.Fatal(err)
	}
	post := func(path, tok string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+hlis.Addr().String()+path, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		var resp *http.Response
		for i := 0; ; i++ { // the gateway may still be starting
			if resp, err = hc.Do(req); err == nil || i == 50 || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/a2a/echo", "/mcp", "/v1/chat"} {
		if code := post(path, ""); code != http.StatusUnauthorized {
			t.Errorf("POST %s without a token: HTTP %d, want 401", path, code)
		}
		if code := post(path, strings.TrimSpace(string(token))+"x"); code != http.StatusUnauthorized {
			t.Errorf("POST %s with a wrong token: HTTP %d, want 401", path, code)
		}
		if code := post(path, strings.TrimSpace(string(token))); code == http.StatusUnauthorized || code == http.StatusForbidden {
			t.Errorf("POST %s with gateway-client.token: HTTP %d, want past auth", path, code)
		}
	}
	gc, err := grpc.NewClient(glis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	a2a := a2apb.NewA2AServiceClient(gc)
	req := &a2apb.GetTaskRequest{Name: "tasks/x"}
	_, err = a2a.GetTask(ctx, req)
	wantCode(t, "A2A gRPC GetTask without a token", err, codes.Unauthenticated)
	_, err = a2a.GetTask(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+strings.TrimSpace(string(token))), req)
	if c := grpcstatus.Code(err); c == codes.Unauthenticated || c == codes.PermissionDenied {
		t.Errorf("A2A gRPC GetTask with gateway-client.token: %v, want past auth", err)
	}
}

// serveOrchestratorStub serves the orchestrator's services unimplemented
// (OrchestratorService, AgentService, LifecycleService) with the server
// settings of cfg: what is checked is who gets past TLS and auth.
func serveOrchestratorStub(t *testing.T, cfg map[string]string) string {
	t.Helper()
	const env = "NEURON_ORCHESTRATOR"
	srv, err := grpcserver.New(grpcserver.Config{Name: "orchestrator", Addr: "127.0.0.1:0",
		TLSCert: cfg[env+"_TLS_CERT"], TLSKey: cfg[env+"_TLS_KEY"], ClientCA: cfg[env+"_TLS_CLIENT_CA"], AuthPolicy: cfg[env+"_AUTH_POLICY"]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	orchestratorv1.RegisterOrchestratorServiceServer(srv, orchestratorv1.UnimplementedOrchestratorServiceServer{})
	agentv1.RegisterAgentServiceServer(srv, agentv1.UnimplementedAgentServiceServer{})
	lifecyclev1.RegisterLifecycleServiceServer(srv, lifecyclev1.UnimplementedLifecycleServiceServer{})
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
			t.Errorf("orchestrator: serve: %v", err)
		}
	})
	return lis.Addr().String()
}
