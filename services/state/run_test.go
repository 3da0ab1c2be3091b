package state

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/scope"
)

// devServer is the server config of these tests: dev mode, quick stop.
var devServer = grpcserver.Config{Name: "state", Dev: true, ShutdownTimeout: 2 * time.Second}

// TestRunRefusesBadConfig: a bad Config is one line naming the setting's
// flag, before anything is served, and the Listener it was given is
// closed. A bad security config fails before the data directory is made.
func TestRunRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	untouched := filepath.Join(dir, "untouched")
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown backend", Config{Server: devServer, Backend: "pg"}, `--backend "pg": want bolt, postgres or memory`},
		{"postgres without a DSN", Config{Server: devServer, Backend: BackendPostgres}, "--backend postgres needs --postgres-dsn or --postgres-dsn-file"},
		{"unreadable DSN file", Config{Server: devServer, Backend: BackendPostgres, PostgresDSNFile: filepath.Join(dir, "missing")}, "--postgres-dsn-file"},
		{"store and backend", Config{Server: devServer, Backend: BackendBolt, Store: NewMemory()}, "exclusive"},
		{"security off without dev", Config{Server: grpcserver.Config{Name: "state"}, DataDir: untouched}, "--auth-policy"},
		{"data dir not a directory", Config{Server: devServer, DataDir: filepath.Join(file, "sub")}, "--data-dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			tt.cfg.Listener, tt.cfg.Log = lis, harness.Logger(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = Run(ctx, tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Run = %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			if _, err := lis.Accept(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("the Listener is still open after Run failed (Accept: %v)", err)
			}
		})
	}
	if _, err := os.Stat(untouched); !os.IsNotExist(err) {
		t.Errorf("a bad security config made the data directory (stat: %v)", err)
	}
}

// TestRunBoltKeepsData: Run's default backend is bbolt in DataDir; what
// one Run acknowledged, the next Run on the same directory serves.
func TestRunBoltKeepsData(t *testing.T) {
	dir := t.TempDir()
	s := scope.Session("s")
	var written uint64
	t.Run("first", func(t *testing.T) {
		c := serveRun(t, Config{DataDir: dir})
		w, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "k", Value: str("kept")})
		if err != nil {
			t.Fatal(err)
		}
		written = w.GetRevision()
	})
	if _, err := os.Stat(filepath.Join(dir, "state.db")); err != nil {
		t.Fatal(err)
	}
	c := serveRun(t, Config{DataDir: dir})
	r, err := c.Read(ctx, &statev1.ReadRequest{Scope: s, Key: "k"})
	if err != nil || r.GetValue().GetStringValue() != "kept" || r.GetRevision() != written {
		t.Fatalf("Read after a restart = %v, %v; want \"kept\" at revision %d", r, err, written)
	}
}

// TestRunStore: a Store given in the Config is served with the binary's
// chain (writes audited, the caller's keys kept out of the call log) and
// left open for its owner when Run returns.
func TestRunStore(t *testing.T) {
	store := NewMemory()
	defer store.Close()
	var logs bytes.Buffer // written only while the service runs, read after
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := scope.Session("s")
	const secretKey = "sk_live_notInTheCallLog42"
	t.Run("serve", func(t *testing.T) {
		addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
			return Run(ctx, Config{Server: devServer, Log: log, Listener: lis, Store: store})
		})
		c := statev1.NewStateServiceClient(harness.Dial(t, addr))
		if _, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "audited", Value: str("v")}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(ctx, &statev1.ReadRequest{Scope: s, Key: secretKey}); err == nil {
			t.Fatal("Read of a missing key succeeded")
		}
	})
	if got, err := store.Read(ctx, s, "audited"); err != nil || got.Value.GetStringValue() != "v" {
		t.Fatalf("the store after Run returned: %v, %v", got, err)
	}
	out := logs.String()
	if !strings.Contains(out, `"msg":"audit"`) || !strings.Contains(out, `"audited"`) {
		t.Errorf("no audit line for the write: %s", out)
	}
	if strings.Contains(out, secretKey) {
		t.Errorf("the caller's key reached the log: %s", out)
	}
}

// haltWrites is a StoreMiddleware that halts every Write of the key
// "halted" before the service sees it, as a HALT verdict does.
type haltWrites struct{}

func (haltWrites) StoreServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if w, ok := req.(*statev1.WriteRequest); ok && w.GetKey() == "halted" {
			return nil, status.Error(codes.PermissionDenied, "halted by policy")
		}
		return h(ctx, req)
	}
}

// TestRunMiddlewareOutsideAudit: the Config's middleware runs outside
// the audit log, so a write it halts is neither applied nor audited, and
// one it lets through is both.
func TestRunMiddlewareOutsideAudit(t *testing.T) {
	store := NewMemory()
	defer store.Close()
	var logs bytes.Buffer // written only while the service runs, read after
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	s := scope.Session("s")
	t.Run("serve", func(t *testing.T) {
		addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
			return Run(ctx, Config{Server: devServer, Log: log, Listener: lis, Store: store, Middleware: haltWrites{}})
		})
		c := statev1.NewStateServiceClient(harness.Dial(t, addr))
		if _, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "halted", Value: str("v")}); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("halted Write = %v, want PERMISSION_DENIED", err)
		}
		if _, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "allowed", Value: str("v")}); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := store.Read(ctx, s, "halted"); errs.Code(err) != codes.NotFound {
		t.Errorf("the halted write reached the store: Read = %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, `"key":"allowed"`) {
		t.Errorf("the allowed write was not audited: %s", out)
	}
	if strings.Contains(out, `"key":"halted"`) {
		t.Errorf("the halted write was audited (the middleware is inside the audit log): %s", out)
	}
}

// TestRunMiddlewareListsNoValues: behind a store middleware, which sees
// the values read on Read only, List answers include_values without
// values (the caller reads each key, through the middleware); without
// one, with them.
func TestRunMiddlewareListsNoValues(t *testing.T) {
	s := scope.Session("s")
	for _, mw := range []StoreMiddleware{nil, haltWrites{}} {
		store := NewMemory()
		defer store.Close()
		addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
			return Run(ctx, Config{Server: devServer, Listener: lis, Store: store, Middleware: mw})
		})
		c := statev1.NewStateServiceClient(harness.Dial(t, addr))
		for _, k := range []string{"a", "b"} {
			if _, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: k, Value: str("value of " + k)}); err != nil {
				t.Fatal(err)
			}
		}
		res, err := c.List(ctx, &statev1.ListRequest{Scope: s, IncludeValues: true, Reverse: true})
		if err != nil {
			t.Fatal(err)
		}
		if items := res.GetItems(); len(items) != 2 || items[0].GetKey() != "b" || items[1].GetKey() != "a" {
			t.Fatalf("middleware %v: listed %v, want b, a", mw, items)
		}
		for _, it := range res.GetItems() {
			if withValue := it.GetValue() != nil; withValue != (mw == nil) {
				t.Errorf("middleware %v: key %q has a value: %t, want %t", mw, it.GetKey(), withValue, mw == nil)
			} else if withValue && it.GetValue().GetStringValue() != "value of "+it.GetKey() {
				t.Errorf("key %q listed with %v", it.GetKey(), it.GetValue())
			}
		}
	}
}
