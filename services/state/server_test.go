package state

import (
	"context"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// TestServerNilFields checks that requests with nil or missing fields
// (as if protovalidate were bypassed) are INVALID_ARGUMENT, not panics.
func TestServerNilFields(t *testing.T) {
	srv := NewServer(NewMemory())
	calls := []struct {
		name string
		call func() error
	}{
		{"read nil", func() error { _, err := srv.Read(ctx, nil); return err }},
		{"read empty", func() error { _, err := srv.Read(ctx, &statev1.ReadRequest{}); return err }},
		{"read no key", func() error { _, err := srv.Read(ctx, &statev1.ReadRequest{Scope: scope.Global()}); return err }},
		{"write nil", func() error { _, err := srv.Write(ctx, nil); return err }},
		{"write empty", func() error { _, err := srv.Write(ctx, &statev1.WriteRequest{}); return err }},
		{"write no value", func() error {
			_, err := srv.Write(ctx, &statev1.WriteRequest{Scope: scope.Global(), Key: "k"})
			return err
		}},
		{"write empty scope", func() error {
			_, err := srv.Write(ctx, &statev1.WriteRequest{Scope: &typesv1.Scope{}, Key: "k", Value: str("v")})
			return err
		}},
		{"delete nil", func() error { _, err := srv.Delete(ctx, nil); return err }},
		{"delete empty", func() error { _, err := srv.Delete(ctx, &statev1.DeleteRequest{}); return err }},
		{"list nil", func() error { _, err := srv.List(ctx, nil); return err }},
		{"list negative size", func() error {
			_, err := srv.List(ctx, &statev1.ListRequest{Scope: scope.Global(), PageSize: -1})
			return err
		}},
		{"search nil", func() error { _, err := srv.Search(ctx, nil); return err }},
		{"search no query", func() error { _, err := srv.Search(ctx, &statev1.SearchRequest{Scope: scope.Global()}); return err }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			wantCode(t, c.call(), codes.InvalidArgument, "")
		})
	}
}

// dial serves srv over an in-memory connection with the one interceptor
// the handler relies on (errors mapped by errs.ToStatus) and returns a
// client.
func dial(t *testing.T, srv statev1.StateServiceServer) statev1.StateServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err != nil {
			return nil, errs.ToStatus(err).Err()
		}
		return resp, nil
	}))
	statev1.RegisterStateServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return statev1.NewStateServiceClient(conn)
}

func TestServerOverGRPC(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			c := dial(t, NewServer(be.open(t)))
			s := scope.Agent("wf", "agent")
			w, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "k", Value: str("hello grpc"), ExpectedRevision: rev(0)})
			if err != nil {
				t.Fatal(err)
			}
			r, err := c.Read(ctx, &statev1.ReadRequest{Scope: s, Key: "k"})
			if err != nil || r.GetRevision() != w.GetRevision() || r.GetValue().GetStringValue() != "hello grpc" {
				t.Fatalf("Read = %v, %v", r, err)
			}
			_, err = c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "k", Value: str("x"), ExpectedRevision: rev(w.GetRevision() + 1)})
			err = errs.FromGRPC(err)
			wantCode(t, err, codes.FailedPrecondition, "expected")
			if errs.Reason(err) != errs.ReasonStaleRevision {
				t.Fatalf("reason %q", errs.Reason(err))
			}
			_, err = c.Read(ctx, &statev1.ReadRequest{Scope: s, Key: "missing"})
			wantCode(t, errs.FromGRPC(err), codes.NotFound, "")
			big, _ := structpb.NewValue(string(make([]byte, DefaultMaxValueBytes)))
			_, err = c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "big", Value: big})
			wantCode(t, errs.FromGRPC(err), codes.ResourceExhausted, "--max-value-bytes")
			d, err := c.Delete(ctx, &statev1.DeleteRequest{Scope: s, Key: "k", IdempotencyKey: "d"})
			if err != nil || !d.GetExisted() {
				t.Fatalf("Delete = %v, %v", d, err)
			}
			d, err = c.Delete(ctx, &statev1.DeleteRequest{Scope: s, Key: "k", IdempotencyKey: "d"})
			if err != nil || !d.GetExisted() || !d.GetReplayed() {
				t.Fatalf("Delete retry = %v, %v", d, err)
			}

			// Defaults: page size 100, search limit 10.
			for i := range DefaultPageSize + 5 {
				if _, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: fmt.Sprintf("item/%03d", i), Value: str("searchable item")}); err != nil {
					t.Fatal(err)
				}
			}
			l, err := c.List(ctx, &statev1.ListRequest{Scope: s, Prefix: "item/"})
			if err != nil || len(l.GetItems()) != DefaultPageSize || l.GetNextPageToken() == "" {
				t.Fatalf("List = %d items, %v", len(l.GetItems()), err)
			}
			l, err = c.List(ctx, &statev1.ListRequest{Scope: s, Prefix: "item/", PageToken: l.GetNextPageToken()})
			if err != nil || len(l.GetItems()) != 5 || l.GetNextPageToken() != "" {
				t.Fatalf("List page 2 = %d items, %v", len(l.GetItems()), err)
			}
			_, err = c.List(ctx, &statev1.ListRequest{Scope: s, Prefix: "item/", PageToken: "tampered"})
			wantCode(t, errs.FromGRPC(err), codes.InvalidArgument, "page_token")
			sr, err := c.Search(ctx, &statev1.SearchRequest{Scope: s, Query: "searchable"})
			if err != nil || len(sr.GetResults()) != DefaultSearchLimit {
				t.Fatalf("Search = %d results, %v", len(sr.GetResults()), err)
			}
			if res := sr.GetResults()[0]; res.GetSnippet() != "searchable item" || res.GetRevision() == 0 || res.GetScore() <= 0 {
				t.Fatalf("result %v", res)
			}
		})
	}
}
