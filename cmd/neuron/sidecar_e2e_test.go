package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/sandbox"
)

// sidecarModelKey is the key neuron up is given; it must reach the model
// server and nothing inside the sandbox.
const sidecarModelKey = "sk-test-SIDECARKEY0123456789abcdef"

// keyCheckingModel is an OpenAI-compatible /chat/completions server that
// records the Authorization header and the body of each request. Its
// first answer to a request offering the bash tool is a call of it that
// prints the sandbox's environment; then it answers with text.
type keyCheckingModel struct {
	mu     sync.Mutex
	auth   []string
	bodies []string
}

func (m *keyCheckingModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	m.mu.Lock()
	m.auth = append(m.auth, r.Header.Get("Authorization"))
	m.bodies = append(m.bodies, string(body))
	m.mu.Unlock()
	var req struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
		Tools []struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
	}
	_ = json.Unmarshal(body, &req)
	bash, answered := false, false
	for _, tl := range req.Tools {
		bash = bash || tl.Function.Name == "bash"
	}
	for _, msg := range req.Messages {
		answered = answered || msg.Role == "tool"
	}
	if bash && !answered {
		call := `{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"env; cat /proc/self/environ; ls -a / $HOME\"}"}}`
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":[%s]},\"finish_reason\":null}]}\n\n", req.Model, strings.Replace(call, `{"id"`, `{"index":0,"id"`, 1))
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n", req.Model)
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[%s]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`, req.Model, call)
		return
	}
	answer := "answered by the real model through the sidecar"
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":%q},\"finish_reason\":null}]}\n\n", req.Model, answer)
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", req.Model)
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"total_tokens\":13}}\n\n", req.Model)
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`, req.Model, answer)
}

// certFor makes a self-signed certificate for host and writes its PEM to
// a file, for the environment's --egress-ca-file.
func certFor(t *testing.T, host string) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, file
}

// TestUpSandboxedRealModel: with OPENAI_API_KEY set, neuron up runs the
// agents in the process sandbox; their model calls reach the provider
// (an OpenAI-compatible test server standing in for api.openai.com)
// with the real key, added by the environment's egress proxy, while the
// sandbox's environment (printed by its bash tool), the model's
// requests, the answer and the workflow's files never hold it.
func TestUpSandboxedRealModel(t *testing.T) {
	t.Parallel()
	if err := sandbox.Supported(); err != nil {
		t.Skipf("agents run sandboxed only where Landlock is: %v", err)
	}
	if err := sandbox.CgroupSupported(); err != nil {
		t.Skipf("agents run sandboxed only with a cgroup: %v", err)
	}
	model := &keyCheckingModel{}
	cert, caFile := certFor(t, "api.openai.com")
	srv := httptest.NewUnstartedServer(model)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	upstream := strings.TrimPrefix(srv.URL, "https://")
	s := newUpSetup(t)
	up := startUpIn(t, s, []string{
		"OPENAI_API_KEY=" + sidecarModelKey,
		// The environment service's flags, through the environment
		// neuron up passes on: api.openai.com is the test server.
		"NEURON_ENVIRONMENT_EGRESS_STATIC_HOSTS=api.openai.com=" + upstream,
		"NEURON_ENVIRONMENT_EGRESS_CA_FILE=" + caFile,
		"NEURON_ENVIRONMENT_EGRESS_ALLOW_PRIVATE=127.0.0.1/32",
	})
	if out := up.output(); !strings.Contains(out, "through the environment service's process sandbox") || !strings.Contains(out, "adds OPENAI_API_KEY for api.openai.com") {
		t.Fatalf("neuron up does not run the agents sandboxed with the key added by the proxy:\n%s", out)
	}
	r := neuron(ctxFor(t), t, "run", "researcher", "what", "is", "layer0?", "--addr", up.orchestrator)
	if r.code != 0 || !strings.Contains(r.stdout, "answered by the real model through the sidecar") {
		t.Fatalf("neuron run researcher:\n%s\nneuron up:\n%s", r, up.output())
	}
	if strings.Contains(r.stdout+r.stderr, sidecarModelKey) {
		t.Error("the key is in the answer")
	}
	model.mu.Lock()
	defer model.mu.Unlock()
	if len(model.auth) == 0 {
		t.Fatal("the model server got no request")
	}
	for i, a := range model.auth {
		if a != "Bearer "+sidecarModelKey {
			t.Errorf("request %d: Authorization %q, want the real key, added by the egress proxy", i, a)
		}
	}
	sawEnv := false
	for i, b := range model.bodies {
		if strings.Contains(b, sidecarModelKey) || strings.Contains(b, "SIDECARKEY") {
			t.Errorf("request %d from the sandbox holds the key: %s", i, b)
		}
		sawEnv = sawEnv || strings.Contains(b, `PATH=/usr/local/bin:/usr/bin:/bin`)
	}
	if !sawEnv {
		t.Errorf("the bash tool's environment listing never reached the model:\n%s", strings.Join(model.bodies, "\n"))
	}
	for _, f := range []string{"demo-agents.yaml", "orchestrator/journal.db"} {
		if b, _ := os.ReadFile(filepath.Join(s.dataDir, f)); strings.Contains(string(b), sidecarModelKey) {
			t.Errorf("%s holds the key", f)
		}
	}
}
