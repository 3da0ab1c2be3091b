package grpcserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/interceptor/auth"
)

// pki writes a CA, a server certificate for "bufnet", and client
// certificates to dir, returning their paths.
type pki struct{ dir string }

func newCert(t *testing.T, dir, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, isCA bool, dns ...string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		DNSNames:              dns,
		IsCA:                  isCA,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	writePEM(t, filepath.Join(dir, name+".key"), "EC PRIVATE KEY", keyDER)
	return cert, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCert(t, dir, "ca", nil, nil, true)
	newCert(t, dir, "server", ca, caKey, false, "bufnet")
	newCert(t, dir, "orchestrator", ca, caKey, false)
	newCert(t, dir, "stranger", ca, caKey, false)
	newCert(t, dir, "rogue", nil, nil, false) // self-signed, not by our CA
	p := func(n string) string { return filepath.Join(dir, n) }

	policy, err := auth.NewPolicy([]auth.Principal{{Name: "orchestrator", Allow: []string{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Name: "mtls", TLSCert: p("server.pem"), TLSKey: p("server.key"), ClientCA: p("ca.pem")}, nil, WithPolicy(policy))
	if err != nil {
		t.Fatal(err)
	}
	statev1.RegisterStateServiceServer(srv, &fakeState{})
	lis := bufconn.Listen(1 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })

	tests := []struct {
		name   string
		client string
		code   codes.Code
		who    string
	}{
		{"known principal", "orchestrator", codes.OK, "orchestrator"},
		{"valid cert, unknown principal", "stranger", codes.PermissionDenied, ""},
		{"cert from another CA", "rogue", codes.Unavailable, ""},
		{"no client cert", "", codes.Unavailable, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := grpcclient.Config{Target: "passthrough:///bufnet", CAFile: p("ca.pem"), ServerName: "bufnet", MaxRetries: -1, Timeout: 3 * time.Second}
			if tt.client != "" {
				cfg.CertFile, cfg.KeyFile = p(tt.client+".pem"), p(tt.client+".key")
			}
			conn, err := grpcclient.Dial(cfg, dialer)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			resp, err := statev1.NewStateServiceClient(conn).Read(context.Background(), read("k"))
			if got := status.Code(err); got != tt.code {
				t.Fatalf("code %v (%v), want %v", got, err, tt.code)
			}
			if tt.who != "" && resp.GetValue().GetStringValue() != tt.who {
				t.Errorf("principal %q, want %q", resp.GetValue().GetStringValue(), tt.who)
			}
		})
	}
}
