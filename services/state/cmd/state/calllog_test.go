package main

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/scope"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A failed Read's key reaches the caller but not the state service's
// log, at any log level: the key is the caller's data and may be a
// credential (a sandbox chooses the keys it reads).
func TestFailedReadKeyNotLogged(t *testing.T) {
	const key = "sk_live_Zx9credentialValue0042"
	for _, level := range []string{"info", "debug"} {
		t.Run(level, func(t *testing.T) {
			logs := &lockedBuffer{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, []string{"--dev", "--backend", "memory", "--addr", "127.0.0.1:0", "--log-level", level}, logs)
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
			addrRE := regexp.MustCompile(`"msg":"SERVING"[^\n]*"addr":"([^"]+)"`)
			var addr string
			for deadline := time.Now().Add(30 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if m := addrRE.FindStringSubmatch(logs.String()); m != nil {
					addr = m[1]
				}
			}
			if addr == "" {
				t.Fatalf("the state service did not start: %s", logs.String())
			}
			conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := statev1.NewStateServiceClient(conn)
			_, err = c.Read(context.Background(), &statev1.ReadRequest{Scope: scope.Session("s"), Key: key})
			if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), key) {
				t.Fatalf("Read = %v, want NOT_FOUND naming the key to the caller", err)
			}
			// A long key is quoted truncated: still the key.
			long := key + strings.Repeat("x", 2048)
			_, err = c.Read(context.Background(), &statev1.ReadRequest{Scope: scope.Session("s"), Key: long})
			if status.Code(err) != codes.NotFound {
				t.Fatalf("Read of a long key = %v", err)
			}
			// The call lines are written before the calls return.
			out := logs.String()
			if !strings.Contains(out, `"grpc.code":"NotFound"`) {
				t.Errorf("no call lines for the failed calls: %s", out)
			}
			if strings.Contains(out, key) {
				t.Errorf("the key reached the log: %s", out)
			}
		})
	}
}
