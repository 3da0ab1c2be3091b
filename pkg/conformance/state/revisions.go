package state

import (
	"testing"

	"google.golang.org/grpc/codes"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// testRevisions checks Read, Write and Delete with revisions and
// compare-and-set.
func testRevisions(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"ReadMissingKeyIsNotFound", testReadMissing},
		{"ValuesRoundTrip", testValuesRoundTrip},
		{"EveryWriteReturnsGreaterRevision", testGrowingRevisions},
		{"ExpectedRevisionCurrent", testExpectedCurrent},
		{"ExpectedRevisionStale", testExpectedStale},
		{"ExpectedRevisionOfMissingKey", testExpectedMissing},
		{"MustNotExist", testMustNotExist},
		{"DeleteMissingKeyIsNoOp", testDeleteMissing},
		{"Delete", testDelete},
		{"DeleteExpectedRevision", testDeleteExpected},
		{"RecreateAfterDeleteHasGreaterRevision", testRecreate},
	})
}

func testReadMissing(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	s.wantMissing(t, sc, "never-written")
	s.write(t, sc, "other", str("x"))
	s.wantMissing(t, sc, "never-written")
	s.wantMissing(t, sc, "othe")   // a prefix of a key
	s.wantMissing(t, sc, "other/") // a key with it as a prefix
}

// testValuesRoundTrip: any JSON value is read back as written.
func testValuesRoundTrip(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	values := map[string]any{
		"null":    nil,
		"true":    true,
		"false":   false,
		"zero":    0.0,
		"number":  -12345.625,
		"big":     1e300,
		"empty":   "",
		"string":  "hello, \"world\"\n\t\\ </script>",
		"unicode": "ключ 日本語 🙂 e\u0301",
		"list":    []any{1.0, "two", nil, true, []any{}, map[string]any{}},
		"object":  map[string]any{"a": map[string]any{"b": []any{map[string]any{"c": "deep"}}}, "": "empty name", "x y": 1.5},
		"emptyl":  []any{},
		"emptyo":  map[string]any{},
	}
	for name, v := range values {
		t.Run(name, func(t *testing.T) {
			pv := jsonValue(t, v)
			r := s.write(t, sc, name, pv)
			s.wantValue(t, sc, name, pv, r)
		})
	}
}

func testGrowingRevisions(t *testing.T, s *suite) {
	sc := scope.Workflow(s.id("wf"))
	var last uint64
	for i := range 5 {
		r := s.write(t, sc, "k", num(float64(i)))
		if r <= last {
			t.Fatalf("write %d returned revision %d; the previous was %d", i, r, last)
		}
		last = r
		s.wantValue(t, sc, "k", num(float64(i)), r)
	}
	// Writing the same value again is still a new revision.
	r := s.write(t, sc, "k", num(4))
	if r <= last {
		t.Fatalf("rewriting the same value returned revision %d; the previous was %d", r, last)
	}
	items := s.listAll(t, sc, "", 0)
	if len(items) != 1 || items[0].GetRevision() != r {
		t.Fatalf("List = %v; want k at revision %d", items, r)
	}
}

func testExpectedCurrent(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	r1 := s.write(t, sc, "k", str("v1"))
	res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v2"), ExpectedRevision: rev(r1)})
	if err != nil {
		t.Fatalf("Write with the current revision as expected_revision: %v", err)
	}
	if res.GetRevision() <= r1 {
		t.Fatalf("revision %d after %d", res.GetRevision(), r1)
	}
	s.wantValue(t, sc, "k", str("v2"), res.GetRevision())
}

func testExpectedStale(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	r1 := s.write(t, sc, "k", str("v1"))
	r2 := s.write(t, sc, "k", str("v2"))
	for _, stale := range []uint64{r1, r2 + 1000} {
		_, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v3"), ExpectedRevision: rev(stale)})
		wantCode(t, err, codes.FailedPrecondition, errs.ReasonStaleRevision)
		s.wantValue(t, sc, "k", str("v2"), r2) // nothing changed
	}
	// Nor did the failed writes consume the key's revision: the current
	// one still works as expected_revision.
	if _, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v3"), ExpectedRevision: rev(r2)}); err != nil {
		t.Fatalf("Write expecting the current revision after stale attempts: %v", err)
	}
}

func testExpectedMissing(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	_, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v"), ExpectedRevision: rev(7)})
	wantCode(t, err, codes.FailedPrecondition, errs.ReasonStaleRevision)
	s.wantMissing(t, sc, "k")
}

func testMustNotExist(t *testing.T, s *suite) {
	sc := scope.Agent(s.id("wf"), "a")
	res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("first"), ExpectedRevision: rev(0)})
	if err != nil {
		t.Fatalf("Write with expected_revision 0 of a new key: %v", err)
	}
	_, err = s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("second"), ExpectedRevision: rev(0)})
	wantCode(t, err, codes.FailedPrecondition, errs.ReasonStaleRevision)
	s.wantValue(t, sc, "k", str("first"), res.GetRevision())
	// An unset expected_revision is unconditional, not "must not exist".
	r := s.write(t, sc, "k", str("third"))
	s.wantValue(t, sc, "k", str("third"), r)
}

func testDeleteMissing(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	rk := s.write(t, sc, "keep", str("x"))
	for range 2 {
		if s.del(t, sc, "missing") {
			t.Fatal("Delete of a missing key: existed = true")
		}
	}
	s.wantMissing(t, sc, "missing")
	s.wantValue(t, sc, "keep", str("x"), rk)
	wantKeys(t, "List", s.listAll(t, sc, "", 0), []string{"keep"})
}

func testDelete(t *testing.T, s *suite) {
	sc := scope.Custom(s.id("c"))
	s.write(t, sc, "k", str("x"))
	rk := s.write(t, sc, "k2", str("y"))
	if !s.del(t, sc, "k") {
		t.Fatal("Delete of an existing key: existed = false")
	}
	s.wantMissing(t, sc, "k")
	if s.del(t, sc, "k") {
		t.Fatal("second Delete: existed = true")
	}
	s.wantValue(t, sc, "k2", str("y"), rk)
	wantKeys(t, "List after Delete", s.listAll(t, sc, "", 0), []string{"k2"})
}

func testDeleteExpected(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	r1 := s.write(t, sc, "k", str("v1"))
	r2 := s.write(t, sc, "k", str("v2"))
	_, err := s.c.Delete(ctx(t), &statev1.DeleteRequest{Scope: sc, Key: "k", ExpectedRevision: rev(r1)})
	wantCode(t, err, codes.FailedPrecondition, errs.ReasonStaleRevision)
	s.wantValue(t, sc, "k", str("v2"), r2)

	res, err := s.c.Delete(ctx(t), &statev1.DeleteRequest{Scope: sc, Key: "k", ExpectedRevision: rev(r2)})
	if err != nil {
		t.Fatalf("Delete with the current revision: %v", err)
	}
	if !res.GetExisted() {
		t.Fatal("Delete with the current revision: existed = false")
	}
	s.wantMissing(t, sc, "k")
}

func testRecreate(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	r1 := s.write(t, sc, "k", str("v1"))
	r2 := s.write(t, sc, "k", str("v2"))
	s.del(t, sc, "k")
	res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v3"), ExpectedRevision: rev(0)})
	if err != nil {
		t.Fatalf("Write with expected_revision 0 after Delete: %v", err)
	}
	r3 := res.GetRevision()
	if r3 <= r2 || r3 <= r1 {
		t.Fatalf("revision after delete and re-create is %d; before the delete it was %d", r3, r2)
	}
	s.wantValue(t, sc, "k", str("v3"), r3)
	// The revision from before the delete no longer matches.
	_, err = s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v4"), ExpectedRevision: rev(r2)})
	wantCode(t, err, codes.FailedPrecondition, errs.ReasonStaleRevision)
}
