-- Schema version 2 of the StateService PostgreSQL backend (postgres.go):
-- values written with WriteRequest.unindexed.
--
-- indexed is false for such a value. Its row then holds an empty body and
-- empty key_words, so its search vector is empty and the GIN index holds
-- nothing of it; Search also skips the row by this column. A later
-- indexed write of the key fills body and key_words again.
ALTER TABLE state_items ADD COLUMN indexed boolean NOT NULL DEFAULT true;
