package state

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// metaRetentionMarks is the meta key of the retention sweeper's notes:
// at(8, Unix nanoseconds) | rev(8), repeated, oldest first. A build that
// predates retention ignores it.
var metaRetentionMarks = []byte("retention_marks")

// retentionScan implements retentionStore: one read transaction over the
// kv bucket and the revision counter.
func (b *Bolt) retentionScan(ctx context.Context, fn func(enc []byte, key string, rev uint64)) (uint64, error) {
	release, err := b.begin()
	if err != nil {
		return 0, err
	}
	defer release()
	var last uint64
	err = b.db.View(func(tx *bolt.Tx) error {
		last = readU64(tx.Bucket(bucketMeta).Get(metaSeq))
		c := tx.Bucket(bucketKV).Cursor()
		n := 0
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if n++; n%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			rev, _, _, err := decodeRecord(v)
			if err != nil {
				continue
			}
			enc, key, err := splitKey(k)
			if err != nil {
				continue
			}
			fn(enc, key, rev)
		}
		return nil
	})
	return last, err
}

// loadMarks implements retentionStore.
func (b *Bolt) loadMarks() ([]retentionMark, error) {
	release, err := b.begin()
	if err != nil {
		return nil, err
	}
	defer release()
	var marks []retentionMark
	err = b.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketMeta).Get(metaRetentionMarks)
		if len(raw)%16 != 0 {
			return fmt.Errorf("meta %s is %d bytes, not a multiple of 16", metaRetentionMarks, len(raw))
		}
		for i := 0; i < len(raw); i += 16 {
			marks = append(marks, retentionMark{
				at:  time.Unix(0, int64(binary.BigEndian.Uint64(raw[i:]))),
				rev: binary.BigEndian.Uint64(raw[i+8:]),
			})
		}
		return nil
	})
	return marks, err
}

// saveMarks implements retentionStore.
func (b *Bolt) saveMarks(marks []retentionMark) error {
	release, err := b.begin()
	if err != nil {
		return err
	}
	defer release()
	raw := make([]byte, 0, 16*len(marks))
	for _, m := range marks {
		raw = binary.BigEndian.AppendUint64(raw, uint64(m.at.UnixNano()))
		raw = binary.BigEndian.AppendUint64(raw, m.rev)
	}
	return b.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(metaRetentionMarks, raw)
	})
}
