package remote

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/state"
)

// stateBehind serves a real state server on a memory backend behind the
// standard chain plus m's store interceptor.
func stateBehind(t *testing.T, m *Middleware) (*state.Memory, statev1.StateServiceClient, *grpc.ClientConn) {
	t.Helper()
	mem := state.NewMemory()
	t.Cleanup(func() { mem.Close() })
	addr := serveStandard(t, func(r grpc.ServiceRegistrar) { statev1.RegisterStateServiceServer(r, state.NewServer(mem)) },
		[]grpc.UnaryServerInterceptor{m.StoreServerInterceptor()}, nil)
	conn := dial(t, addr)
	return mem, statev1.NewStateServiceClient(conn), conn
}

func TestStore(t *testing.T) {
	ctx := context.Background()
	p := &policy{name: "store-policy"}
	mem, c, conn := stateBehind(t, startPolicy(t, p, Config{}))
	sc := scope.Session("s1")
	write := func(key, v string) error {
		_, err := c.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: key, Value: structpb.NewStringValue(v)})
		return err
	}
	stored := func(key string) string {
		it, err := mem.Read(ctx, sc, key)
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return it.Value.GetStringValue()
	}

	t.Run("halted write is not applied", func(t *testing.T) {
		wantStatus(t, write("forbidden", "x"), codes.PermissionDenied, `"store-policy"`, haltReason, `"forbidden"`)
		if _, err := mem.Read(ctx, sc, "forbidden"); err == nil {
			t.Fatal("a halted write was stored")
		}
	})
	t.Run("rewritten write value is stored", func(t *testing.T) {
		if err := write("pw", "password=hunter2"); err != nil {
			t.Fatal(err)
		}
		if got := stored("pw"); got != "[redacted]" {
			t.Fatalf("stored %q, want the rewrite", got)
		}
	})
	t.Run("read value redacted after", func(t *testing.T) {
		if err := write("card", "4111 1111 1111 1111"); err != nil {
			t.Fatal(err)
		}
		resp, err := c.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "card"})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetValue().GetStringValue(); got != "****" || resp.GetRevision() == 0 {
			t.Fatalf("read %q rev %d, want the redaction and the real revision", got, resp.GetRevision())
		}
		if got := stored("card"); got != "4111 1111 1111 1111" {
			t.Fatalf("the stored value changed: %q", got)
		}
	})
	t.Run("read halted after", func(t *testing.T) {
		if err := write("hidden", "x"); err != nil {
			t.Fatal(err)
		}
		_, err := c.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "hidden"})
		wantStatus(t, err, codes.PermissionDenied, `"store-policy"`, haltReason)
	})
	t.Run("halted delete is not applied", func(t *testing.T) {
		if _, err := mem.Write(ctx, sc, "forbidden", structpb.NewStringValue("kept"), state.Guard{}); err != nil {
			t.Fatal(err)
		}
		_, err := c.Delete(ctx, &statev1.DeleteRequest{Scope: sc, Key: "forbidden"})
		wantStatus(t, err, codes.PermissionDenied)
		if got := stored("forbidden"); got != "kept" {
			t.Fatalf("stored %q after a halted delete", got)
		}
	})
	t.Run("list and search are sent", func(t *testing.T) {
		n := p.callsAt(storeBoundary, before)
		if _, err := c.List(ctx, &statev1.ListRequest{Scope: sc}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Search(ctx, &statev1.SearchRequest{Scope: sc, Query: "card"}); err != nil {
			t.Fatal(err)
		}
		if got := p.callsAt(storeBoundary, before) - n; got != 2 {
			t.Fatalf("%d store calls before, want 2", got)
		}
	})
	t.Run("health passes through", func(t *testing.T) {
		n := p.callsAt(storeBoundary, before) + p.callsAt(storeBoundary, after)
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := p.callsAt(storeBoundary, before) + p.callsAt(storeBoundary, after); got != n {
			t.Fatalf("the middleware was called for a health check")
		}
	})
}
