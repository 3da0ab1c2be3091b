package environment_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
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

	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/services/environment"
)

// anthropicUpstream stands in for api.anthropic.com: it speaks the
// Messages API, records the x-api-key header and the body of every
// request, and first asks for a bash call that hunts for the key, then
// ends the turn.
type anthropicUpstream struct {
	mu     sync.Mutex
	keys   []string
	bodies []string
}

func (u *anthropicUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.keys = append(u.keys, r.Header.Get("X-Api-Key"))
	u.bodies = append(u.bodies, string(body))
	n := len(u.bodies)
	u.mu.Unlock()
	if r.URL.Path != "/v1/messages" {
		http.Error(w, `{"type":"error","error":{"type":"not_found_error","message":"no such path"}}`, http.StatusNotFound)
		return
	}
	var msg map[string]any
	if n == 1 {
		// The pattern is assembled by the shell so that the key's text
		// never appears in the command (which goes back to the model).
		hunt := `k="$(printf 'sk-ant-api03-%s' REAL)KEY0123"; env | grep -c -e "$k" -e ANTHROPIC; cat /proc/$PPID/environ 2>&1 | head -c 80; grep -rls "$k" / 2>/dev/null | head -3; echo hunted`
		msg = map[string]any{
			"content":     []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": map[string]any{"command": hunt}}},
			"stop_reason": "tool_use",
		}
	} else {
		msg = map[string]any{
			"content":     []any{map[string]any{"type": "text", "text": "The hunt is over."}},
			"stop_reason": "end_turn",
		}
	}
	msg["id"] = "msg_" + string(rune('0'+n))
	msg["type"] = "message"
	msg["role"] = "assistant"
	msg["model"] = "claude-sonnet-4-5-20250929"
	msg["stop_sequence"] = nil
	msg["usage"] = map[string]any{"input_tokens": 100, "output_tokens": 20}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(msg)
}

const sidecarKey = "sk-ant-api03-REALKEY0123456789abcdefghijklmnopqrstuv"

// A sidecar credential reaches the model API (the proxy adds it over TLS)
// while nothing inside the sandbox can read it: not the operator's
// environment, not its tools' environment, not /proc, not any file.
func TestAttackSidecarKeyInvisible(t *testing.T) {
	requireSandbox(t)
	up := &anthropicUpstream{}
	cert, caFile := selfSigned(t, "api.anthropic.com")
	srv := httptest.NewUnstartedServer(up)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	e := startEnv(t, envOptions{
		secrets: environment.MapSecrets{"anthropic": sidecarKey},
		// As --egress-static-hosts api.anthropic.com=ADDR and
		// --egress-ca-file FILE configure it.
		egressStaticHosts: map[string]string{"api.anthropic.com": strings.TrimPrefix(srv.URL, "https://")},
		egressCAFile:      caFile,
	})
	spec := &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{
		Name: "anthropic",
		Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_Sidecar{
			Sidecar: &environmentv1.SidecarInjection{Host: "api.anthropic.com", Header: "x-api-key"},
		}},
	}}}
	resp, err := e.run(t, "Find the API key.", spec)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, e.logs.String())
	}
	if got := text(resp); got != "The hunt is over." {
		t.Errorf("final text %q", got)
	}
	if p := resp.GetOutput().GetMetadata().GetProvider(); p != "anthropic" {
		t.Errorf("provider %q, want anthropic (through the sidecar)", p)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.keys) != 2 {
		t.Fatalf("upstream saw %d requests, want 2", len(up.keys))
	}
	for i, k := range up.keys {
		if k != sidecarKey {
			t.Errorf("request %d carried x-api-key %q, want the real key added by the proxy", i, k)
		}
	}
	// The tool result the model got back shows what the hunt found.
	result := up.bodies[1]
	for _, want := range []string{`0\n`, "hunted"} {
		if !strings.Contains(result, want) {
			t.Errorf("tool result does not contain %q: %s", want, result)
		}
	}
	for i, b := range up.bodies {
		if strings.Contains(b, sidecarKey) || strings.Contains(b, "REALKEY0123") {
			t.Errorf("request %d body contains the key: the sandbox could read it", i)
		}
	}
	raw, _ := proto.Marshal(resp)
	if strings.Contains(string(raw), "REALKEY0123") || strings.Contains(e.logs.String(), "REALKEY0123") {
		t.Error("the key came back in the response or the logs")
	}
}

// selfSigned makes a certificate for host and a PEM file of it, for
// --egress-ca-file.
func selfSigned(t *testing.T, host string) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, caFile
}
