package state

import (
	"encoding/binary"
	"fmt"
	"time"
)

// The bbolt file's layout. Every bucket and meta key is declared here.
//
//	meta     schema_version, seq, db_id, page_token_secret, changes_pruned
//	kv       scope.Encode(scope) + key        -> revision(8) | proto(Value)
//	idem     scope.Encode(scope) + idem key   -> idempotency record (see encodeIdem)
//	idem_at  created(8) + scope + idem key    -> empty (prunes idem by age)
//	changes  seq(8)                           -> scope + key (the change log the
//	                                             search index catches up from)
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

	allBuckets = [][]byte{bucketMeta, bucketKV, bucketIdem, bucketIdemAt, bucketChanges}
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
// layout changes.
const schemaVersion = 1

func u64(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

func readU64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// encodeRecord is a kv value.
func encodeRecord(rev uint64, raw []byte) []byte {
	return append(u64(rev), raw...)
}

func decodeRecord(b []byte) (rev uint64, raw []byte, err error) {
	if len(b) < 8 {
		return 0, nil, fmt.Errorf("kv record is %d bytes", len(b))
	}
	return binary.BigEndian.Uint64(b), b[8:], nil
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
