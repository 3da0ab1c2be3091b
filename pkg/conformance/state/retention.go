package state

import (
	"fmt"
	"slices"
	"testing"
	"time"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// RetentionPrefix is the key prefix of the Retention group's keys. A
// target that sets Target.RetentionMaxEntries runs its server with the
// rule scope=custom,prefix=retained/,max-entries=N (and a short
// --retention-interval): no other group writes keys with this prefix.
const RetentionPrefix = "retained/"

// retentionWait bounds how long the Retention group waits for the
// server's sweeper to apply the rule.
const retentionWait = 30 * time.Second

// testRetention: the server's retention rule keeps the N most recently
// written keys of the prefix in a custom scope and deletes the others,
// leaves keys outside the prefix alone, and its deletions reach the
// keyword and (when the server has one) vector indexes. Skipped unless
// Target.RetentionMaxEntries is set.
func testRetention(t *testing.T, s *suite) {
	n := s.retention
	if n == 0 {
		t.Skip("Target.RetentionMaxEntries is 0: the server's retention policy is not known")
	}
	sc := scope.Custom(s.id("retention"))
	w := term()
	_, vecErr := s.c.Search(ctx(t), &statev1.SearchRequest{Scope: sc, Query: "probe", Mode: statev1.SearchMode_SEARCH_MODE_VECTOR, QueryEmbedding: []float32{1, 0, 0, 0}})
	vectors := vecErr == nil
	var all []string
	for i := range n + 3 {
		key := fmt.Sprintf("%s%03d", RetentionPrefix, i)
		all = append(all, key)
		req := &statev1.WriteRequest{Scope: sc, Key: key, Value: str("entry " + w)}
		if vectors {
			req.Embedding = []float32{1, float32(i), 0, 0}
		}
		if _, err := s.c.Write(ctx(t), req); err != nil {
			t.Fatalf("Write(%s): %v", show(sc, key), err)
		}
	}
	if _, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "other", Value: str("other " + w)}); err != nil {
		t.Fatal(err)
	}
	retained := all[len(all)-n:]
	want := append([]string{"other"}, retained...) // List's byte order
	// Wait (bounded) for the sweeper.
	var keys []string
	for deadline := time.Now().Add(retentionWait); ; {
		keys = keys[:0]
		for _, it := range s.listAll(t, sc, "", 100) {
			keys = append(keys, it.GetKey())
		}
		if slices.Equal(keys, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("after the sweeper's time, %s holds %s; want %s (max-entries %d of %s)", scope.String(sc), quoteAll(keys), quoteAll(want), n, RetentionPrefix)
	}
	got := resultKeys(s.search(t, sc, w, 100))
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("keyword Search after retention = %s; want %s", quoteAll(got), quoteAll(want))
	}
	if vectors {
		got := resultKeys(s.vsearch(t, vreq(sc, []float32{1, 0, 0, 0}, 100)))
		slices.Sort(got)
		if !slices.Equal(got, retained) {
			t.Errorf("vector Search after retention = %s; want %s", quoteAll(got), quoteAll(retained))
		}
	}
}
