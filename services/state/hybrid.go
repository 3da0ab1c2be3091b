package state

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/pkg/errs"
)

// This file holds what the Server adds to a backend for vector and
// hybrid search: embedding values and queries with its embedder, and
// fusing the keyword and vector rankings.

// Hybrid search defaults.
const (
	// DefaultRRFK is the rank constant of reciprocal rank fusion.
	DefaultRRFK = 60
	// hybridCandidates is how many results of each ranking hybrid search
	// fuses, at least: the limit if larger.
	hybridCandidates = 50
	// maxEmbedTextBytes bounds the text of a value sent to the embedder
	// (its start; embedding models read a few thousand tokens at most).
	maxEmbedTextBytes = 16 << 10
)

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithEmbedder gives the Server an embedder: queries of vector and hybrid
// Search without query_embedding are embedded with it, and so are
// Writes with embed ALWAYS, and (when embedWrites) every indexed Write
// with neither embedding nor embed NEVER.
func WithEmbedder(e embed.Embedder, embedWrites bool) ServerOption {
	return func(s *Server) { s.embedder, s.embedWrites = e, embedWrites }
}

// WithServerLogger sets where the Server logs (an embedder failure on a
// Write that did not ask for the embedding).
func WithServerLogger(l *slog.Logger) ServerOption {
	return func(s *Server) { s.log = l }
}

// noEmbedder is the FAILED_PRECONDITION when an embedding is needed and
// the server has no embedder; field is the request's field that would
// carry one.
func noEmbedder(what, field string) error {
	return fmt.Errorf("%s needs an embedding and this state server has no embedder: start it with --embedder (openai, openai-compatible or gemini; see --help), or send %s: %w",
		what, field, errs.FailedPrecondition)
}

// noVectors is the UNIMPLEMENTED of a backend without vector search.
func noVectors(what string) error {
	return fmt.Errorf("%s: this state server's backend has no vector index; use keyword search: %w", what, errs.Unimplemented)
}

// writeEmbedding returns the embedding a Write stores: the request's, one
// computed by the embedder, or nil.
func (s *Server) writeEmbedding(ctx context.Context, req *statev1.WriteRequest) ([]float32, error) {
	if req.GetUnindexed() {
		return nil, nil
	}
	_, vectors := s.b.(VectorBackend)
	if len(req.GetEmbedding()) > 0 {
		if !vectors {
			return nil, noVectors("a Write with an embedding")
		}
		return req.GetEmbedding(), nil
	}
	switch req.GetEmbed() {
	case statev1.EmbedMode_EMBED_MODE_NEVER:
		return nil, nil
	case statev1.EmbedMode_EMBED_MODE_ALWAYS:
		if !vectors {
			return nil, noVectors("a Write with embed ALWAYS")
		}
		if s.embedder == nil {
			return nil, noEmbedder("a Write with embed ALWAYS", "embedding")
		}
		text := embedText(req.GetKey(), req.GetValue())
		vecs, err := s.embedder.Embed(ctx, []string{text}, embed.Document)
		if err != nil {
			return nil, fmt.Errorf("embed the value with %s: %w", s.embedder.Name(), err)
		}
		return vecs[0], nil
	}
	if s.embedder == nil || !s.embedWrites || !vectors {
		return nil, nil
	}
	vecs, err := s.embedder.Embed(ctx, []string{embedText(req.GetKey(), req.GetValue())}, embed.Document)
	if err != nil {
		// The write did not ask for the embedding: store it without one
		// (keyword search still finds it) rather than fail it.
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s.logger().Warn("embedding failed; the value is written without one (vector search will not find it)", "embedder", s.embedder.Name(), "err", err)
		return nil, nil
	}
	return vecs[0], nil
}

func (s *Server) logger() *slog.Logger {
	if s.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.log
}

// embedText is the text embedded for a value: its key, with separators
// as spaces (keys such as "user/favourite_drink" carry meaning), then its
// searchable text, cut to maxEmbedTextBytes.
func embedText(key string, v *structpb.Value) string {
	k := strings.NewReplacer("/", " ", "_", " ", "-", " ", ".", " ", ":", " ").Replace(key)
	t := strings.TrimSpace(k + "\n" + valueText(v))
	if len(t) > maxEmbedTextBytes {
		cut := maxEmbedTextBytes
		for cut > 0 && !utf8.RuneStart(t[cut]) {
			cut--
		}
		t = t[:cut]
	}
	return t
}

// queryEmbedding returns the request's query embedding, or the query
// embedded by the embedder.
func (s *Server) queryEmbedding(ctx context.Context, req *statev1.SearchRequest, what string) ([]float32, error) {
	if len(req.GetQueryEmbedding()) > 0 {
		return req.GetQueryEmbedding(), nil
	}
	if s.embedder == nil {
		return nil, noEmbedder(what, "query_embedding")
	}
	if err := checkSearch(req.GetQuery(), 1); err != nil {
		return nil, err
	}
	vecs, err := s.embedder.Embed(ctx, []string{req.GetQuery()}, embed.Query)
	if err != nil {
		return nil, fmt.Errorf("embed the query with %s: %w", s.embedder.Name(), err)
	}
	return vecs[0], nil
}

// search runs a Search of any mode.
func (s *Server) search(ctx context.Context, req *statev1.SearchRequest, limit int) ([]SearchHit, error) {
	mode := req.GetMode()
	if mode == statev1.SearchMode_SEARCH_MODE_UNSPECIFIED || mode == statev1.SearchMode_SEARCH_MODE_KEYWORD {
		return s.b.Search(ctx, req.GetScope(), req.GetQuery(), limit)
	}
	name := map[statev1.SearchMode]string{statev1.SearchMode_SEARCH_MODE_VECTOR: "vector search", statev1.SearchMode_SEARCH_MODE_HYBRID: "hybrid search"}[mode]
	if name == "" {
		return nil, fmt.Errorf("search mode %d is not one this server knows (keyword, vector, hybrid): %w", mode, errs.InvalidArgument)
	}
	vb, ok := s.b.(VectorBackend)
	if !ok {
		return nil, noVectors(name)
	}
	if mode == statev1.SearchMode_SEARCH_MODE_VECTOR {
		q, err := s.queryEmbedding(ctx, req, name)
		if err != nil {
			return nil, err
		}
		return vb.VectorSearch(ctx, req.GetScope(), q, limit)
	}
	kw, vw := 1.0, 1.0
	if req.KeywordWeight != nil {
		kw = req.GetKeywordWeight()
	}
	if req.VectorWeight != nil {
		vw = req.GetVectorWeight()
	}
	if kw < 0 || vw < 0 || kw+vw == 0 || kw > 100 || vw > 100 {
		return nil, fmt.Errorf("keyword_weight %g and vector_weight %g: each must be 0 to 100, and not both 0: %w", kw, vw, errs.InvalidArgument)
	}
	rrfK := float64(req.GetRrfK())
	if rrfK == 0 {
		rrfK = DefaultRRFK
	}
	if err := checkSearch(req.GetQuery(), limit); err != nil {
		return nil, err
	}
	q, err := s.queryEmbedding(ctx, req, name)
	if err != nil {
		return nil, err
	}
	n := min(MaxSearchLimit, max(limit, hybridCandidates))
	sb, cutLater := s.b.(snippetBackend)
	candCtx := ctx
	if cutLater {
		candCtx = withoutSnippets(ctx)
	}
	keyword, err := s.b.Search(candCtx, req.GetScope(), req.GetQuery(), n)
	if err != nil {
		return nil, err
	}
	vector, err := vb.VectorSearch(candCtx, req.GetScope(), q, n)
	if err != nil {
		return nil, err
	}
	hits := fuse(keyword, vector, kw, vw, rrfK, limit)
	if !cutLater || len(hits) == 0 {
		return hits, nil
	}
	// Snippets for the returned keys only: around the matches for those
	// the keyword ranking held.
	matched := make(map[string]bool, len(keyword))
	for _, h := range keyword {
		matched[h.Key] = true
	}
	keys := make([]string, len(hits))
	for i, h := range hits {
		keys[i] = h.Key
	}
	snips, err := sb.snippets(ctx, req.GetScope(), req.GetQuery(), keys, matched)
	if err != nil {
		return nil, err
	}
	out := hits[:0]
	for _, h := range hits {
		sn, ok := snips[h.Key]
		if !ok {
			continue // deleted since the rankings were read
		}
		h.Snippet = sn
		out = append(out, h)
	}
	return out, nil
}

// fuse merges two rankings by reciprocal rank fusion: a key's score is
// the sum over the rankings that hold it of weight / (k + rank), rank
// 1-based. Its snippet is the keyword ranking's (around the matched
// words) when it has one, and its revision the newer of the two.
func fuse(keyword, vector []SearchHit, kw, vw, k float64, limit int) []SearchHit {
	byKey := map[string]*SearchHit{}
	var order []string
	add := func(hits []SearchHit, w float64) {
		for i, h := range hits {
			score := w / (k + float64(i+1))
			f, ok := byKey[h.Key]
			if !ok {
				h.Score = score
				byKey[h.Key] = &h
				order = append(order, h.Key)
				continue
			}
			f.Score += score
			f.Revision = max(f.Revision, h.Revision)
			if f.Snippet == "" {
				f.Snippet = h.Snippet
			}
		}
	}
	add(keyword, kw)
	add(vector, vw)
	out := make([]SearchHit, 0, len(order))
	for _, key := range order {
		out = append(out, *byKey[key])
	}
	slices.SortFunc(out, func(a, b SearchHit) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}
