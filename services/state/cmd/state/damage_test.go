//go:build unix

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/boltdamage"
	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/scope"
)

// TestDamagedFile starts the real binary on copies of a state.db it wrote,
// each damaged another way. A damaged file must be refused at start, with
// exit status 1 and one line naming it and saying what to do: before the
// check, a cut into the used data started and then panicked on every
// write (INTERNAL), a deeper cut died of SIGBUS at open, and a page of
// garbage panicked or faulted wherever it was read. One zeroed meta page
// must start, at the older transaction, with the fallback logged at
// ERROR.
func TestDamagedFile(t *testing.T) {
	bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/state/cmd/state")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	healthy := filepath.Join(t.TempDir(), "data")
	writeHealthyState(ctx, t, bin, healthy)
	l := boltdamage.Inspect(t, filepath.Join(healthy, "state.db"))
	ps, hwm := int64(l.PageSize), int64(l.HighWater())
	if hwm < 12 || !l.Has("leaf") || !l.Has("freelist") {
		t.Fatalf("the healthy file is too small to damage interestingly: %v", l.Types)
	}
	t.Logf("healthy state.db: txid %d, %d pages of %d: %v", l.Txid, hwm, ps, l.Types)

	cases := []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"cut inside meta page 1", func(t *testing.T, p string) { boltdamage.Truncate(t, p, ps+100) }},
		{"cut after the meta pages", func(t *testing.T, p string) { boltdamage.Truncate(t, p, 2*ps) }},
		{"cut at half", func(t *testing.T, p string) { boltdamage.Truncate(t, p, hwm/2*ps) }},
		{"cut two pages into the pages in use", func(t *testing.T, p string) { boltdamage.Truncate(t, p, int64(l.LastInUse()-1)*ps) }},
		{"both meta pages zeroed", func(t *testing.T, p string) {
			boltdamage.ZeroPage(t, p, l, 0)
			boltdamage.ZeroPage(t, p, l, 1)
		}},
		{"garbage leaf page", func(t *testing.T, p string) { boltdamage.GarbagePage(t, p, l, l.Last(t, "leaf")) }},
		{"zeroed leaf page", func(t *testing.T, p string) { boltdamage.ZeroPage(t, p, l, l.Last(t, "leaf")) }},
		{"garbage freelist page", func(t *testing.T, p string) { boltdamage.GarbagePage(t, p, l, l.Last(t, "freelist")) }},
	}
	if l.Has("branch") {
		cases = append(cases, struct {
			name   string
			damage func(t *testing.T, path string)
		}{"garbage branch page", func(t *testing.T, p string) { boltdamage.GarbagePage(t, p, l, l.Last(t, "branch")) }})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := boltdamage.CopyDir(t, healthy)
			path := filepath.Join(dir, "state.db")
			c.damage(t, path)
			line := boltdamage.ExpectRefusal(t, bin, envPrefix, path, "state: open state database "+path+": ",
				"--dev", "--backend", "bolt", "--data-dir", dir, "--addr", proc.FreeAddr(t), "--log-format", "text")
			t.Log(line)
		})
	}

	t.Run("cut only in free pages", func(t *testing.T) {
		if l.LastInUse() == l.HighWater()-1 {
			t.Skipf("the last page is in use: %v", l.Types)
		}
		dir := boltdamage.CopyDir(t, healthy)
		path := filepath.Join(dir, "state.db")
		boltdamage.Truncate(t, path, int64(l.LastInUse()+1)*ps)
		addr := proc.FreeAddr(t)
		srv := startState(ctx, t, bin, dir, addr, filepath.Join(t.TempDir(), "server.log"))
		conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, MaxRetries: -1, Timeout: rpcTimeout})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		waitServing(ctx, t, healthpb.NewHealthClient(conn), srv)
		if !strings.Contains(srv.Log(), "level=WARN msg=\"the file was cut short, but only in free pages") {
			t.Errorf("no warning of the cut")
		}
		client := statev1.NewStateServiceClient(conn)
		for i := range 20 {
			v := structpb.NewStringValue(strings.Repeat("more ", 500))
			if _, err := client.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("damage"), Key: fmt.Sprint("more", i), Value: v}); err != nil {
				t.Fatalf("Write after the cut: %v", err)
			}
		}
		got, err := client.Read(ctx, &statev1.ReadRequest{Scope: scope.Session("damage"), Key: "w7/k059"})
		if err != nil || got.GetRevision() == 0 {
			t.Fatalf("Read of the last key written before the cut: %v, %v", got, err)
		}
		srv.Terminate(t)
	})

	t.Run("newer meta page zeroed", func(t *testing.T) {
		dir := boltdamage.CopyDir(t, healthy)
		path := filepath.Join(dir, "state.db")
		boltdamage.ZeroPage(t, path, l, l.NewerMeta())
		addr := proc.FreeAddr(t)
		srv := startState(ctx, t, bin, dir, addr, filepath.Join(t.TempDir(), "server.log"))
		conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, MaxRetries: -1, Timeout: rpcTimeout})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		waitServing(ctx, t, healthpb.NewHealthClient(conn), srv)
		var warning string
		for line := range strings.Lines(srv.Log()) {
			if strings.Contains(line, "DAMAGED META PAGE") {
				warning = strings.TrimSpace(line)
			}
		}
		t.Log(warning)
		for _, want := range []string{"level=ERROR", "file=" + path, fmt.Sprintf("opened_txid=%d", l.Txid-1),
			fmt.Sprintf("possibly_missing_txid=%d", l.Txid), fmt.Sprintf("bad_meta_page=%d", l.NewerMeta())} {
			if !strings.Contains(warning, want) {
				t.Errorf("the fallback warning %q does not say %q", warning, want)
			}
		}
		// It serves: writes commit (no panic, no INTERNAL) and read back.
		client := statev1.NewStateServiceClient(conn)
		v := structpb.NewStringValue("after the fallback")
		if _, err := client.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("damage"), Key: "after", Value: v}); err != nil {
			t.Fatalf("Write after the fallback: %v", err)
		}
		got, err := client.Read(ctx, &statev1.ReadRequest{Scope: scope.Session("damage"), Key: "after"})
		if err != nil || got.GetValue().GetStringValue() != v.GetStringValue() {
			t.Fatalf("Read after the fallback: %v, %v", got, err)
		}
		srv.Terminate(t)
	})
}

// writeHealthyState runs the binary on dataDir, writes enough keys for a
// file of a few dozen pages (leaf, branch and free pages), and stops it.
func writeHealthyState(ctx context.Context, t *testing.T, bin, dataDir string) {
	t.Helper()
	addr := proc.FreeAddr(t)
	srv := startState(ctx, t, bin, dataDir, addr, filepath.Join(t.TempDir(), "healthy.log"))
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, MaxRetries: -1, Timeout: rpcTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(ctx, t, healthpb.NewHealthClient(conn), srv)
	client := statev1.NewStateServiceClient(conn)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				v := structpb.NewStringValue(strings.Repeat(fmt.Sprintf("writer %d value %d ", w, i), 20))
				_, err := client.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("damage"), Key: fmt.Sprintf("w%d/k%03d", w, i), Value: v})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Write: %v", err)
	}
	srv.Terminate(t)
}
