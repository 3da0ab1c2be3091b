package state

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcserver"
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

// serveRun starts the service through Run, as cmd/state starts it (the
// standard chain of pkg/grpcserver in dev mode, the audit interceptor,
// the call log through CallLogHandler), with cfg's backend, and returns
// a client.
func serveRun(t *testing.T, cfg Config) statev1.StateServiceClient {
	t.Helper()
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg.Server = grpcserver.Config{Name: "state", Dev: true, ShutdownTimeout: 2 * time.Second}
		cfg.Log, cfg.Listener = harness.Logger(t), lis
		return Run(ctx, cfg)
	})
	return statev1.NewStateServiceClient(harness.Dial(t, addr))
}

// runBackends are the backends of TestServerOverGRPC, as Run opens them.
var runBackends = []struct {
	name   string
	config func(t *testing.T) Config
}{
	{"memory", func(*testing.T) Config { return Config{Backend: BackendMemory} }},
	{"bolt", func(t *testing.T) Config { return Config{Backend: BackendBolt, DataDir: t.TempDir()} }},
	{"postgres", func(t *testing.T) Config { // skips without PostgreSQL
		return Config{Backend: BackendPostgres, PostgresDSN: testenv.Postgres(t)}
	}},
}

func TestServerOverGRPC(t *testing.T) {
	for _, be := range runBackends {
		t.Run(be.name, func(t *testing.T) {
			c := serveRun(t, be.config(t))
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

			// unindexed reaches the backend: stored and read, never found.
			u, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "history/1", Value: str("private pelican"), Unindexed: true})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := c.Read(ctx, &statev1.ReadRequest{Scope: s, Key: "history/1"}); err != nil || r.GetRevision() != u.GetRevision() {
				t.Fatalf("Read unindexed = %v, %v", r, err)
			}
			sr, err = c.Search(ctx, &statev1.SearchRequest{Scope: s, Query: "pelican"})
			if err != nil || len(sr.GetResults()) != 0 {
				t.Fatalf("Search unindexed = %v, %v", sr.GetResults(), err)
			}
		})
	}
}
