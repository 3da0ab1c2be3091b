package state

import (
	"context"

	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// Backend is the store behind StateService. The gRPC handler (Server)
// decodes requests and calls it; OpenBolt and NewMemory implement it with
// the same semantics, checked by one shared test suite.
//
// Every error wraps an errs kind:
//   - InvalidArgument: a nil or empty scope, an empty or non-UTF-8 key, a
//     key over Limits.MaxKeyBytes, a malformed value, a bad page size or
//     limit, a page token this store did not issue for this scope and
//     prefix, an idempotency key reused for a different operation;
//   - NotFound: Read of an absent key;
//   - StaleRevision (FAILED_PRECONDITION): Guard.ExpectedRevision does not
//     match; nothing changed;
//   - LimitExceeded (RESOURCE_EXHAUSTED): a value over Limits.MaxValueBytes;
//   - Unavailable: the store is closed, or search cannot reach its index.
//
// Revisions come from one counter per store: every applied Write or
// Delete takes the next number, so a key's revisions strictly increase and
// are never reused, even after a delete and re-create.
type Backend interface {
	// Read returns the current value and revision of key.
	Read(ctx context.Context, s *typesv1.Scope, key string) (Item, error)
	// Write creates or replaces key and returns its new revision. It is
	// durable before it returns (for the bbolt backend), and Search sees
	// it as soon as it returns, unless Guard.Unindexed.
	Write(ctx context.Context, s *typesv1.Scope, key string, v *structpb.Value, g Guard) (WriteResult, error)
	// Delete removes key. Deleting an absent key is a no-op that reports
	// Existed = false.
	Delete(ctx context.Context, s *typesv1.Scope, key string, g Guard) (DeleteResult, error)
	// List returns up to pageSize (1..MaxPageSize) keys starting with
	// prefix, in byte order, after the position in pageToken ("" for the
	// first page).
	List(ctx context.Context, s *typesv1.Scope, prefix, pageToken string, pageSize int) (ListPage, error)
	// Scan is List with the options of ListQuery: each key's value read
	// in the same snapshot as its revision, and descending order. List is
	// Scan with neither.
	Scan(ctx context.Context, s *typesv1.Scope, q ListQuery) (ListPage, error)
	// Search returns up to limit (1..MaxSearchLimit) keys of the scope
	// ranked by full-text relevance of their values to query, best first.
	// Keys whose current value was written with Guard.Unindexed are never
	// returned.
	Search(ctx context.Context, s *typesv1.Scope, query string, limit int) ([]SearchHit, error)
	// Close releases the store. Calls after Close fail with Unavailable.
	Close() error
}

// Guard holds the optional conditions of a Write or Delete, and the
// Write's indexing option.
type Guard struct {
	// ExpectedRevision, when set, makes the mutation apply only if the
	// key's current revision equals it; 0 means "the key must not exist".
	ExpectedRevision *uint64
	// IdempotencyKey, when not empty, makes a retry of the same operation
	// on the same key in the same scope return the first result with
	// Replayed = true and apply nothing. Records are kept for the
	// idempotency retention (WithIdempotencyRetention, default 24h).
	IdempotencyKey string
	// Unindexed (Write only) stores the value without full-text indexing
	// it (WriteRequest.unindexed): Read and List see it as usual, Search
	// never returns the key, and an indexed value it replaces leaves the
	// index. A later Write without it indexes the key again. A replayed
	// Write changes nothing, whatever its Unindexed says.
	Unindexed bool
	// Embedding (Write only, on a VectorBackend) is the value's
	// embedding for VectorSearch (WriteRequest.embedding): finite, not all
	// zero, at most MaxVectorDims; it is stored normalized and replaces
	// the key's earlier one. Nil: the key has no embedding after the
	// Write. Ignored with Unindexed.
	Embedding []float32
}

// Item is a stored value.
type Item struct {
	Value    *structpb.Value
	Revision uint64
}

// WriteResult is the outcome of Write.
type WriteResult struct {
	// Revision is the key's new revision (the first attempt's when
	// Replayed).
	Revision uint64
	// Replayed is true when the idempotency key matched an earlier write.
	Replayed bool
}

// DeleteResult is the outcome of Delete.
type DeleteResult struct {
	// Existed is true when the key existed and was removed (by the first
	// attempt when Replayed).
	Existed bool
	// Replayed is true when the idempotency key matched an earlier delete.
	Replayed bool
}

// ListQuery is what Scan lists.
type ListQuery struct {
	// Prefix selects the keys that start with it; "" selects every key.
	Prefix string
	// PageToken is the NextPageToken of the previous page, "" for the
	// first. A token continues only a listing of the same scope, prefix
	// and direction.
	PageToken string
	// PageSize is the most items of a page (1..MaxPageSize).
	PageSize int
	// Values returns each item's value (ListItem.Value). A page with
	// values also ends once its keys and values would exceed
	// MaxPageValueBytes, though it always holds at least one item.
	Values bool
	// Reverse lists in descending byte order of the key.
	Reverse bool
}

// MaxPageValueBytes bounds a page of Scan with values: its keys and
// encoded values total at most this, unless one item alone is larger
// (ListRequest.include_values).
const MaxPageValueBytes = 2 << 20

// ListItem is one key of a List page.
type ListItem struct {
	Key      string
	Revision uint64
	// Value is the key's value, when ListQuery.Values; nil otherwise.
	Value *structpb.Value
}

// ListPage is one page of List.
type ListPage struct {
	Items []ListItem
	// NextPageToken continues the listing; empty on the last page.
	NextPageToken string
}

// SearchHit is one Search result.
type SearchHit struct {
	Key string
	// Score is the relevance; higher is better, comparable only within
	// one result list.
	Score float64
	// Snippet is a plain-text fragment of the value around the best
	// cluster of matches.
	Snippet string
	// Revision is the revision of the value that was matched.
	Revision uint64
}
