package state

import (
	"context"
	"log/slog"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/embed"
)

// Request defaults.
const (
	// DefaultPageSize is the List page size when the request says 0.
	DefaultPageSize = 100
	// DefaultSearchLimit is the Search limit when the request says 0.
	DefaultSearchLimit = 10
)

// Server implements statev1.StateServiceServer over a Backend. It maps
// requests to backend calls and results to responses; it builds no
// status errors (the server's error interceptor maps errs kinds). Nil or
// missing fields reach the backend as zero values and come back as
// INVALID_ARGUMENT, so a request that bypassed protovalidate cannot panic.
type Server struct {
	statev1.UnimplementedStateServiceServer
	b Backend
	// valuesByRead makes List ignore include_values: set when a store
	// middleware must see each value read, which it does on Read only.
	valuesByRead bool
	// embedder embeds values and queries (WithEmbedder); nil: none.
	embedder    embed.Embedder
	embedWrites bool
	log         *slog.Logger
}

// NewServer returns a Server that stores in b. Vector and hybrid Search,
// and Writes with embeddings, need b to be a VectorBackend.
func NewServer(b Backend, opts ...ServerOption) *Server {
	s := &Server{b: b}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Read implements StateService.Read.
func (s *Server) Read(ctx context.Context, req *statev1.ReadRequest) (*statev1.ReadResponse, error) {
	it, err := s.b.Read(ctx, req.GetScope(), req.GetKey())
	if err != nil {
		return nil, err
	}
	return &statev1.ReadResponse{Value: it.Value, Revision: it.Revision}, nil
}

// Write implements StateService.Write.
func (s *Server) Write(ctx context.Context, req *statev1.WriteRequest) (*statev1.WriteResponse, error) {
	vec, err := s.writeEmbedding(ctx, req)
	if err != nil {
		return nil, err
	}
	res, err := s.b.Write(ctx, req.GetScope(), req.GetKey(), req.GetValue(), Guard{
		ExpectedRevision: writeExpected(req),
		IdempotencyKey:   req.GetIdempotencyKey(),
		Unindexed:        req.GetUnindexed(),
		Embedding:        vec,
	})
	if err != nil {
		return nil, err
	}
	return &statev1.WriteResponse{Revision: res.Revision, Replayed: res.Replayed}, nil
}

// Delete implements StateService.Delete.
func (s *Server) Delete(ctx context.Context, req *statev1.DeleteRequest) (*statev1.DeleteResponse, error) {
	res, err := s.b.Delete(ctx, req.GetScope(), req.GetKey(), Guard{
		ExpectedRevision: deleteExpected(req),
		IdempotencyKey:   req.GetIdempotencyKey(),
	})
	if err != nil {
		return nil, err
	}
	return &statev1.DeleteResponse{Existed: res.Existed, Replayed: res.Replayed}, nil
}

// List implements StateService.List.
func (s *Server) List(ctx context.Context, req *statev1.ListRequest) (*statev1.ListResponse, error) {
	size := int(req.GetPageSize())
	if size == 0 {
		size = DefaultPageSize
	}
	page, err := s.b.Scan(ctx, req.GetScope(), ListQuery{
		Prefix:    req.GetPrefix(),
		PageToken: req.GetPageToken(),
		PageSize:  size,
		Values:    req.GetIncludeValues() && !s.valuesByRead,
		Reverse:   req.GetReverse(),
	})
	if err != nil {
		return nil, err
	}
	resp := &statev1.ListResponse{NextPageToken: page.NextPageToken, Items: make([]*statev1.ListItem, len(page.Items))}
	for i, it := range page.Items {
		resp.Items[i] = &statev1.ListItem{Key: it.Key, Revision: it.Revision, Value: it.Value}
	}
	return resp, nil
}

// Search implements StateService.Search.
func (s *Server) Search(ctx context.Context, req *statev1.SearchRequest) (*statev1.SearchResponse, error) {
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = DefaultSearchLimit
	}
	hits, err := s.search(ctx, req, limit)
	if err != nil {
		return nil, err
	}
	resp := &statev1.SearchResponse{Results: make([]*statev1.SearchResult, len(hits))}
	for i, h := range hits {
		resp.Results[i] = &statev1.SearchResult{Key: h.Key, Score: h.Score, Snippet: h.Snippet, Revision: h.Revision}
	}
	return resp, nil
}

// writeExpected returns a copy of the optional expected_revision of a
// Write, nil when unset or when req is nil.
func writeExpected(req *statev1.WriteRequest) *uint64 {
	if req == nil {
		return nil
	}
	return clone(req.ExpectedRevision)
}

// deleteExpected is writeExpected for a Delete.
func deleteExpected(req *statev1.DeleteRequest) *uint64 {
	if req == nil {
		return nil
	}
	return clone(req.ExpectedRevision)
}

func clone(p *uint64) *uint64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
