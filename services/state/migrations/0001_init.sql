-- Schema version 1 of the StateService PostgreSQL backend (postgres.go).
-- Applied once, in a transaction, under the migration advisory lock.

-- The store-wide revision counter: every applied Write or Delete takes
-- nextval, so revisions are never reused, even after delete and re-create.
CREATE SEQUENCE state_revision AS bigint START 1;

-- One row per key. scope is the pkg/scope encoding of the scope; key is
-- the key's UTF-8 bytes. Both are bytea because they may hold NUL, which
-- text cannot, and because bytea compares in byte order (the List order)
-- whatever the database's collation. value is the deterministic protobuf
-- encoding of the google.protobuf.Value, the same bytes the bbolt backend
-- stores (jsonb cannot hold "\u0000" in strings). body is the searchable
-- text of the value (its string leaves, one per line, NUL as space);
-- key_words are the words of the key.
CREATE TABLE state_items (
    scope     bytea  NOT NULL,
    key       bytea  NOT NULL,
    value     bytea  NOT NULL,
    revision  bigint NOT NULL,
    body      text   NOT NULL,
    key_words text   NOT NULL,
    search    tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english'::regconfig, body), 'A') ||
        setweight(to_tsvector('english'::regconfig, key_words), 'B')
    ) STORED,
    PRIMARY KEY (scope, key)
);
CREATE INDEX state_items_search ON state_items USING gin (search);

-- Idempotency records: id is the encoded scope followed by the
-- idempotency key. A record is honoured for the retention after
-- created_at and pruned afterwards.
CREATE TABLE state_idempotency (
    id          bytea       PRIMARY KEY,
    created_at  timestamptz NOT NULL,
    op          smallint    NOT NULL,
    fingerprint bytea       NOT NULL,
    revision    bigint      NOT NULL,
    existed     boolean     NOT NULL
);
CREATE INDEX state_idempotency_created ON state_idempotency (created_at);

-- Store-wide settings, such as the page token secret.
CREATE TABLE state_meta (
    name  text  PRIMARY KEY,
    value bytea NOT NULL
);
