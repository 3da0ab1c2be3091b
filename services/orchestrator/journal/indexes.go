package journal

import (
	"bytes"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/services/orchestrator"
)

// The status indexes of schema version 2. index holds every workflow's
// status (ListWorkflows); live holds the unfinished ones, so that a start
// reads those alone (Unfinished); ended holds the finished ones by the
// time they ended, oldest first, so that retention finds what to delete
// without reading anything else (retention.go); meta/finished counts
// ended's entries, for the count bound.

// indexStatus keeps the indexes in step with r, in the transaction that
// writes r. The status index's previous value says what changed: a
// workflow enters live when it is created unfinished, and moves from live
// to ended once, when it finishes (a finished workflow never runs again);
// a write that leaves the status as it was touches no index.
func indexStatus(tx *bolt.Tx, r *record) error {
	key := indexKey(r)
	st := []byte{byte(r.Status)}
	idx := tx.Bucket(bucketIndex)
	prev := idx.Get(key)
	if bytes.Equal(prev, st) {
		return nil
	}
	wasFinished := len(prev) == 1 && orchestrator.Terminal(orchestratorv1.WorkflowStatus(prev[0]))
	if err := idx.Put(key, st); err != nil {
		return err
	}
	if wasFinished {
		return nil // already in ended
	}
	live := tx.Bucket(bucketLive)
	if !r.terminal() {
		return live.Put(key, st)
	}
	if prev != nil { // else created ended, in this write: never live
		if err := live.Delete(key); err != nil {
			return err
		}
	}
	if err := tx.Bucket(bucketEnded).Put(endedKey(endTime(r), r.ID), key[:8]); err != nil {
		return err
	}
	meta := tx.Bucket(bucketMeta)
	return meta.Put(keyFinished, u64(getU64(meta, keyFinished)+1))
}

// endedKey orders finished workflows by the time they ended.
func endedKey(at time.Time, id string) []byte {
	return append(u64(uint64(at.UnixNano())), id...)
}

// endTime is when a finished workflow ended: its record's last update,
// which is the write that finished it.
func endTime(r *record) time.Time {
	if !r.Updated.IsZero() {
		return r.Updated
	}
	return r.Created
}

// migrate brings a file of schema version from up to schemaVersion, in
// Open's transaction. From 1 to 2 it builds live and ended from the
// status index, reading the record of each finished workflow for the
// time it ended: one pass over the journal, once; the workflows are not
// rewritten. From 2 to 3 there is nothing to do: version 3 writes its
// records in binary (codec.go) and reads the JSON ones as they are.
func migrate(tx *bolt.Tx, from uint64) error {
	if from < 1 || from >= schemaVersion {
		return fmt.Errorf("no migration from schema version %d", from)
	}
	if from == 1 {
		if err := buildIndexes(tx); err != nil {
			return err
		}
	}
	return nil
}

// buildIndexes builds live and ended from the status index (version 1
// to 2).
func buildIndexes(tx *bolt.Tx) error {
	all, live, ended := tx.Bucket(bucketWorkflows), tx.Bucket(bucketLive), tx.Bucket(bucketEnded)
	var finished uint64
	err := tx.Bucket(bucketIndex).ForEach(func(k, v []byte) error {
		if len(k) < 8 || len(v) != 1 {
			return fmt.Errorf("index entry %x is corrupt", k)
		}
		if !orchestrator.Terminal(orchestratorv1.WorkflowStatus(v[0])) {
			return live.Put(bytes.Clone(k), bytes.Clone(v))
		}
		b := all.Bucket(k[8:])
		if b == nil {
			return nil // an entry without its workflow: nothing to delete later
		}
		r, err := readRecord(b)
		if err != nil {
			return fmt.Errorf("workflow %q: %w", k[8:], err)
		}
		finished++
		return ended.Put(endedKey(endTime(r), string(k[8:])), bytes.Clone(k[:8]))
	})
	if err != nil {
		return err
	}
	return tx.Bucket(bucketMeta).Put(keyFinished, u64(finished))
}
