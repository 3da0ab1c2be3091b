package state

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// Concurrency of the checks below.
const (
	writers          = 8
	incrementsEach   = 5
	maxAttemptsTotal = 100000
)

// testConcurrency checks compare-and-set under contention.
func testConcurrency(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"CompareAndSetIncrementsLoseNothing", testCASIncrements},
		{"OneOfConcurrentCreatesWins", testConcurrentCreates},
	})
}

// testCASIncrements: writers increment one counter with read, then write
// expecting the revision read, retrying on STALE_REVISION. Every
// increment must survive and every successful write gets its own
// revision.
func testCASIncrements(t *testing.T, s *suite) {
	sc := scope.Global()
	key := s.id("counter")
	s.write(t, sc, key, num(0))
	var (
		mu       sync.Mutex
		revs     []uint64
		attempts int
	)
	parallel(t, writers, func(int) error {
		for range incrementsEach {
			for {
				mu.Lock()
				attempts++
				n := attempts
				mu.Unlock()
				if n > maxAttemptsTotal {
					return fmt.Errorf("more than %d attempts in all; is STALE_REVISION returned for a current revision?", maxAttemptsTotal)
				}
				cur, err := s.c.Read(ctx(t), &statev1.ReadRequest{Scope: sc, Key: key})
				if err != nil {
					return fmt.Errorf("Read: %v", err)
				}
				next := num(cur.GetValue().GetNumberValue() + 1)
				res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: key, Value: next, ExpectedRevision: rev(cur.GetRevision())})
				if status.Code(err) == codes.FailedPrecondition && errs.Reason(err) == errs.ReasonStaleRevision {
					continue
				}
				if err != nil {
					return fmt.Errorf("Write expecting revision %d: %v", cur.GetRevision(), err)
				}
				if res.GetRevision() <= cur.GetRevision() {
					return fmt.Errorf("Write expecting revision %d returned revision %d", cur.GetRevision(), res.GetRevision())
				}
				mu.Lock()
				revs = append(revs, res.GetRevision())
				mu.Unlock()
				break
			}
		}
		return nil
	})
	const want = writers * incrementsEach
	got := s.read(t, sc, key)
	if got.GetValue().GetNumberValue() != want {
		t.Fatalf("counter is %v after %d acknowledged increments (%d attempts): lost updates", got.GetValue().GetNumberValue(), want, attempts)
	}
	slices.Sort(revs)
	if len(slices.Compact(slices.Clone(revs))) != len(revs) {
		t.Fatalf("two successful compare-and-set writes returned the same revision: %v", revs)
	}
	if got.GetRevision() != revs[len(revs)-1] {
		t.Fatalf("final revision %d; the last acknowledged write returned %d", got.GetRevision(), revs[len(revs)-1])
	}
	t.Logf("%d increments by %d writers in %d attempts", want, writers, attempts)
}

// testConcurrentCreates: of concurrent "must not exist" writes of one
// key, exactly one succeeds; the others are STALE_REVISION.
func testConcurrentCreates(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	var (
		mu      sync.Mutex
		winners []int
		winRev  uint64
	)
	parallel(t, writers*2, func(i int) error {
		res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: num(float64(i)), ExpectedRevision: rev(0)})
		if err == nil {
			mu.Lock()
			winners = append(winners, i)
			winRev = res.GetRevision()
			mu.Unlock()
			return nil
		}
		return checkCode(err, codes.FailedPrecondition, errs.ReasonStaleRevision)
	})
	if len(winners) != 1 {
		t.Fatalf("%d concurrent creates succeeded (%v); want exactly 1", len(winners), winners)
	}
	s.wantValue(t, sc, "k", num(float64(winners[0])), winRev)
}
