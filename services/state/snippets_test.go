package state

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// snippetRecorder wraps a backend with vector search and snippets, and
// records what hybrid search asks of it.
type snippetRecorder struct {
	VectorBackend
	candidates, withSnippet int        // candidate hits, and those with a snippet
	cut                     [][]string // the keys of each snippets call
}

func (r *snippetRecorder) count(hits []SearchHit) {
	for _, h := range hits {
		r.candidates++
		if h.Snippet != "" {
			r.withSnippet++
		}
	}
}

func (r *snippetRecorder) Search(ctx context.Context, s *typesv1.Scope, q string, limit int) ([]SearchHit, error) {
	hits, err := r.VectorBackend.Search(ctx, s, q, limit)
	r.count(hits)
	return hits, err
}

func (r *snippetRecorder) VectorSearch(ctx context.Context, s *typesv1.Scope, vec []float32, limit int) ([]SearchHit, error) {
	hits, err := r.VectorBackend.VectorSearch(ctx, s, vec, limit)
	r.count(hits)
	return hits, err
}

func (r *snippetRecorder) snippets(ctx context.Context, s *typesv1.Scope, q string, keys []string, matched map[string]bool) (map[string]string, error) {
	r.cut = append(r.cut, slices.Clone(keys))
	return r.VectorBackend.(snippetBackend).snippets(ctx, s, q, keys, matched)
}

// TestHybridSnippets: on every backend, hybrid search asks both rankings
// for their candidates without snippets and cuts snippets for the
// returned keys only (limit 3 of 60 candidates); each returned snippet
// is the one keyword search cuts for a key it finds (around the matched
// word, far into a long value) and vector search's for the others. With
// the candidates' snippets cut again (snippetsWanted ignored), the
// recorder sees them and the test fails.
func TestHybridSnippets(t *testing.T) {
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			b := bk.open(t).(VectorBackend)
			if _, ok := b.(snippetBackend); !ok {
				t.Fatalf("%T does not cut snippets for chosen keys", b)
			}
			sc := scope.Session("snip")
			filler := strings.Repeat("lorem ipsum dolor sit amet ", 20)
			for i := range 20 {
				// Keyword matches, the word far from the start.
				_, err := b.Write(ctx, sc, fmt.Sprintf("kw%02d", i), str(filler+"pelican "+filler), Guard{Embedding: []float32{0, 1, float32(i), 0}})
				if err != nil {
					t.Fatal(err)
				}
				// Vector matches only.
				_, err = b.Write(ctx, sc, fmt.Sprintf("vec%02d", i), str(fmt.Sprintf("nothing alike %d %s", i, filler)), Guard{Embedding: []float32{1, 0.01 * float32(i), 0, 0}})
				if err != nil {
					t.Fatal(err)
				}
			}
			rec := &snippetRecorder{VectorBackend: b}
			srv := NewServer(rec)
			q := []float32{1, 0, 0, 0}
			hits, err := srv.search(ctx, &statev1.SearchRequest{Scope: sc, Query: "pelican", Mode: statev1.SearchMode_SEARCH_MODE_HYBRID, QueryEmbedding: q}, 3)
			if err != nil {
				t.Fatal(err)
			}
			if len(hits) != 3 {
				t.Fatalf("%d hits; want 3", len(hits))
			}
			if rec.candidates != 60 || rec.withSnippet != 0 {
				t.Errorf("the rankings returned %d candidates, %d with a snippet; want 60 (20 keyword, 40 vector), none", rec.candidates, rec.withSnippet)
			}
			if len(rec.cut) != 1 || !slices.Equal(rec.cut[0], hitKeys(hits)) {
				t.Errorf("snippets cut for %v; want once, for the returned keys %v", rec.cut, hitKeys(hits))
			}
			kw, err := b.Search(ctx, sc, "pelican", 50)
			if err != nil {
				t.Fatal(err)
			}
			vec, err := b.VectorSearch(ctx, sc, q, 50)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{}
			for _, h := range vec {
				want[h.Key] = h.Snippet
			}
			for _, h := range kw {
				want[h.Key] = h.Snippet
			}
			sawKeyword := false
			for _, h := range hits {
				if h.Snippet != want[h.Key] {
					t.Errorf("%s: snippet %q; the ranking's is %q", h.Key, h.Snippet, want[h.Key])
				}
				if strings.HasPrefix(h.Key, "kw") {
					sawKeyword = true
					if !strings.Contains(h.Snippet, "pelican") {
						t.Errorf("%s: snippet %q; want it around the matched word", h.Key, h.Snippet)
					}
				}
			}
			if !sawKeyword {
				t.Errorf("hybrid returned %v: no keyword match", hitKeys(hits))
			}
		})
	}
}
