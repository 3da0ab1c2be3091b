package testenv

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
)

// TemporalVersion is the Temporal CLI whose dev server Temporal runs;
// scripts/temporal.sh builds it.
const TemporalVersion = "v1.5.1"

// temporalStartTimeout bounds how long Temporal waits for the dev server
// to answer.
const temporalStartTimeout = 2 * time.Minute

// TemporalDev is a Temporal dev server started for a test.
type TemporalDev struct {
	// Address is the frontend's host:port.
	Address string
	// Namespace is the namespace the tests use ("default").
	Namespace string
	// Client is connected to it as the test's own client.
	Client client.Client
}

// TemporalPath returns where Temporal looks for the Temporal CLI:
// $NEURON_TEMPORAL when set, else the cache scripts/temporal.sh fills,
// ${NEURON_CACHE:-$HOME/.cache/neuron}/temporal-v1.5.1/temporal.
func TemporalPath() string {
	if p := os.Getenv("NEURON_TEMPORAL"); p != "" {
		return p
	}
	return filepath.Join(cacheDir(), "temporal-"+TemporalVersion, "temporal")
}

// cacheDir is where the heavy test dependencies are cached.
func cacheDir() string {
	if c := os.Getenv("NEURON_CACHE"); c != "" {
		return c
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "neuron")
}

// Temporal starts a Temporal dev server (`temporal server start-dev`,
// SQLite in the test's temporary directory, no UI) on a free loopback
// port for the calling test and stops it when the test ends. It takes a
// few seconds; keep the tests that need one few.
//
// It skips the test when the CLI is missing (build it with
// scripts/temporal.sh, about 7 minutes) and fails it when the server
// does not answer.
func Temporal(t testing.TB) *TemporalDev {
	t.Helper()
	bin := TemporalPath()
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		t.Skipf("no Temporal CLI at %s: run scripts/temporal.sh (about 7 minutes) to build it", bin)
	}
	dir := t.TempDir()
	port := kubeFreePort(t)
	args := []string{"server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", strconv.Itoa(port),
		"--db-filename", filepath.Join(dir, "temporal.db"), "--log-level", "warn"}
	p := kubeStart(t, "temporal", bin, args, filepath.Join(dir, "temporal.log"))
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	ctx, cancel := context.WithTimeout(context.Background(), temporalStartTimeout)
	defer cancel()
	var c client.Client
	err := kubePoll(ctx, p, func() error {
		dctx, stop := context.WithTimeout(ctx, 5*time.Second)
		defer stop()
		cl, err := client.DialContext(dctx, client.Options{HostPort: addr, Namespace: "default", Logger: tlog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
		if err != nil {
			return err
		}
		if _, err := cl.CheckHealth(dctx, &client.CheckHealthRequest{}); err != nil {
			cl.Close()
			return err
		}
		c = cl
		return nil
	})
	if err != nil {
		t.Fatalf("the Temporal dev server did not answer at %s: %v\n%s", addr, err, kubeTail(p.logPath))
	}
	t.Cleanup(c.Close)
	return &TemporalDev{Address: addr, Namespace: "default", Client: c}
}

// String describes the server for test logs.
func (d *TemporalDev) String() string {
	return fmt.Sprintf("temporal %s (namespace %s)", d.Address, d.Namespace)
}
