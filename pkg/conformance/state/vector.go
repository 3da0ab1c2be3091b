package state

import (
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// Embedders a Target may declare (Target.Embedder).
const (
	// EmbedderNone: the server has no embedder; vector search without a
	// query embedding must be FAILED_PRECONDITION.
	EmbedderNone = ""
	// EmbedderTest: the server embeds with pkg/embed's Test embedder
	// (--embedder test), so search by meaning is checked.
	EmbedderTest = "test"
	// EmbedderOther: some real model; the embedder checks are skipped.
	EmbedderOther = "other"
)

// testVector checks vector and hybrid search (SearchRequest.mode). A
// server whose backend has no vector index answers UNIMPLEMENTED (or
// FAILED_PRECONDITION) to the first vector search, and the group is
// skipped with that answer. Writes carry their embeddings in the request
// (4 dimensions), so every check but the embedder's runs without one.
func testVector(t *testing.T, s *suite) {
	probe := scope.Session(s.id("vprobe"))
	_, err := s.c.Search(ctx(t), &statev1.SearchRequest{Scope: probe, Query: "probe", Mode: statev1.SearchMode_SEARCH_MODE_VECTOR, QueryEmbedding: []float32{1, 0, 0, 0}})
	if c := status.Code(err); c == codes.Unimplemented || c == codes.FailedPrecondition {
		t.Skipf("the server has no vector search: %v", err)
	}
	if err != nil {
		t.Fatalf("vector Search of an empty scope: %v; want no results", err)
	}
	runAll(t, s, []group{
		{"RanksBySimilarity", testVectorRanking},
		{"KeysWithoutEmbeddingAreNotReturned", testVectorNoEmbedding},
		{"FollowsWritesAndDeletes", testVectorFollows},
		{"NeverReturnsOtherScopes", testVectorScopes},
		{"DimensionMismatch", testVectorDims},
		{"BadEmbedding", testVectorBad},
		{"Hybrid", testHybrid},
		{"HybridWeights", testHybridWeights},
		{"Embedder", testVectorEmbedder},
	})
}

// vwrite writes v at key with an embedding (nil: embed NEVER).
func (s *suite) vwrite(t *testing.T, sc *typesv1.Scope, key string, v *structpb.Value, vec []float32) uint64 {
	t.Helper()
	req := &statev1.WriteRequest{Scope: sc, Key: key, Value: v, Embedding: vec}
	if vec == nil {
		req.Embed = statev1.EmbedMode_EMBED_MODE_NEVER
	}
	res, err := s.c.Write(ctx(t), req)
	if err != nil {
		t.Fatalf("Write(%s) with an embedding: %v", show(sc, key), err)
	}
	return res.GetRevision()
}

// vsearch runs a search of mode with a query embedding; results must be
// best first.
func (s *suite) vsearch(t *testing.T, req *statev1.SearchRequest) []*statev1.SearchResult {
	t.Helper()
	res, err := s.c.Search(ctx(t), req)
	if err != nil {
		t.Fatalf("Search(%s, mode %v): %v", scope.String(req.GetScope()), req.GetMode(), err)
	}
	for i := 1; i < len(res.GetResults()); i++ {
		if res.Results[i].GetScore() > res.Results[i-1].GetScore() {
			t.Fatalf("Search(mode %v): results not best first: %v after %v", req.GetMode(), res.Results[i].GetScore(), res.Results[i-1].GetScore())
		}
	}
	return res.GetResults()
}

func vreq(sc *typesv1.Scope, q []float32, limit int32) *statev1.SearchRequest {
	return &statev1.SearchRequest{Scope: sc, Query: "q", Mode: statev1.SearchMode_SEARCH_MODE_VECTOR, QueryEmbedding: q, Limit: limit}
}

func testVectorRanking(t *testing.T, s *suite) {
	sc := scope.Session(s.id("v"))
	r := map[string]uint64{
		"north":     s.vwrite(t, sc, "north", str("pointing north"), []float32{0, 1, 0, 0}),
		"northeast": s.vwrite(t, sc, "northeast", str("pointing north east"), []float32{2, 2, 0, 0}), // not normalized
		"east":      s.vwrite(t, sc, "east", str("pointing east"), []float32{1, 0, 0, 0}),
		"south":     s.vwrite(t, sc, "south", str("pointing south"), []float32{0, -1, 0, 0}),
	}
	hits := s.vsearch(t, vreq(sc, []float32{0, 3, 0, 0}, 0))
	if got, want := resultKeys(hits), []string{"north", "northeast", "east", "south"}; !slices.Equal(got, want) {
		t.Fatalf("vector Search = %s; want %s (by cosine similarity)", quoteAll(got), quoteAll(want))
	}
	for _, h := range hits {
		if h.GetRevision() != r[h.GetKey()] {
			t.Errorf("%q: revision %d; want %d", h.GetKey(), h.GetRevision(), r[h.GetKey()])
		}
		if !strings.Contains(h.GetSnippet(), "pointing") {
			t.Errorf("%q: snippet %q; want the value's text", h.GetKey(), h.GetSnippet())
		}
	}
	for i, want := range []float64{1, math.Sqrt2 / 2, 0, -1} {
		if math.Abs(hits[i].GetScore()-want) > 1e-4 {
			t.Errorf("%q: score %v; want the cosine similarity %v", hits[i].GetKey(), hits[i].GetScore(), want)
		}
	}
	if hits := s.vsearch(t, vreq(sc, []float32{0, 1, 0, 0}, 2)); len(hits) != 2 {
		t.Errorf("limit 2: %d results", len(hits))
	}
}

func testVectorNoEmbedding(t *testing.T, s *suite) {
	sc := scope.Session(s.id("v"))
	s.vwrite(t, sc, "with", str("has an embedding"), []float32{1, 0, 0, 0})
	s.vwrite(t, sc, "never", str("embed NEVER"), nil)
	if _, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "unindexed", Value: str("unindexed"), Embedding: []float32{1, 0, 0, 0}, Unindexed: true}); err != nil {
		t.Fatalf("unindexed Write with an embedding: %v", err)
	}
	if got := resultKeys(s.vsearch(t, vreq(sc, []float32{1, 0, 0, 0}, 0))); !slices.Equal(got, []string{"with"}) {
		t.Fatalf("vector Search = %s; want only \"with\" (no embedding, or unindexed, is never returned)", quoteAll(got))
	}
}

func testVectorFollows(t *testing.T, s *suite) {
	sc := scope.Session(s.id("v"))
	s.vwrite(t, sc, "a", str("a"), []float32{1, 0, 0, 0})
	s.vwrite(t, sc, "b", str("b"), []float32{0, 1, 0, 0})
	q := []float32{1, 0.1, 0, 0}
	if got := resultKeys(s.vsearch(t, vreq(sc, q, 0))); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("before: %s; want a, b", quoteAll(got))
	}
	// A new embedding replaces the old one.
	s.vwrite(t, sc, "a", str("a again"), []float32{0, 0, 1, 0})
	if got := resultKeys(s.vsearch(t, vreq(sc, q, 0))); !slices.Equal(got, []string{"b", "a"}) {
		t.Fatalf("after re-embedding a: %s; want b, a", quoteAll(got))
	}
	// A Write without embedding (embed NEVER) drops it; so does a Delete.
	s.vwrite(t, sc, "a", str("a without"), nil)
	s.del(t, sc, "b")
	if got := s.vsearch(t, vreq(sc, q, 0)); len(got) != 0 {
		t.Fatalf("after dropping a's embedding and deleting b: %s; want none", quoteAll(resultKeys(got)))
	}
}

func testVectorScopes(t *testing.T, s *suite) {
	one, two := scope.Session(s.id("v1")), scope.Session(s.id("v2"))
	s.vwrite(t, one, "k", str("one"), []float32{1, 0, 0, 0})
	s.vwrite(t, two, "k", str("two"), []float32{1, 0, 0, 0})
	hits := s.vsearch(t, vreq(one, []float32{1, 0, 0, 0}, 0))
	if len(hits) != 1 || hits[0].GetSnippet() != "one" {
		t.Fatalf("vector Search of one scope = %v; want only its key", hits)
	}
}

func testVectorDims(t *testing.T, s *suite) {
	sc := scope.Session(s.id("v"))
	s.vwrite(t, sc, "k", str("four dimensions"), []float32{1, 0, 0, 0})
	_, err := s.c.Search(ctx(t), vreq(sc, []float32{1, 0, 0}, 0))
	wantCode(t, err, codes.FailedPrecondition, "")
}

func testVectorBad(t *testing.T, s *suite) {
	sc := scope.Session(s.id("v"))
	nan := float32(math.NaN())
	for name, vec := range map[string][]float32{"NaN": {nan, 1}, "zero": {0, 0, 0}, "infinite": {float32(math.Inf(1)), 0}} {
		_, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v"), Embedding: vec})
		if err := checkCode(err, codes.InvalidArgument, ""); err != nil {
			t.Errorf("Write with a %s embedding: %v", name, err)
		}
		_, err = s.c.Search(ctx(t), vreq(sc, vec, 0))
		if err := checkCode(err, codes.InvalidArgument, ""); err != nil {
			t.Errorf("Search with a %s query embedding: %v", name, err)
		}
	}
	s.wantMissing(t, sc, "k")
	_, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v"), Embedding: make([]float32, 4097)})
	wantCode(t, err, codes.InvalidArgument, "")
}

// testHybrid: a key that both rankings hold ranks above keys only one
// holds.
func testHybrid(t *testing.T, s *suite) {
	sc := scope.Session(s.id("v"))
	w := term()
	s.vwrite(t, sc, "both", str("about "+w), []float32{1, 0, 0, 0})
	s.vwrite(t, sc, "words", str(w+" "+w+" "+w), []float32{0, 1, 0, 0})
	s.vwrite(t, sc, "meaning", str("nothing in common"), []float32{0.9, 0.1, 0, 0})
	hits := s.vsearch(t, &statev1.SearchRequest{Scope: sc, Query: w, Mode: statev1.SearchMode_SEARCH_MODE_HYBRID, QueryEmbedding: []float32{1, 0, 0, 0}})
	got := resultKeys(hits)
	if len(got) != 3 || got[0] != "both" {
		t.Fatalf("hybrid Search = %s; want \"both\" first, then \"words\" and \"meaning\"", quoteAll(got))
	}
	for _, h := range hits {
		if h.GetKey() == "words" && !strings.Contains(h.GetSnippet(), w) {
			t.Errorf("snippet of a keyword match %q; want the matched word", h.GetSnippet())
		}
		if h.GetKey() == "meaning" && h.GetSnippet() != "nothing in common" {
			t.Errorf("snippet of a vector-only match %q; want the start of its value", h.GetSnippet())
		}
	}
	// Keyword mode, the default, is unchanged by embeddings.
	if got := resultKeys(s.search(t, sc, w, 0)); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"both", "words"}) {
		t.Errorf("keyword Search = %s; want both and words", quoteAll(got))
	}
}

// testHybridWeights: a weight of 0 leaves one ranking's order alone.
func testHybridWeights(t *testing.T, s *suite) {
	sc := scope.Session(s.id("v"))
	w := term()
	s.vwrite(t, sc, "a", str(strings.Repeat(w+" ", 6)), []float32{0, 1, 0, 0})
	s.vwrite(t, sc, "b", str("one two three four five six seven eight nine ten "+w), []float32{1, 0, 0, 0})
	req := func(kw, vw float64) *statev1.SearchRequest {
		return &statev1.SearchRequest{Scope: sc, Query: w, Mode: statev1.SearchMode_SEARCH_MODE_HYBRID, QueryEmbedding: []float32{1, 0, 0, 0}, KeywordWeight: &kw, VectorWeight: &vw, RrfK: 1}
	}
	if got := resultKeys(s.vsearch(t, req(1, 0))); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("vector_weight 0: %s; want the keyword order a, b", quoteAll(got))
	}
	if got := resultKeys(s.vsearch(t, req(0, 1))); !slices.Equal(got, []string{"b", "a"}) {
		t.Errorf("keyword_weight 0: %s; want the vector order b, a", quoteAll(got))
	}
	if got := resultKeys(s.vsearch(t, req(1, 3))); !slices.Equal(got, []string{"b", "a"}) {
		t.Errorf("vector_weight 3: %s; want b, a", quoteAll(got))
	}
	_, err := s.c.Search(ctx(t), req(0, 0))
	wantCode(t, err, codes.InvalidArgument, "")
}

// testVectorEmbedder: with the test embedder, a value written without an
// embedding is found by meaning; without an embedder, a search that needs
// one is FAILED_PRECONDITION.
func testVectorEmbedder(t *testing.T, s *suite) {
	sc := scope.Session(s.id("v"))
	switch s.embedder {
	case EmbedderNone:
		_, err := s.c.Search(ctx(t), &statev1.SearchRequest{Scope: sc, Query: "anything", Mode: statev1.SearchMode_SEARCH_MODE_VECTOR})
		wantCode(t, err, codes.FailedPrecondition, "")
		_, err = s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: str("v"), Embed: statev1.EmbedMode_EMBED_MODE_ALWAYS})
		wantCode(t, err, codes.FailedPrecondition, "")
	case EmbedderTest:
		s.write(t, sc, "fact/1", str("My car is blue"))
		if _, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "fact/2", Value: str("The dog is called Rex"), Embed: statev1.EmbedMode_EMBED_MODE_ALWAYS}); err != nil {
			t.Fatal(err)
		}
		s.vwrite(t, sc, "fact/3", str("The automobile is azure"), nil) // embed NEVER
		hits := s.vsearch(t, &statev1.SearchRequest{Scope: sc, Query: "what colour is the vehicle?", Mode: statev1.SearchMode_SEARCH_MODE_VECTOR})
		if len(hits) != 2 || hits[0].GetKey() != "fact/1" {
			t.Fatalf("vector Search by meaning = %s; want fact/1 first, fact/2, not fact/3 (embed NEVER)", quoteAll(resultKeys(hits)))
		}
		hits = s.vsearch(t, &statev1.SearchRequest{Scope: sc, Query: "puppy name", Mode: statev1.SearchMode_SEARCH_MODE_HYBRID})
		if len(hits) == 0 || hits[0].GetKey() != "fact/2" {
			t.Fatalf("hybrid Search by meaning = %s; want fact/2 first", quoteAll(resultKeys(hits)))
		}
	default:
		t.Skipf("the server's embedder is %q; only the test embedder's results are known", s.embedder)
	}
}
