package state

import (
	"encoding/binary"
	"fmt"
	"time"
)

// The bbolt file's layout. Every bucket and meta key is declared here.
//
//	meta     schema_version, seq, db_id, page_token_secret, changes_pruned
//	kv       scope.Encode(scope) + key        -> a record (see encodeRecord)
//	idem     scope.Encode(scope) + idem key   -> idempotency record (see encodeIdem)
//	idem_at  created(8) + scope + idem key    -> empty (prunes idem by age)
//	changes  seq(8)                           -> scope + key (the change log the
//	                                             search index catches up from;
//	                                             only changes the index must see)
//	vectors  scope.Encode(scope) + key        -> the key's embedding, normalized
//	                                             (float32s, little-endian); only
//	                                             for indexed values that have one
//
// Integers are big-endian so byte order is numeric order. Encoded scopes
// are self-delimiting (package scope), so a scope's keys are exactly the
// keys with its encoding as prefix.
var (
	bucketMeta    = []byte("meta")
	bucketKV      = []byte("kv")
	bucketIdem    = []byte("idem")
	bucketIdemAt  = []byte("idem_at")
	bucketChanges = []byte("changes")
	bucketVectors = []byte("vectors")

	allBuckets = [][]byte{bucketMeta, bucketKV, bucketIdem, bucketIdemAt, bucketChanges, bucketVectors}
)

// Keys of the meta bucket.
var (
	metaSchemaVersion = []byte("schema_version")
	// metaSeq is the revision counter: the last number any Write or
	// Delete took, and so the last applied change.
	metaSeq = []byte("seq")
	// metaDBID identifies this file, so an index built for another file
	// is never trusted.
	metaDBID = []byte("db_id")
	// metaTokenSecret is the HMAC secret of page tokens.
	metaTokenSecret = []byte("page_token_secret")
	// metaChangesPruned is the highest seq removed from the change log.
	metaChangesPruned = []byte("changes_pruned")
)

// schemaVersion is the layout above. Bump it, with a migration, when the
// layout changes. initMeta upgrades older files in place.
//
//	1  kv records are revision(8) | proto(Value)
//	2  kv records may carry flags (recordUnindexed); version-1 records
//	   are still read as they are, so the upgrade only rewrites the
//	   number (and a build that reads only version 1 refuses the file,
//	   instead of misreading a flagged record)
//	3  the vectors bucket (embeddings); the upgrade creates it empty (a
//	   build that reads only version 2 refuses the file, instead of
//	   leaving a replaced value's embedding behind)
const schemaVersion = 3

// minSchemaVersion is the oldest layout this build opens (and upgrades).
const minSchemaVersion = 1

func u64(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

func readU64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// Record flags.
const (
	// recordUnindexed: the value is stored but not full-text indexed
	// (WriteRequest.unindexed).
	recordUnindexed byte = 1 << 0
)

// recordMarker follows the revision of a record that carries flags. A
// version-1 record has the value's protobuf encoding there instead,
// which never starts with 0 (that would be field number 0, which
// protobuf forbids), so both are read unambiguously.
const recordMarker = 0

// encodeRecord is a kv value: revision(8) | proto(Value) for an indexed
// value (as in schema version 1), revision(8) | 0x00 | flags(1) |
// proto(Value) when flags are set.
func encodeRecord(rev uint64, flags byte, raw []byte) []byte {
	if flags == 0 {
		b := make([]byte, 8, 8+len(raw))
		binary.BigEndian.PutUint64(b, rev)
		return append(b, raw...)
	}
	b := make([]byte, 10, 10+len(raw))
	binary.BigEndian.PutUint64(b, rev)
	b[8], b[9] = recordMarker, flags
	return append(b, raw...)
}

// decodeRecord reads a kv value of either form. raw aliases b.
func decodeRecord(b []byte) (rev uint64, flags byte, raw []byte, err error) {
	if len(b) < 8 {
		return 0, 0, nil, fmt.Errorf("kv record is %d bytes", len(b))
	}
	rev, raw = binary.BigEndian.Uint64(b), b[8:]
	if len(raw) > 0 && raw[0] == recordMarker {
		if len(raw) < 2 {
			return 0, 0, nil, fmt.Errorf("kv record is %d bytes", len(b))
		}
		flags, raw = raw[1], raw[2:]
	}
	return rev, flags, raw, nil
}

// idemRecordLen is created(8) | op(1) | fingerprint(16) | revision(8) | existed(1).
const idemRecordLen = 34

func encodeIdem(r idemRecord) []byte {
	b := make([]byte, 0, idemRecordLen)
	b = binary.BigEndian.AppendUint64(b, uint64(r.created.UnixNano()))
	b = append(b, byte(r.op))
	b = append(b, r.fingerprint[:]...)
	b = binary.BigEndian.AppendUint64(b, r.revision)
	if r.existed {
		return append(b, 1)
	}
	return append(b, 0)
}

func decodeIdem(b []byte) (idemRecord, error) {
	if len(b) != idemRecordLen {
		return idemRecord{}, fmt.Errorf("idempotency record is %d bytes", len(b))
	}
	var r idemRecord
	r.created = time.Unix(0, int64(binary.BigEndian.Uint64(b)))
	r.op = opKind(b[8])
	copy(r.fingerprint[:], b[9:25])
	r.revision = binary.BigEndian.Uint64(b[25:33])
	r.existed = b[33] == 1
	return r, nil
}

// idemAtKey is the idem_at key of the record at ik.
func idemAtKey(created time.Time, ik []byte) []byte {
	return append(u64(uint64(created.UnixNano())), ik...)
}
