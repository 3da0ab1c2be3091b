-- Schema version 4 of the StateService PostgreSQL backend (postgres.go):
-- the change log each replica's in-memory vector index catches up from
-- (postgres_vector.go), instead of comparing its scope's keys with the
-- table at every search.
--
-- A trigger adds a row for every insert, update or delete of a row that
-- has (or had) an embedding, in the changing transaction, whatever made
-- the change (a Write, a Delete, the retention sweeper). seq orders the
-- log; xid is the writing transaction, so that a reader can tell the rows
-- of transactions still running when it last read (whose seq may be
-- lower than what it saw) and read them again. A row says only which key
-- changed: the reader fetches the key's current row.
CREATE SEQUENCE state_vector_log_seq AS bigint;
CREATE TABLE state_vector_log (
    seq   bigint      PRIMARY KEY DEFAULT nextval('state_vector_log_seq'),
    xid   xid8        NOT NULL DEFAULT pg_current_xact_id(),
    at    timestamptz NOT NULL DEFAULT now(),
    scope bytea       NOT NULL,
    key   bytea       NOT NULL
);
CREATE INDEX state_vector_log_xid ON state_vector_log (xid);
CREATE INDEX state_vector_log_at ON state_vector_log (at);

-- The highest seq pruned from the log: a replica that last read below it
-- reloads its index.
CREATE TABLE state_vector_log_horizon (
    id          integer PRIMARY KEY CHECK (id = 1),
    pruned_upto bigint  NOT NULL
);
INSERT INTO state_vector_log_horizon (id, pruned_upto) VALUES (1, 0);

CREATE FUNCTION state_vector_log_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO state_vector_log (scope, key) VALUES (OLD.scope, OLD.key);
        RETURN OLD;
    END IF;
    INSERT INTO state_vector_log (scope, key) VALUES (NEW.scope, NEW.key);
    RETURN NEW;
END
$$;
CREATE TRIGGER state_vector_log_insert AFTER INSERT ON state_items
    FOR EACH ROW WHEN (NEW.embedding IS NOT NULL) EXECUTE FUNCTION state_vector_log_change();
CREATE TRIGGER state_vector_log_update AFTER UPDATE ON state_items
    FOR EACH ROW WHEN (OLD.embedding IS NOT NULL OR NEW.embedding IS NOT NULL) EXECUTE FUNCTION state_vector_log_change();
CREATE TRIGGER state_vector_log_delete AFTER DELETE ON state_items
    FOR EACH ROW WHEN (OLD.embedding IS NOT NULL) EXECUTE FUNCTION state_vector_log_change();
