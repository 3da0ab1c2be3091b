package journal

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// setSchema rewrites the journal file's schema version (nil: removes it,
// as in files written before it was kept).
func setSchema(t *testing.T, path string, v []byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		if v == nil {
			return tx.Bucket(bucketMeta).Delete(keySchema)
		}
		return tx.Bucket(bucketMeta).Put(keySchema, v)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A journal of a newer layout is refused at open, naming both versions;
// one written before the version was kept is read as version 1,
// migrated and stamped (version 1's migration: retention_test.go).
func TestJournalSchemaVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	j.Close()

	setSchema(t, path, u64(schemaVersion+1))
	_, err = Open(path, 0)
	if !errors.Is(err, errSchema) || !strings.Contains(err.Error(), fmt.Sprintf("schema version %d", schemaVersion+1)) ||
		!strings.Contains(err.Error(), fmt.Sprintf("reads version %d", schemaVersion)) {
		t.Fatalf("Open of a version-%d file = %v; want it refused naming both versions", schemaVersion+1, err)
	}

	setSchema(t, path, nil)
	j, err = Open(path, 0)
	if err != nil {
		t.Fatalf("Open of a file without a schema version: %v", err)
	}
	j.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keySchema); string(v) != string(u64(schemaVersion)) {
			t.Errorf("schema version after opening an unversioned file = %x; want %d", v, schemaVersion)
		}
		return nil
	})
}
