package state

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blevesearch/bleve/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/secbear/neuron/pkg/scope"
)

// boltCount counts the keys of a bucket.
func boltCount(t *testing.T, b *Bolt, bucket []byte) int {
	t.Helper()
	n := 0
	if err := b.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucket).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func mustOpen(t *testing.T, path string, opts ...Option) *Bolt {
	t.Helper()
	b, err := OpenBolt(path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func mustClose(t *testing.T, b *Bolt) {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// searchKeys returns the keys Search finds for query, best first.
func searchKeys(t *testing.T, b Backend, query string) []string {
	t.Helper()
	hits, err := b.Search(ctx, scope.Session("s"), query, 100)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, h := range hits {
		keys = append(keys, h.Key)
	}
	return keys
}

func TestBoltReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nested", "state.db")
	s := scope.Session("s")
	b := mustOpen(t, path)
	r1 := write(t, b, s, "a", str("persistent aardvark"))
	write(t, b, s, "gone", str("deleted soon"))
	if _, err := b.Delete(ctx, s, "gone", Guard{}); err != nil {
		t.Fatal(err)
	}
	idem, err := b.Write(ctx, s, "b", str("persistent badger"), Guard{IdempotencyKey: "once"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		write(t, b, s, fmt.Sprint("p", i), str("page"))
	}
	page, err := b.List(ctx, s, "p", "", 2)
	if err != nil {
		t.Fatal(err)
	}
	mustClose(t, b)

	b = mustOpen(t, path)
	if it := read(t, b, s, "a"); it.Revision != r1 || it.Value.GetStringValue() != "persistent aardvark" {
		t.Fatalf("after reopen Read = %v @%d", it.Value, it.Revision)
	}
	if _, err := b.Read(ctx, s, "gone"); err == nil {
		t.Fatal("deleted key came back")
	}
	res, err := b.Write(ctx, s, "b", str("persistent badger"), Guard{IdempotencyKey: "once"})
	if err != nil || !res.Replayed || res.Revision != idem.Revision {
		t.Fatalf("idempotent retry after reopen = %+v, %v", res, err)
	}
	if r := write(t, b, s, "a", str("again")); r <= idem.Revision {
		t.Fatalf("revision %d after reopen is not above %d", r, idem.Revision)
	}
	next, err := b.List(ctx, s, "p", page.NextPageToken, 2)
	if err != nil || len(next.Items) != 1 || next.Items[0].Key != "p2" {
		t.Fatalf("page token after reopen: %+v, %v", next, err)
	}
	if got := searchKeys(t, b, "badger"); len(got) != 1 || got[0] != "b" {
		t.Fatalf("Search after reopen = %q", got)
	}
	if !strings.HasPrefix(b.index.opened, "opened") {
		t.Fatalf("index was %q on a clean reopen", b.index.opened)
	}
}

func TestBoltRebuildsIndex(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, path string)
		reason string
	}{
		{"deleted", func(t *testing.T, path string) {
			if err := os.RemoveAll(path + ".bleve"); err != nil {
				t.Fatal(err)
			}
		}, "index missing"},
		{"corrupt", func(t *testing.T, path string) {
			if err := os.WriteFile(filepath.Join(path+".bleve", "index_meta.json"), []byte("{garbage"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "index unreadable"},
		{"emptied", func(t *testing.T, path string) {
			if err := os.RemoveAll(path + ".bleve"); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path+".bleve", 0o700); err != nil {
				t.Fatal(err)
			}
		}, "index unreadable"},
		{"from another database", func(t *testing.T, path string) {
			other := filepath.Join(t.TempDir(), "other.db")
			o, err := OpenBolt(other)
			if err != nil {
				t.Fatal(err)
			}
			write(t, o, scope.Session("s"), "x", str("foreign"))
			mustClose(t, o)
			if err := os.RemoveAll(path + ".bleve"); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(other+".bleve", path+".bleve"); err != nil {
				t.Fatal(err)
			}
		}, "another database"},
		{"ahead of the database", func(t *testing.T, path string) {
			setIndexSeq(t, path, 1<<40)
		}, "ahead of the database"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			b := mustOpen(t, path)
			s := scope.Session("s")
			for i := range 30 {
				write(t, b, s, fmt.Sprintf("k%02d", i), str(fmt.Sprintf("rebuild document %d", i)))
			}
			write(t, b, s, "special", str("unique zeppelin"))
			mustClose(t, b)
			tt.damage(t, path)

			b = mustOpen(t, path)
			if !strings.Contains(b.index.opened, tt.reason) {
				t.Fatalf("index %q; want a rebuild because %q", b.index.opened, tt.reason)
			}
			if got := searchKeys(t, b, "zeppelin"); len(got) != 1 || got[0] != "special" {
				t.Fatalf("Search after rebuild = %q", got)
			}
			if got := searchKeys(t, b, "document"); len(got) != 30 {
				t.Fatalf("Search after rebuild found %d; want 30", len(got))
			}
			if got := searchKeys(t, b, "foreign"); len(got) != 0 {
				t.Fatalf("foreign document survived: %q", got)
			}
			// The rebuilt index is trusted on the next open.
			mustClose(t, b)
			b = mustOpen(t, path)
			if !strings.HasPrefix(b.index.opened, "opened") {
				t.Fatalf("second open: %q", b.index.opened)
			}
		})
	}
}

// setIndexSeq rewrites the sequence an index at path+".bleve" claims,
// and deletes documents, to simulate a crash between the bbolt commit and
// the index update.
func setIndexSeq(t *testing.T, path string, seq uint64, deleteIDs ...string) {
	t.Helper()
	idx, err := bleve.OpenUsing(path+".bleve", runtimeConfig())
	if err != nil {
		t.Fatal(err)
	}
	batch := idx.NewBatch()
	for _, id := range deleteIDs {
		batch.Delete(id)
	}
	batch.SetInternal(internalSeq, []byte(strconv.FormatUint(seq, 10)))
	done := make(chan error, 1)
	batch.SetPersistedCallback(func(err error) { done <- err })
	if err := idx.Batch(batch); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := idx.Close(); err != nil {
		t.Fatal(err)
	}
}

// commitWithoutIndex applies m as Write and Delete do but does not wake
// the background indexer (stop it first with b.index.stopIndexer, so
// that nothing else indexes the change), as a crash between the bbolt
// commit and the index update would.
func commitWithoutIndex(t *testing.T, b *Bolt, m *mutation) outcome {
	t.Helper()
	var out outcome
	if err := b.group.run(func(tx *bolt.Tx) error {
		var err error
		out, err = apply(boltTxn{tx: tx}, m, b.opts.retention)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	storeMax(&b.committed, out.seq)
	return out
}

// crash closes b as a crash after bleve persisted what it had would: the
// indexer stops, and neither it nor Close applies what it had not yet.
func crash(t *testing.T, b *Bolt) {
	t.Helper()
	b.index.stopIndexer()
	if !b.index.waitPersisted(closeFlushTimeout) {
		t.Fatal("index not persisted")
	}
	b.life.Lock()
	defer b.life.Unlock()
	b.closed = true
	if err := errors.Join(b.index.idx.Close(), b.db.Close()); err != nil {
		t.Fatal(err)
	}
}

func TestBoltIndexCatchesUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := scope.Session("s")
	b := mustOpen(t, path)
	write(t, b, s, "a", str("alpha indexed"))
	write(t, b, s, "b", str("bravo indexed"))
	write(t, b, s, "gone", str("delta removed"))
	searchKeys(t, b, "alpha") // the index is current
	b.index.stopIndexer()
	indexedTo := b.index.indexed.Load()
	// Then, three commits whose index updates are lost.
	for _, m := range []func() (*mutation, error){
		func() (*mutation, error) { return b.prepareWrite(ctx, s, "c", str("charlie lost update"), Guard{}) },
		func() (*mutation, error) { return b.prepareWrite(ctx, s, "a", str("alpha changed"), Guard{}) },
		func() (*mutation, error) { return b.prepareDelete(ctx, s, "gone", Guard{}) },
	} {
		mu, err := m()
		if err != nil {
			t.Fatal(err)
		}
		commitWithoutIndex(t, b, mu)
	}
	if b.index.indexed.Load() != indexedTo {
		t.Fatal("the index moved")
	}
	crash(t, b)

	b = mustOpen(t, path)
	if b.index.opened != "opened, caught up 3 changes" {
		t.Fatalf("index %q; want a catch-up of 3 changes", b.index.opened)
	}
	if got := searchKeys(t, b, "charlie"); len(got) != 1 {
		t.Fatalf("lost update not caught up: %q", got)
	}
	if got := searchKeys(t, b, "delta"); len(got) != 0 {
		t.Fatalf("deleted key still searchable: %q", got)
	}
	if got := searchKeys(t, b, "indexed"); len(got) != 1 || got[0] != "b" {
		t.Fatalf("Search = %q", got)
	}
	if got := searchKeys(t, b, "changed"); len(got) != 1 || got[0] != "a" {
		t.Fatalf("Search = %q", got)
	}
}

// TestBoltIndexOlderThanChangeLog: an index older than what the change
// log still holds (restored from a backup, say) is rebuilt.
func TestBoltIndexOlderThanChangeLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := scope.Session("s")
	b := mustOpen(t, path)
	if err := b.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(metaChangesPruned, u64(1000))
	}); err != nil {
		t.Fatal(err)
	}
	write(t, b, s, "a", str("alpha"))
	mustClose(t, b)
	b = mustOpen(t, path)
	if !strings.Contains(b.index.opened, "older than the change log") {
		t.Fatalf("index %q", b.index.opened)
	}
	if got := searchKeys(t, b, "alpha"); len(got) != 1 {
		t.Fatalf("Search = %q", got)
	}
}

func TestBoltChangeLogIsPruned(t *testing.T) {
	b := mustOpen(t, filepath.Join(t.TempDir(), "state.db"))
	s := scope.Session("s")
	for i := range 50 {
		write(t, b, s, fmt.Sprint("k", i), str("v"))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		write(t, b, s, "tick", str("v")) // pruning happens in write transactions
		n := boltCount(t, b, bucketChanges)
		if n < 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("change log still holds %d entries (index durable at %d)", n, b.index.durable.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBoltLockTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	mustOpen(t, path)
	start := time.Now()
	_, err := OpenBolt(path, WithLockTimeout(100*time.Millisecond))
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v; want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "another process holds the lock") {
		t.Fatalf("error %q does not name the file and the lock", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("waited %v", d)
	}
}

func TestBoltSchemaVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	b := mustOpen(t, path)
	if err := b.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(metaSchemaVersion, u64(99))
	}); err != nil {
		t.Fatal(err)
	}
	mustClose(t, b)
	_, err := OpenBolt(path)
	if err == nil || !strings.Contains(err.Error(), "schema version is 99") {
		t.Fatalf("open = %v", err)
	}
}

// TestBoltGroupCommit checks that concurrent writers share transactions
// when commits are slow (as fsync is on most disks).
func TestBoltGroupCommit(t *testing.T) {
	b := mustOpen(t, filepath.Join(t.TempDir(), "state.db"))
	s := scope.Session("s")
	b.group.housekeeping = func(tx *bolt.Tx) error {
		time.Sleep(2 * time.Millisecond) // a slow disk
		return b.housekeeping(tx)
	}
	before := b.group.transactions.Load()
	const writers, each = 16, 10
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := b.Write(ctx, s, fmt.Sprint(w, "/", i), str("v"), Guard{}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	txs := b.group.transactions.Load() - before
	t.Logf("%d writes in %d write transactions", writers*each, txs)
	if txs > writers*each/2 {
		t.Fatalf("%d writes took %d transactions: no group commit", writers*each, txs)
	}
}

func TestGroupCommitRerunsAlone(t *testing.T) {
	b := mustOpen(t, filepath.Join(t.TempDir(), "state.db"))
	g := &groupCommit{db: b.db}
	bad := errors.New("bad")
	var runs [3]int
	ops := []*commitOp{
		{fn: func(tx *bolt.Tx) error { runs[0]++; return tx.Bucket(bucketMeta).Put([]byte("x0"), []byte("1")) }},
		{fn: func(*bolt.Tx) error { runs[1]++; return bad }},
		{fn: func(tx *bolt.Tx) error { runs[2]++; return tx.Bucket(bucketMeta).Put([]byte("x2"), []byte("1")) }},
	}
	g.commit(ops)
	if ops[0].err != nil || !errors.Is(ops[1].err, bad) || ops[2].err != nil {
		t.Fatalf("errors %v %v %v", ops[0].err, ops[1].err, ops[2].err)
	}
	if runs != [3]int{2, 2, 1} {
		t.Fatalf("runs %v", runs)
	}
	if err := b.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta).Get([]byte("x0")) == nil || tx.Bucket(bucketMeta).Get([]byte("x2")) == nil {
			return errors.New("a good function was not committed")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestBoltEmptyReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	mustClose(t, mustOpen(t, path))
	b := mustOpen(t, path)
	if !strings.HasPrefix(b.index.opened, "opened") {
		t.Fatalf("reopening an empty store: index %q", b.index.opened)
	}
}

// TestBoltSearchCatchesUp: a change the indexer has not applied yet (it
// is stopped here; it may as well not have woken yet, or have failed) is
// applied by Search before it answers.
func TestBoltSearchCatchesUp(t *testing.T) {
	b := mustOpen(t, filepath.Join(t.TempDir(), "state.db"))
	s := scope.Session("s")
	b.index.stopIndexer()
	m, err := b.prepareWrite(ctx, s, "k", str("unindexed narwhal"), Guard{})
	if err != nil {
		t.Fatal(err)
	}
	out := commitWithoutIndex(t, b, m)
	if b.index.indexed.Load() >= out.seq {
		t.Fatal("index is not behind")
	}
	if got := searchKeys(t, b, "narwhal"); len(got) != 1 || got[0] != "k" {
		t.Fatalf("Search = %q", got)
	}
}

// TestBoltUnindexedSurvivesRestart: unindexed values stay unindexed
// after a clean reopen, a rebuild of the index, and a catch-up after a
// crash in which the index had not seen an unindexed replace.
func TestBoltUnindexedSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := scope.Session("s")
	b := mustOpen(t, path)
	write(t, b, s, "public", str("an indexed mongoose"))
	hidden, err := b.Write(ctx, s, "hidden", str("an unindexed mongoose"), Guard{Unindexed: true})
	if err != nil {
		t.Fatal(err)
	}
	write(t, b, s, "flip", str("a flipping mongoose"))
	if _, err := b.Write(ctx, s, "flip", str("a flipped mongoose"), Guard{Unindexed: true}); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if got := searchKeys(t, b, "mongoose"); !slices.Equal(got, []string{"public"}) {
			t.Fatalf("%s: Search = %q; want only public", when, got)
		}
		if it := read(t, b, s, "hidden"); it.Revision != hidden.Revision || it.Value.GetStringValue() != "an unindexed mongoose" {
			t.Fatalf("%s: Read = %v @%d", when, it.Value, it.Revision)
		}
		if got := keysOf(listAll(t, b, s, "", 10)); !slices.Contains(got, "hidden") || !slices.Contains(got, "flip") {
			t.Fatalf("%s: List = %q", when, got)
		}
	}
	check("before restart")
	mustClose(t, b)

	b = mustOpen(t, path)
	check("after reopen")
	mustClose(t, b)

	if err := os.RemoveAll(path + ".bleve"); err != nil {
		t.Fatal(err)
	}
	b = mustOpen(t, path)
	if !strings.Contains(b.index.opened, "rebuilt") {
		t.Fatalf("index %q; want a rebuild", b.index.opened)
	}
	check("after rebuild")

	// The index sees "late" indexed; then, before the indexer runs, the
	// process crashes after an unindexed replace. The catch-up on open
	// removes the document.
	write(t, b, s, "late", str("a late mongoose"))
	if got := searchKeys(t, b, "late"); !slices.Equal(got, []string{"late"}) {
		t.Fatalf("Search = %q", got)
	}
	b.index.stopIndexer()
	m, err := b.prepareWrite(ctx, s, "late", str("a late mongoose, unindexed"), Guard{Unindexed: true})
	if err != nil {
		t.Fatal(err)
	}
	commitWithoutIndex(t, b, m)
	crash(t, b)
	b = mustOpen(t, path)
	if b.index.opened != "opened, caught up 1 changes" {
		t.Fatalf("index %q", b.index.opened)
	}
	if got := searchKeys(t, b, "late"); len(got) != 0 {
		t.Fatalf("after the catch-up, Search = %q", got)
	}
	check("after the catch-up")
}

// TestBoltUnindexedCostsTheIndexNothing: an unindexed write over an
// unindexed or absent value leaves no change-log entry and no index
// batch; one that replaces an indexed value leaves one entry, and the
// indexer applies it in the background, without a Search.
func TestBoltUnindexedCostsTheIndexNothing(t *testing.T) {
	b := mustOpen(t, filepath.Join(t.TempDir(), "state.db"))
	s := scope.Session("s")
	write(t, b, s, "indexed", str("visible"))
	searchKeys(t, b, "visible") // the index is current
	changes, batches := boltCount(t, b, bucketChanges), b.index.batches.Load()
	for i := range 20 {
		if _, err := b.Write(ctx, s, fmt.Sprint("history/", i%5), str("turn"), Guard{Unindexed: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Delete(ctx, s, "history/0", Guard{}); err != nil {
		t.Fatal(err)
	}
	if got := boltCount(t, b, bucketChanges); got > changes {
		t.Fatalf("unindexed writes took %d change-log entries", got-changes)
	}
	searchKeys(t, b, "turn")
	if got := b.index.batches.Load(); got != batches {
		t.Fatalf("unindexed writes cost %d index batches", got-batches)
	}
	if b.index.indexed.Load() != b.committed.Load() {
		t.Fatalf("index at %d, committed %d", b.index.indexed.Load(), b.committed.Load())
	}

	// Replacing an indexed value: one entry, applied in the background.
	res, err := b.Write(ctx, s, "indexed", str("hidden now"), Guard{Unindexed: true})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.index.indexed.Load() < res.Revision {
		if time.Now().After(deadline) {
			t.Fatalf("the background indexer did not apply revision %d (index at %d)", res.Revision, b.index.indexed.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := b.index.batches.Load(); got != batches+1 {
		t.Fatalf("%d index batches; want 1", got-batches)
	}
	if got := searchKeys(t, b, "visible hidden"); len(got) != 0 {
		t.Fatalf("Search = %q", got)
	}
}

// TestBoltBackgroundIndexerBatches: serial writes are indexed in the
// background, several per bleve batch, and each is visible to Search as
// soon as it is acknowledged.
func TestBoltBackgroundIndexerBatches(t *testing.T) {
	b := mustOpen(t, filepath.Join(t.TempDir(), "state.db"))
	s := scope.Session("s")
	before := b.index.batches.Load()
	const n = 40
	var last uint64
	for i := range n {
		last = write(t, b, s, fmt.Sprint("k", i), str(fmt.Sprintf("serial capybara%d", i)))
		time.Sleep(time.Millisecond) // a writer that is not in a hurry
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.index.indexed.Load() < last {
		if time.Now().After(deadline) {
			t.Fatalf("the background indexer did not catch up (index at %d of %d)", b.index.indexed.Load(), last)
		}
		time.Sleep(5 * time.Millisecond)
	}
	batches := b.index.batches.Load() - before
	t.Logf("%d serial writes in %d index batches", n, batches)
	if batches > n/2 {
		t.Fatalf("%d serial writes took %d index batches: no batching", n, batches)
	}
	if got := searchKeys(t, b, "capybara7"); !slices.Equal(got, []string{"k7"}) {
		t.Fatalf("Search = %q", got)
	}
}

// TestBoltReadsSchema1 opens a state.db written by the build before
// schema version 2 (testdata/state-schema1.db.gz: keys a, doc, a deleted
// gone, and g in the global scope written with idempotency key "once"),
// reads it, upgrades it and writes unindexed values into it.
func TestBoltReadsSchema1(t *testing.T) {
	f, err := os.Open("testdata/state-schema1.db.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if v := fileSchemaVersion(t, path); v != 1 {
		t.Fatalf("fixture is at schema version %d; want 1", v)
	}

	// The fixture's idempotency record was written when the fixture was
	// made: keep records long enough that it still counts, whenever the
	// test runs.
	b := mustOpen(t, path, WithIdempotencyRetention(100*365*24*time.Hour))
	s := scope.Session("s")
	if it := read(t, b, s, "a"); it.Revision != 1 || it.Value.GetStringValue() != "schema one aardvark" {
		t.Fatalf("Read a = %v @%d", it.Value, it.Revision)
	}
	if it := read(t, b, s, "doc"); it.Revision != 2 || it.Value.GetStructValue().GetFields()["title"].GetStringValue() != "old format" {
		t.Fatalf("Read doc = %v @%d", it.Value, it.Revision)
	}
	if got := keysOf(listAll(t, b, s, "", 10)); !slices.Equal(got, []string{"a", "doc"}) {
		t.Fatalf("List = %q", got)
	}
	if got := searchKeys(t, b, "aardvark"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Search (index rebuilt from schema-1 records) = %q", got)
	}
	if got := searchKeys(t, b, "badger"); !slices.Equal(got, []string{"doc"}) {
		t.Fatalf("Search = %q", got)
	}
	res, err := b.Write(ctx, scope.Global(), "g", str("global kestrel"), Guard{IdempotencyKey: "once"})
	if err != nil || !res.Replayed || res.Revision != 5 {
		t.Fatalf("idempotent retry of a schema-1 write = %+v, %v", res, err)
	}
	// New writes continue the revisions; unindexed ones in the old file.
	u, err := b.Write(ctx, s, "a", str("schema two aardvark"), Guard{Unindexed: true})
	if err != nil || u.Revision != 6 {
		t.Fatalf("Write = %+v, %v", u, err)
	}
	if got := searchKeys(t, b, "aardvark"); len(got) != 0 {
		t.Fatalf("Search = %q", got)
	}
	mustClose(t, b)
	if v := fileSchemaVersion(t, path); v != schemaVersion {
		t.Fatalf("schema version after open is %d; want %d", v, schemaVersion)
	}

	b = mustOpen(t, path)
	if it := read(t, b, s, "a"); it.Revision != 6 || it.Value.GetStringValue() != "schema two aardvark" {
		t.Fatalf("Read a = %v @%d", it.Value, it.Revision)
	}
	if it := read(t, b, s, "doc"); it.Revision != 2 {
		t.Fatalf("Read doc @%d", it.Revision)
	}
	if got := searchKeys(t, b, "aardvark badger"); !slices.Equal(got, []string{"doc"}) {
		t.Fatalf("Search = %q", got)
	}
}

// fileSchemaVersion reads the schema version of the closed file at path.
func fileSchemaVersion(t *testing.T, path string) uint64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v uint64
	if err := db.View(func(tx *bolt.Tx) error {
		v = readU64(tx.Bucket(bucketMeta).Get(metaSchemaVersion))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRecordEncoding: both record forms decode, and a schema-1 record
// (no flags) is read as indexed.
func TestRecordEncoding(t *testing.T) {
	raw, err := marshalValue.Marshal(str("v"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rec   []byte
		rev   uint64
		flags byte
	}{
		{encodeRecord(7, 0, raw), 7, 0},
		{encodeRecord(1<<40, recordUnindexed, raw), 1 << 40, recordUnindexed},
		{append(u64(3), raw...), 3, 0}, // schema 1
	} {
		rev, flags, got, err := decodeRecord(tc.rec)
		if err != nil || rev != tc.rev || flags != tc.flags || !bytes.Equal(got, raw) {
			t.Fatalf("decodeRecord(%x) = %d, %d, %x, %v", tc.rec, rev, flags, got, err)
		}
	}
	if !bytes.Equal(encodeRecord(3, 0, raw), append(u64(3), raw...)) {
		t.Fatal("an indexed record is not in the schema-1 form")
	}
	if _, _, _, err := decodeRecord(append(u64(3), recordMarker)); err == nil {
		t.Fatal("a record cut after its marker decoded")
	}
}
