// Package state implements layer0.state.v1.StateService: JSON values
// under keys in disjoint scopes, with a revision per key, compare-and-set,
// idempotent retries, paged listing and full-text search.
//
// The pieces, from the RPC inwards:
//
//   - server.go: Server, the gRPC handler; it maps requests to a Backend
//     and applies request defaults (page size 100, search limit 10).
//   - backend.go: the Backend interface and its result types.
//   - core.go, limits.go, pagetoken.go, apply.go: validation, limits,
//     page tokens and the write semantics (idempotency, compare-and-set,
//     revisions) that both backends share, so they behave identically.
//   - bolt.go, commit.go, buckets.go, index.go: the durable backend, a
//     bbolt file (the source of truth, every write fsynced, concurrent
//     writes group-committed) with a bleve index beside it, updated in
//     batches by a background indexer after the write is acknowledged,
//     caught up before every Search, and caught up or rebuilt from the
//     file on open.
//   - postgres.go, postgres_migrate.go, migrations/: the PostgreSQL
//     backend, for several replicas over one database.
//   - memory.go: an in-memory backend with the same semantics, not
//     durable, for tests and the conformance suite.
//   - text.go: the text of a JSON value and search snippets.
//   - vector.go, hybrid.go, snippets.go, postgres_vector.go,
//     internal/hnsw: vector search (an in-memory index per store or
//     replica, HNSW graphs built in the background), hybrid fusion, and
//     hybrid's snippets cut for the returned keys only.
//   - retention.go, retention_bolt.go, retention_memory.go,
//     retention_postgres.go: the retention sweeper and each backend's
//     part of it.
//   - logging.go: CallLogHandler, which keeps the caller's keys out of
//     the server's call log.
//
// A Write may be unindexed (Guard.Unindexed, WriteRequest.unindexed):
// stored, read and listed as usual, never returned by Search, and costing
// the index nothing unless it replaces an indexed value.
//
// Keys are stored under scope.Encode(scope) + key, an injective and
// prefix-free composition, so no key, whatever it contains, is visible
// from another scope.
//
// Revisions come from one counter per store; every applied Write or
// Delete takes the next value, so revisions of a key strictly increase
// and are never reused after a delete and re-create.
//
// Idempotency: a Write or Delete with an idempotency key records its
// result under (scope, idempotency key). A retry within the retention
// (WithIdempotencyRetention, default 24h) returns that result with
// replayed = true and applies nothing; reusing the key for another
// operation or key is INVALID_ARGUMENT. Failed attempts record nothing.
// Records older than the retention are ignored and pruned by later
// writes, a bounded number per transaction.
package state
