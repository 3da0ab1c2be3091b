package state

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// serviceName is the full name of the service, as health reports it.
const serviceName = "layer0.state.v1.StateService"

// testHealth: grpc.health.v1 reports the server and the service SERVING.
func testHealth(t *testing.T, s *suite) {
	for _, name := range []string{"", serviceName} {
		res, err := s.health.Check(ctx(t), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("Health.Check(%q): %v", name, err)
		}
		if res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Health.Check(%q) = %v; want SERVING", name, res.GetStatus())
		}
	}
}

// testAccess checks credentials: the read-only credential reads but
// never writes, and a call without credentials is refused.
func testAccess(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"ReadOnlyCredentialReads", testReadOnlyReads},
		{"ReadOnlyCredentialCannotWrite", testReadOnlyWrites},
		{"NoCredentialIsUnauthenticated", testNoCredential},
		{"UnknownTokenIsUnauthenticated", testUnknownToken},
	})
}

func (s *suite) needReadOnly(t *testing.T) {
	t.Helper()
	if s.ro == nil {
		t.Skip("no read-only credential (Target.ReadOnly; -readonly-token-file)")
	}
}

func (s *suite) needAnonymous(t *testing.T) {
	t.Helper()
	if s.anon == nil {
		t.Skip("server has no authentication to check (Target.Anonymous; -token-file or -readonly-token-file)")
	}
}

func testReadOnlyReads(t *testing.T, s *suite) {
	s.needReadOnly(t)
	sc := scope.Session(s.id("s"))
	w := term()
	r := s.write(t, sc, "k", str("readable "+w))

	got, err := s.ro.Read(ctx(t), &statev1.ReadRequest{Scope: sc, Key: "k"})
	if err != nil {
		t.Fatalf("Read with the read-only credential: %v", err)
	}
	if got.GetRevision() != r || got.GetValue().GetStringValue() != "readable "+w {
		t.Fatalf("Read with the read-only credential = %v at %d; want the written value at %d", got.GetValue(), got.GetRevision(), r)
	}
	_, err = s.ro.Read(ctx(t), &statev1.ReadRequest{Scope: sc, Key: "missing"})
	wantCode(t, err, codes.NotFound, "")

	list, err := s.ro.List(ctx(t), &statev1.ListRequest{Scope: sc})
	if err != nil {
		t.Fatalf("List with the read-only credential: %v", err)
	}
	wantKeys(t, "List with the read-only credential", list.GetItems(), []string{"k"})

	found, err := s.ro.Search(ctx(t), &statev1.SearchRequest{Scope: sc, Query: w})
	if err != nil {
		t.Fatalf("Search with the read-only credential: %v", err)
	}
	if len(found.GetResults()) != 1 || found.GetResults()[0].GetKey() != "k" {
		t.Fatalf("Search with the read-only credential = %v; want k", found.GetResults())
	}
}

func testReadOnlyWrites(t *testing.T, s *suite) {
	s.needReadOnly(t)
	sc := scope.Session(s.id("s"))
	r := s.write(t, sc, "k", str("original"))

	cases := map[string]func() error{
		"Write": func() error {
			_, err := s.ro.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("changed")})
			return err
		},
		"Write of a new key": func() error {
			_, err := s.ro.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "new", Value: str("x")})
			return err
		},
		"Write with expected revision": func() error {
			_, err := s.ro.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("changed"), ExpectedRevision: rev(r)})
			return err
		},
		"Delete": func() error {
			_, err := s.ro.Delete(ctx(t), &statev1.DeleteRequest{Scope: sc, Key: "k"})
			return err
		},
		"Delete of a missing key": func() error {
			_, err := s.ro.Delete(ctx(t), &statev1.DeleteRequest{Scope: sc, Key: "missing"})
			return err
		},
	}
	for name, call := range cases {
		if err := checkCode(call(), codes.PermissionDenied, ""); err != nil {
			t.Errorf("%s with the read-only credential: %v", name, err)
		}
	}
	s.wantValue(t, sc, "k", str("original"), r)
	s.wantMissing(t, sc, "new")
}

// anonymousCalls calls every method through c with a fresh scope.
func (s *suite) anonymousCalls(c context.Context, t *testing.T) map[string]error {
	sc := scope.Session(s.id("s"))
	out := map[string]error{}
	_, out["Read"] = s.anon.Read(c, &statev1.ReadRequest{Scope: sc, Key: "k"})
	_, out["Write"] = s.anon.Write(c, &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v")})
	_, out["Delete"] = s.anon.Delete(c, &statev1.DeleteRequest{Scope: sc, Key: "k"})
	_, out["List"] = s.anon.List(c, &statev1.ListRequest{Scope: sc})
	_, out["Search"] = s.anon.Search(c, &statev1.SearchRequest{Scope: sc, Query: "text"})
	if _, err := s.c.Read(ctx(t), &statev1.ReadRequest{Scope: sc, Key: "k"}); err == nil {
		t.Errorf("a Write without a valid credential was applied")
	}
	return out
}

func testNoCredential(t *testing.T, s *suite) {
	s.needAnonymous(t)
	for method, err := range s.anonymousCalls(ctx(t), t) {
		if err := checkCode(err, codes.Unauthenticated, ""); err != nil {
			t.Errorf("%s without a credential: %v", method, err)
		}
	}
}

func testUnknownToken(t *testing.T, s *suite) {
	s.needAnonymous(t)
	c := metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer conformance-unknown-token-"+randomHex(16))
	for method, err := range s.anonymousCalls(c, t) {
		if err := checkCode(err, codes.Unauthenticated, ""); err != nil {
			t.Errorf("%s with an unknown bearer token: %v", method, err)
		}
	}
}
