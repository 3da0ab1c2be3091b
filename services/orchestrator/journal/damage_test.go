package journal

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/secbear/neuron/internal/boltdamage"
	"github.com/secbear/neuron/pkg/boltcheck"
)

// writeJournal writes a journal of a few dozen pages (padding beside the
// journal's own buckets, over several transactions) and closes it.
func writeJournal(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal.db")
	j, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 4 {
		err := j.db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("test-padding"))
			if err != nil {
				return err
			}
			for i := range 100 {
				if err := b.Put(fmt.Appendf(nil, "%03d-%d", i, round), bytes.Repeat([]byte{byte(i)}, 300)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// A damaged journal is refused by Open with boltcheck's error, before
// bbolt maps it (cmd/orchestrator/damage_test.go shows the SIGBUS it
// would be otherwise).
func TestOpenRefusesDamage(t *testing.T) {
	path := writeJournal(t)
	l := boltdamage.Inspect(t, path)
	for _, c := range []struct {
		name   string
		damage func(p string)
	}{
		{"cut into the pages in use", func(p string) { boltdamage.Truncate(t, p, int64(l.LastInUse()*l.PageSize)) }},
		{"garbage leaf page", func(p string) { boltdamage.GarbagePage(t, p, l, l.Last(t, "leaf")) }},
		{"both meta pages zeroed", func(p string) { boltdamage.ZeroPage(t, p, l, 0); boltdamage.ZeroPage(t, p, l, 1) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(boltdamage.CopyDir(t, filepath.Dir(path)), "journal.db")
			c.damage(p)
			_, err := Open(p, time.Second)
			if !errors.Is(err, boltcheck.ErrDamaged) || !strings.HasPrefix(err.Error(), "open journal "+p+": "+p+" is damaged: ") {
				t.Fatalf("Open = %v, want boltcheck.ErrDamaged naming the file", err)
			}
		})
	}
}

// One zeroed meta page opens, at the older transaction, with an ERROR
// naming the file and both transactions on WithLogger's logger.
func TestOpenMetaFallback(t *testing.T) {
	path := writeJournal(t)
	l := boltdamage.Inspect(t, path)
	boltdamage.ZeroPage(t, path, l, l.NewerMeta())
	var logged bytes.Buffer
	j, err := Open(path, time.Second, WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	// Open's own commit rewrote the damaged page: the next start is clean.
	if r, err := boltcheck.Check(path, time.Second); err != nil || r.Fallback != nil {
		t.Fatalf("after a start: %+v, %v; want both meta pages valid", r, err)
	}
	var warning string
	for line := range strings.Lines(logged.String()) {
		if strings.Contains(line, "DAMAGED META PAGE") {
			warning = line
		}
	}
	for _, want := range []string{"level=ERROR", "file=" + path, fmt.Sprintf("opened_txid=%d", l.Txid-1), fmt.Sprintf("possibly_missing_txid=%d", l.Txid)} {
		if !strings.Contains(warning, want) {
			t.Errorf("log %q does not say %q", logged.String(), want)
		}
	}
}

// The check waits for the lock like bbolt: a journal held by another
// Journal is still reported as locked, not as damaged.
func TestOpenLockedNotDamaged(t *testing.T) {
	path := writeJournal(t)
	j, err := Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if _, err := Open(path, 100*time.Millisecond); !errors.Is(err, errJournalLocked) {
		t.Fatalf("Open of a held journal = %v, want errJournalLocked", err)
	}
}
