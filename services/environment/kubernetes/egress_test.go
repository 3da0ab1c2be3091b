package kubernetes

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/services/environment"
)

// TestSidecarThroughEgressProxy: a model key as a sidecar credential on
// the kubernetes backend never enters the pod: the Job's pod spec holds
// no trace of it (no value, no Secret reference, nothing in the input
// Secret), its operator is pointed at the invocation's egress proxy on
// the service's address with a token, its provider at the proxy with a
// placeholder key, and its NetworkPolicy allows that address and port
// alone. Acting as the pod (no kubelet runs here), a request to the
// provider's base URL through the proxy reaches the model server (a TLS
// test server standing in for api.openai.com) with the real key; a
// request without the token is refused (407). Without an egress host
// the credential is refused, naming the flag.
func TestSidecarThroughEgressProxy(t *testing.T) {
	const key = "sk-real-model-key-0123456789abcdef"
	var (
		mu   sync.Mutex
		seen []string
	)
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = io.WriteString(w, `{"data":[]}`)
	}))
	cert, roots := selfSigned(t, "api.openai.com")
	upstream.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	upstream.StartTLS()
	defer upstream.Close()
	tlsCfg := &tls.Config{RootCAs: roots}
	factory := environment.NewEgressListenFactory(environment.EgressOptions{
		StaticHosts: map[string]string{"api.openai.com": upstream.Listener.Addr().String()},
		TLS:         tlsCfg,
	})

	b, client, logs := newFake(t, func(c *Config) {
		c.EgressHost = "127.0.0.1"
		c.EgressPortMin, c.EgressPortMax = 21000, 21099
	})
	spec := &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{
		Name: "OPENAI_API_KEY",
		Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_Sidecar{
			Sidecar: &environmentv1.SidecarInjection{Host: "api.openai.com"}}},
	}}}
	if err := b.Check(spec); err != nil {
		t.Fatalf("Check: %v", err)
	}
	inv := invocation(t, "inv-sidecar", spec)
	inv.Credentials[0].Value = key // the server resolves it from --secrets-dir
	inv.EgressListener = func(l net.Listener, token string) (func(), error) {
		return factory(l, token, inv.Network, inv.Credentials, slog.New(slog.DiscardHandler))
	}
	r := start(context.Background(), b, inv)
	job := waitJob(t, client, r, "neuron-inv-inv-sidecar")
	secret, policy := waitOwned(t, client, r, job.Name)

	// No trace of the key in anything the pod gets.
	pod := job.Spec.Template.Spec
	c := pod.Containers[0]
	if strings.Contains(c.String(), key) || strings.Contains(pod.String(), key) || strings.Contains(string(secret.Data["input.json"]), key) {
		t.Fatal("the model key is in the pod spec or its input")
	}
	if len(c.EnvFrom) != 0 {
		t.Errorf("envFrom %v", c.EnvFrom)
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Errorf("env %s comes from %v: the pod references a Secret", e.Name, e.ValueFrom)
		}
	}
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName != job.Name {
			t.Errorf("volume %s mounts Secret %s", v.Name, v.Secret.SecretName)
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	var baseURL string
	for _, kv := range environment.SidecarEnv(inv.Credentials) {
		k, v, _ := strings.Cut(kv, "=")
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
		if strings.HasSuffix(k, "_BASE_URL") {
			baseURL = v
		}
	}
	if !strings.HasPrefix(baseURL, "http://api.openai.com") || env["OPENAI_API_KEY"] != environment.SidecarPlaceholder {
		t.Fatalf("provider env: base URL %q, key %q", baseURL, env["OPENAI_API_KEY"])
	}
	i := slices.Index(c.Command, "--egress-proxy")
	if i < 0 {
		t.Fatalf("command %v has no --egress-proxy", c.Command)
	}
	proxy, err := url.Parse(c.Command[i+1])
	if err != nil {
		t.Fatal(err)
	}
	ap, err := netip.ParseAddrPort(proxy.Host)
	if err != nil || ap.Addr() != netip.MustParseAddr("127.0.0.1") || ap.Port() < 21000 || ap.Port() > 21099 {
		t.Fatalf("proxy address %q, want 127.0.0.1 and a port of 21000-21099", proxy.Host)
	}
	// The pod reaches the proxy, and nothing else.
	if eg := policy.Spec.Egress; len(eg) != 1 || len(eg[0].To) != 1 || eg[0].To[0].IPBlock.CIDR != "127.0.0.1/32" || len(eg[0].Ports) == 0 || eg[0].Ports[0].Port.IntValue() != int(ap.Port()) {
		t.Errorf("NetworkPolicy egress %+v, want the proxy's address and port alone", policy.Spec.Egress)
	}

	// As the pod's operator would: the provider's base URL through the
	// proxy.
	get := func(u *url.URL) (int, error) {
		tr := &http.Transport{Proxy: http.ProxyURL(u)}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get(baseURL + "/models")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(proxy); err != nil || code != http.StatusOK {
		t.Fatalf("through the proxy: %d, %v", code, err)
	}
	mu.Lock()
	if len(seen) != 1 || seen[0] != "Bearer "+key {
		t.Errorf("the model server saw %q, want the real key", seen)
	}
	mu.Unlock()
	noToken := *proxy
	noToken.User = nil
	if code, err := get(&noToken); err != nil || code != http.StatusProxyAuthRequired {
		t.Errorf("without the token: %d, %v, want 407", code, err)
	}

	want := &operatorv1.OperatorOutput{Message: text("done")}
	p := createPod(t, client, job, terminated(0, "Completed"))
	logs.set(p.Name, outputJSON(t, want)+"\n")
	finishJob(t, client, job, batchv1.JobComplete, "CompletionsReached")
	if _, err := r.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// The proxy ends with the run.
	if c, err := net.Dial("tcp", proxy.Host); err == nil {
		c.Close()
		t.Error("the egress proxy still listens after the run")
	}
	if _, err := client.BatchV1().Jobs(testNamespace).Get(context.Background(), job.Name, metav1.GetOptions{}); err == nil {
		t.Error("the Job is still there")
	}

	// Without an egress host: refused, naming the flag.
	b2, _, _ := newFake(t, nil)
	assertCode(t, b2.Check(spec), codes.FailedPrecondition, "--kube-egress-host")
}

// selfSigned returns a certificate for host, and a pool trusting it.
func selfSigned(t *testing.T, host string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}, pool
}
