package testenv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubeAPIServerVersion is the Kubernetes release scripts/kube-apiserver.sh
// builds and KubeAPIServer looks for.
const KubeAPIServerVersion = "v1.34.4"

// Kube is a running kube-apiserver (with its etcd) for one test. There is
// no controller-manager, scheduler or kubelet: objects are stored and
// validated, but no controller acts on them and no pod ever runs, so a
// test simulates what those would do (for example by writing a Job's
// status through the status subresource).
type Kube struct {
	// Kubeconfig is the path of a kubeconfig file for the server, usable
	// with kubectl --kubeconfig and client-go. Its user is in the
	// system:masters group, and every request is authorized.
	Kubeconfig string
	// Config is the client-go configuration of the same user.
	Config *rest.Config
}

// kubeStartTimeout bounds how long KubeAPIServer waits for etcd and then
// for the API server to become ready.
const kubeStartTimeout = 2 * time.Minute

// KubeAPIServerPath returns where KubeAPIServer looks for the
// kube-apiserver binary: $NEURON_KUBE_APISERVER when set, else the cache
// scripts/kube-apiserver.sh fills,
// ${NEURON_CACHE:-$HOME/.cache/neuron}/kube-apiserver-v1.34.4/kube-apiserver.
func KubeAPIServerPath() string {
	if p := os.Getenv("NEURON_KUBE_APISERVER"); p != "" {
		return p
	}
	cache := os.Getenv("NEURON_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache", "neuron")
	}
	return filepath.Join(cache, "kube-apiserver-"+KubeAPIServerVersion, "kube-apiserver")
}

// KubeAPIServer starts etcd and a kube-apiserver on free loopback ports
// for the calling test and stops both, removing their data, when the test
// ends. Each call starts a new pair (a few seconds), so keep the tests
// that need one few.
//
// It skips the test when the binary is missing (build it with
// scripts/kube-apiserver.sh) or etcd is not on PATH (apt-get install
// etcd-server), and fails it when the server does not become ready.
//
// The server authenticates a static admin token (group system:masters),
// authorizes everything (AlwaysAllow), signs service-account tokens with
// a key generated here, serves TLS with a self-signed certificate (the
// kubeconfig skips verification), and runs without the ServiceAccount
// admission plugin, because no controller creates the "default"
// ServiceAccount of a new namespace.
func KubeAPIServer(t testing.TB) *Kube {
	t.Helper()
	bin := KubeAPIServerPath()
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		t.Skipf("no kube-apiserver at %s: run scripts/kube-apiserver.sh (about 3 minutes) to build kube-apiserver", bin)
	}
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd is not on PATH: apt-get install etcd-server (scripts/kube-apiserver.sh does this as root)")
	}

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), kubeStartTimeout)
	defer cancel()

	etcdURL := kubeStartEtcd(ctx, t, etcdBin, dir)

	token := kubeRandomHex(t, 24)
	files := kubeWriteAuthFiles(t, dir, token)
	port := kubeFreePort(t)
	certDir := filepath.Join(dir, "certs")
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + certDir,
		"--token-auth-file=" + files.tokens,
		"--authorization-mode=AlwaysAllow",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + files.publicKey,
		"--service-account-signing-key-file=" + files.privateKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=0",
	}
	apiserver := kubeStart(t, "kube-apiserver", bin, args, filepath.Join(dir, "kube-apiserver.log"))

	host := "https://127.0.0.1:" + strconv.Itoa(port)
	if err := kubeWaitReady(ctx, host, token, apiserver); err != nil {
		t.Fatalf("kube-apiserver did not become ready: %v\n%s", err, kubeTail(apiserver.logPath))
	}

	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["neuron-test"] = &clientcmdapi.Cluster{Server: host, InsecureSkipTLSVerify: true}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["neuron-test"] = &clientcmdapi.Context{Cluster: "neuron-test", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "neuron-test"
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("read back kubeconfig: %v", err)
	}
	return &Kube{Kubeconfig: kubeconfig, Config: rc}
}

// kubeProc is a server process started for a test.
type kubeProc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed when the process has exited
	err     error         // Wait's result, set before exited closes
}

// kubeStart starts bin with args, its output in logPath, and registers a
// cleanup that stops it (SIGTERM, then SIGKILL after a while).
func kubeStart(t testing.TB, name, bin string, args []string, logPath string) *kubeProc {
	t.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("%s log: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &kubeProc{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// kubeStartEtcd starts etcd with its data under dir and waits until it
// answers; it returns its client URL.
func kubeStartEtcd(ctx context.Context, t testing.TB, bin, dir string) string {
	t.Helper()
	data := filepath.Join(dir, "etcd")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatalf("etcd data dir: %v", err)
	}
	client := "http://127.0.0.1:" + strconv.Itoa(kubeFreePort(t))
	peer := "http://127.0.0.1:" + strconv.Itoa(kubeFreePort(t))
	p := kubeStart(t, "etcd", bin, []string{
		"--name=neuron-test",
		"--data-dir=" + data,
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=neuron-test=" + peer,
		"--logger=zap",
		"--log-level=warn",
	}, filepath.Join(dir, "etcd.log"))
	hc := &http.Client{Timeout: 2 * time.Second}
	err := kubePoll(ctx, p, func() error {
		resp, err := hc.Get(client + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/health: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("etcd did not become healthy: %v\n%s", err, kubeTail(p.logPath))
	}
	return client
}

// kubeWaitReady waits until the API server's /readyz answers 200.
func kubeWaitReady(ctx context.Context, host, token string, p *kubeProc) error {
	hc := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	defer hc.CloseIdleConnections()
	return kubePoll(ctx, p, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+"/readyz", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
}

// kubePoll calls check until it succeeds, p exits or ctx ends.
func kubePoll(ctx context.Context, p *kubeProc, check func() error) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited: %v", p.name, p.err)
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// kubeAuthFiles are the paths of the files the API server authenticates
// and signs with.
type kubeAuthFiles struct {
	tokens     string // static token file
	privateKey string // service-account signing key
	publicKey  string // service-account verification key
}

// kubeWriteAuthFiles writes a token file naming token as the admin (group
// system:masters) and a fresh ECDSA service-account key pair.
func kubeWriteAuthFiles(t testing.TB, dir, token string) kubeAuthFiles {
	t.Helper()
	f := kubeAuthFiles{
		tokens:     filepath.Join(dir, "tokens.csv"),
		privateKey: filepath.Join(dir, "sa.key"),
		publicKey:  filepath.Join(dir, "sa.pub"),
	}
	// token,user,uid,"group1,group2"
	line := token + `,admin,admin,"system:masters"` + "\n"
	if err := os.WriteFile(f.tokens, []byte(line), 0o600); err != nil {
		t.Fatalf("token file: %v", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("service-account key: %v", err)
	}
	priv, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("service-account key: %v", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatalf("service-account key: %v", err)
	}
	if err := os.WriteFile(f.privateKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv}), 0o600); err != nil {
		t.Fatalf("service-account key: %v", err)
	}
	if err := os.WriteFile(f.publicKey, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		t.Fatalf("service-account key: %v", err)
	}
	return f
}

// kubeFreePort returns a TCP port on 127.0.0.1 that was free a moment
// ago.
func kubeFreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// kubeRandomHex returns n random bytes, hex-encoded.
func kubeRandomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random: %v", err)
	}
	return hex.EncodeToString(b)
}

// kubeTail returns the last lines of a log file, for failure messages.
func kubeTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "(no log)"
		}
		return "(log: " + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
