package state

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// testSearch checks full-text search over the text of JSON values. Every
// check searches for fresh words (see term) in a fresh scope, and no key
// contains the words, so only values can match.
func testSearch(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"FindsWordsInNestedStrings", testSearchNested},
		{"MoreOccurrencesRankHigher", testSearchRanking},
		{"SnippetContainsTerm", testSearchSnippet},
		{"Limit", testSearchLimit},
		{"NoMatch", testSearchNoMatch},
		{"NeverReturnsOtherScopes", testSearchScopes},
		{"SeesAcknowledgedWrites", testSearchFollowsWrites},
		{"DeletedKeysAreNotReturned", testSearchDeleted},
		{"EmptyQuery", testSearchEmptyQuery},
		{"LimitOutOfRange", testSearchLimitRange},
	})
}

func testSearchNested(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	w1, w2, w3 := term(), term(), term()
	doc := jsonValue(t, map[string]any{
		"title": "a document",
		"meta":  map[string]any{"tags": []any{1.0, true, nil, "tagged " + w1}},
		"deep":  map[string]any{"a": map[string]any{"b": map[string]any{"c": []any{[]any{"very deep " + w2}}}}},
		"list":  []any{map[string]any{"text": "in a list " + w3}},
	})
	r := s.write(t, sc, "doc", doc)
	s.write(t, sc, "unrelated", jsonValue(t, map[string]any{"text": "nothing to see here"}))
	for _, w := range []string{w1, w2, w3, w1 + " " + w3} {
		hits := s.search(t, sc, w, 0)
		if len(hits) != 1 || hits[0].GetKey() != "doc" || hits[0].GetRevision() != r {
			t.Fatalf("Search(%q) = %v; want only \"doc\" at revision %d", w, hits, r)
		}
		if hits[0].GetScore() <= 0 {
			t.Fatalf("Search(%q): score %v; want > 0", w, hits[0].GetScore())
		}
	}
	// A top-level string value is a document too.
	rs := s.write(t, sc, "plain", str("just a string with "+w2))
	hits := s.search(t, sc, w2, 0)
	if got := resultKeys(hits); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"doc", "plain"}) {
		t.Fatalf("Search(%q) = %s; want doc and plain", w2, quoteAll(got))
	}
	for _, h := range hits {
		if h.GetKey() == "plain" && h.GetRevision() != rs {
			t.Fatalf("plain at revision %d; Write returned %d", h.GetRevision(), rs)
		}
	}
}

// testSearchRanking: of two documents of the same length, the one with
// more occurrences of the term ranks first.
func testSearchRanking(t *testing.T, s *suite) {
	sc := scope.Workflow(s.id("wf"))
	w := term()
	s.write(t, sc, "few", jsonValue(t, map[string]any{"body": map[string]any{"text": w + " river mountain forest valley meadow"}}))
	s.write(t, sc, "many", jsonValue(t, map[string]any{"body": map[string]any{"text": w + " river " + w + " forest " + w + " meadow"}}))
	s.write(t, sc, "none", jsonValue(t, map[string]any{"body": map[string]any{"text": "river mountain forest valley meadow lake"}}))
	hits := s.search(t, sc, w, 0)
	if got := resultKeys(hits); !slices.Equal(got, []string{"many", "few"}) {
		t.Fatalf("Search(%q) = %s; want [\"many\" \"few\"] (three occurrences above one)", w, quoteAll(got))
	}
	if hits[0].GetScore() <= hits[1].GetScore() {
		t.Fatalf("scores %v, %v; want the first strictly higher", hits[0].GetScore(), hits[1].GetScore())
	}
}

func testSearchSnippet(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	w := term()
	long := strings.Repeat("filler words before the match ", 40) + "here is " + w + " in the middle " + strings.Repeat("and filler words after it ", 40)
	s.write(t, sc, "short", jsonValue(t, map[string]any{"text": "short text with " + w}))
	s.write(t, sc, "long", jsonValue(t, map[string]any{"n": map[string]any{"text": long}}))
	hits := s.search(t, sc, w, 0)
	if len(hits) != 2 {
		t.Fatalf("Search(%q) = %v; want 2 results", w, hits)
	}
	for _, h := range hits {
		if !strings.Contains(strings.ToLower(h.GetSnippet()), w) {
			t.Fatalf("snippet of %q is %q; want it to contain %q", h.GetKey(), h.GetSnippet(), w)
		}
		if h.GetKey() == "long" && len(h.GetSnippet()) >= len(long) {
			t.Errorf("snippet of a %d-byte value is %d bytes; want a fragment", len(long), len(h.GetSnippet()))
		}
	}
}

func testSearchLimit(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	w := term()
	keys := numbered("k", defaultSearchLimit+2)
	parallel(t, len(keys), func(i int) error {
		// Occurrences vary so that ranking is not a tie.
		text := strings.Repeat(w+" ", 1+i%4) + "common words"
		_, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: keys[i], Value: str(text)})
		return err
	})
	all := s.search(t, sc, w, maxSearchLimit)
	if len(all) != len(keys) {
		t.Fatalf("Search with limit %d found %d; want all %d", maxSearchLimit, len(all), len(keys))
	}
	for _, limit := range []int32{1, 2, 5} {
		hits := s.search(t, sc, w, limit)
		if len(hits) != int(limit) {
			t.Fatalf("Search with limit %d returned %d results", limit, len(hits))
		}
	}
	if hits := s.search(t, sc, w, 0); len(hits) != defaultSearchLimit {
		t.Fatalf("Search with limit 0 returned %d results; want the default %d", len(hits), defaultSearchLimit)
	}
}

func testSearchNoMatch(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	s.write(t, sc, "k", str("some text"))
	if hits := s.search(t, sc, term(), 0); len(hits) != 0 {
		t.Fatalf("Search for an unused word = %v; want nothing", hits)
	}
	if hits := s.search(t, scope.Session(s.id("empty")), "text", 0); len(hits) != 0 {
		t.Fatalf("Search of an empty scope = %v; want nothing", hits)
	}
}

// testSearchScopes: documents holding the word in other scopes, under the
// same keys, are never returned.
func testSearchScopes(t *testing.T, s *suite) {
	id := s.id("x")
	w := term()
	mine := scope.Agent(id, "a1")
	others := []*statev1.WriteRequest{
		{Scope: scope.Workflow(id)},
		{Scope: scope.Agent(id, "a2")},
		{Scope: scope.Session(id)},
		{Scope: scope.Custom(id)},
		{Scope: scope.Global(), Key: id + "/doc"},
	}
	r := s.write(t, mine, "doc", str("mine has "+w))
	for _, o := range others {
		key := o.Key
		if key == "" {
			key = "doc"
		}
		s.write(t, o.Scope, key, str(strings.Repeat(w+" ", 5)))
		s.write(t, o.Scope, key+"2", str(w))
	}
	hits := s.search(t, mine, w, maxSearchLimit)
	if len(hits) != 1 || hits[0].GetKey() != "doc" || hits[0].GetRevision() != r {
		t.Fatalf("Search in %s = %v; want only its own \"doc\" at revision %d", scope.String(mine), hits, r)
	}
}

func testSearchFollowsWrites(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	prev := ""
	for i := range 5 {
		w := term()
		r := s.write(t, sc, "k", str(fmt.Sprintf("version %d says %s", i, w)))
		hits := s.search(t, sc, w, 0)
		if len(hits) != 1 || hits[0].GetKey() != "k" || hits[0].GetRevision() != r {
			t.Fatalf("Search right after an acknowledged write (revision %d) = %v; want k at revision %d", r, hits, r)
		}
		if prev != "" {
			if hits := s.search(t, sc, prev, 0); len(hits) != 0 {
				t.Fatalf("Search for a word of the replaced version = %v; want nothing", hits)
			}
		}
		prev = w
	}
	old := term()
	s.write(t, sc, "j", str("old text "+old))
	s.write(t, sc, "j", str("new text"))
	if hits := s.search(t, sc, old, 0); len(hits) != 0 {
		t.Fatalf("Search for a word of an overwritten value = %v; want nothing", hits)
	}
}

func testSearchDeleted(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	w := term()
	s.write(t, sc, "gone", str("will be deleted "+w))
	rk := s.write(t, sc, "kept", str("will be kept "+w))
	if n := len(s.search(t, sc, w, 0)); n != 2 {
		t.Fatalf("Search before the delete found %d; want 2", n)
	}
	s.del(t, sc, "gone")
	hits := s.search(t, sc, w, 0)
	if len(hits) != 1 || hits[0].GetKey() != "kept" || hits[0].GetRevision() != rk {
		t.Fatalf("Search after Delete = %v; want only \"kept\"", hits)
	}
}

func testSearchEmptyQuery(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	s.write(t, sc, "k", str("text"))
	_, err := s.c.Search(ctx(t), &statev1.SearchRequest{Scope: sc, Query: ""})
	wantCode(t, err, codes.InvalidArgument, "")
}

func testSearchLimitRange(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	for _, limit := range []int32{-1, maxSearchLimit + 1} {
		_, err := s.c.Search(ctx(t), &statev1.SearchRequest{Scope: sc, Query: "text", Limit: limit})
		if err := checkCode(err, codes.InvalidArgument, ""); err != nil {
			t.Errorf("Search with limit %d: %v", limit, err)
		}
	}
}
