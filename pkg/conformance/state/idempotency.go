package state

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// testIdempotency checks retries of Write and Delete that carry an
// idempotency_key: recognised, not applied again, answered with the first
// attempt's result and replayed = true.
func testIdempotency(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"WriteRetryReplays", testWriteRetry},
		{"WriteRetryWithOtherValueDoesNotOverwrite", testWriteRetryOtherValue},
		{"WriteRetryAfterLaterWriteChangesNothing", testWriteRetryAfterLater},
		{"WriteRetryOfCompareAndSetReplays", testWriteRetryCAS},
		{"WithoutIdempotencyKeyEveryWriteApplies", testNoIdempotencyKey},
		{"IdempotencyKeyIsPerScope", testIdempotencyPerScope},
		{"IdempotencyKeyReusedForAnotherKey", testIdempotencyOtherKey},
		{"DeleteRetryReplays", testDeleteRetry},
	})
}

func (s *suite) idemWrite(t *testing.T, req *statev1.WriteRequest) *statev1.WriteResponse {
	t.Helper()
	res, err := s.c.Write(ctx(t), req)
	if err != nil {
		t.Fatalf("Write(%s, idempotency_key %q): %v", show(req.Scope, req.Key), req.IdempotencyKey, err)
	}
	return res
}

func wantReplay(t *testing.T, res *statev1.WriteResponse, first uint64) {
	t.Helper()
	if !res.GetReplayed() || res.GetRevision() != first {
		t.Fatalf("retry returned revision %d, replayed %v; want the first attempt's revision %d, replayed true", res.GetRevision(), res.GetReplayed(), first)
	}
}

func testWriteRetry(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	req := &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v1"), IdempotencyKey: "req-1"}
	first := s.idemWrite(t, req)
	if first.GetReplayed() {
		t.Fatal("first attempt: replayed = true")
	}
	for range 3 {
		wantReplay(t, s.idemWrite(t, req), first.GetRevision())
	}
	s.wantValue(t, sc, "k", str("v1"), first.GetRevision()) // applied once
}

// testWriteRetryOtherValue: the contract recognises a retry by its
// idempotency key; a "retry" carrying another value is still answered
// with the first result and does not overwrite.
func testWriteRetryOtherValue(t *testing.T, s *suite) {
	sc := scope.Workflow(s.id("wf"))
	first := s.idemWrite(t, &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("original"), IdempotencyKey: "req-1"})
	again := s.idemWrite(t, &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("different"), IdempotencyKey: "req-1"})
	wantReplay(t, again, first.GetRevision())
	s.wantValue(t, sc, "k", str("original"), first.GetRevision())
}

func testWriteRetryAfterLater(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	req := &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v1"), IdempotencyKey: "req-1"}
	first := s.idemWrite(t, req)
	r2 := s.write(t, sc, "k", str("v2"))
	wantReplay(t, s.idemWrite(t, req), first.GetRevision())
	s.wantValue(t, sc, "k", str("v2"), r2) // the late retry did not roll back v2
}

// testWriteRetryOfCompareAndSet: a retried "must not exist" write is
// answered from the first attempt, not refused as stale.
func testWriteRetryCAS(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	req := &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v1"), ExpectedRevision: rev(0), IdempotencyKey: "create-k"}
	first := s.idemWrite(t, req)
	wantReplay(t, s.idemWrite(t, req), first.GetRevision())
	s.wantValue(t, sc, "k", str("v1"), first.GetRevision())
}

func testNoIdempotencyKey(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	r1 := s.write(t, sc, "k", str("v"))
	r2 := s.write(t, sc, "k", str("v"))
	if r2 <= r1 {
		t.Fatalf("second identical write without idempotency key: revision %d after %d", r2, r1)
	}
}

func testIdempotencyPerScope(t *testing.T, s *suite) {
	id := s.id("s")
	a, b := scope.Session(id), scope.Custom(id)
	ra := s.idemWrite(t, &statev1.WriteRequest{Scope: a, Key: "k", Value: str("a"), IdempotencyKey: "req-1"})
	rb := s.idemWrite(t, &statev1.WriteRequest{Scope: b, Key: "k", Value: str("b"), IdempotencyKey: "req-1"})
	if rb.GetReplayed() {
		t.Fatal("the same idempotency key in another scope was treated as a retry")
	}
	s.wantValue(t, a, "k", str("a"), ra.GetRevision())
	s.wantValue(t, b, "k", str("b"), rb.GetRevision())
}

// testIdempotencyOtherKey: the contract does not say what reusing an
// idempotency key for another key means. Either answer is allowed,
// INVALID_ARGUMENT or applying the write, but never "replayed" with the
// other key's result while nothing was written.
func testIdempotencyOtherKey(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	s.idemWrite(t, &statev1.WriteRequest{Scope: sc, Key: "k1", Value: str("one"), IdempotencyKey: "req-1"})
	res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k2", Value: str("two"), IdempotencyKey: "req-1"})
	if err != nil {
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("reused idempotency key for another key: %v; want INVALID_ARGUMENT or success", err)
		}
		s.wantMissing(t, sc, "k2")
		return
	}
	got, err := s.c.Read(ctx(t), &statev1.ReadRequest{Scope: sc, Key: "k2"})
	if err != nil {
		t.Fatalf("Write with a reused idempotency key succeeded (replayed %v) but Read: %v", res.GetReplayed(), err)
	}
	if got.GetRevision() != res.GetRevision() {
		t.Fatalf("Write with a reused idempotency key returned revision %d; Read returns %d", res.GetRevision(), got.GetRevision())
	}
}

func testDeleteRetry(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	s.write(t, sc, "k", str("v1"))
	req := &statev1.DeleteRequest{Scope: sc, Key: "k", IdempotencyKey: "del-1"}
	first, err := s.c.Delete(ctx(t), req)
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if !first.GetExisted() || first.GetReplayed() {
		t.Fatalf("first Delete: existed %v, replayed %v; want true, false", first.GetExisted(), first.GetReplayed())
	}
	// The key is written again; a late retry of the delete must not
	// remove it.
	r2 := s.write(t, sc, "k", str("v2"))
	for range 2 {
		again, err := s.c.Delete(ctx(t), req)
		if err != nil {
			t.Fatalf("retried Delete: %v", err)
		}
		if !again.GetReplayed() || !again.GetExisted() {
			t.Fatalf("retried Delete: existed %v, replayed %v; want the first result (existed true) and replayed true", again.GetExisted(), again.GetReplayed())
		}
	}
	s.wantValue(t, sc, "k", str("v2"), r2)
}
