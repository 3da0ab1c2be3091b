-- Schema version 3 of the StateService PostgreSQL backend (postgres.go):
-- embeddings for vector and hybrid search (postgres_vector.go).
--
-- embedding is the value's embedding, normalized, as little-endian
-- float32s (the bytes the bbolt backend stores in its vectors bucket);
-- NULL when the value has none (and always for an unindexed value). The
-- vector index itself lives in each replica's memory: a vector search
-- compares the scope's (key, revision) list, read through the partial
-- index below, with its replica's copy and fetches only the embeddings it
-- lacks.
ALTER TABLE state_items ADD COLUMN embedding bytea;
CREATE INDEX state_items_embedded ON state_items (scope, key) INCLUDE (revision)
    WHERE embedding IS NOT NULL;
