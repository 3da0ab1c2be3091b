package state

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/secbear/neuron/internal/boltdamage"
	"github.com/secbear/neuron/pkg/boltcheck"
	"github.com/secbear/neuron/pkg/scope"
)

// writeStore writes a state.db of a few dozen pages and closes it.
func writeStore(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	b := mustOpen(t, path)
	for i := range 30 {
		v := structpb.NewStringValue(strings.Repeat(fmt.Sprintf("value %d ", i), 300))
		if _, err := b.Write(ctx, scope.Session("s"), fmt.Sprintf("k%03d", i), v, Guard{}); err != nil {
			t.Fatal(err)
		}
	}
	mustClose(t, b)
	return path
}

// A damaged file is refused by OpenBolt with boltcheck's error, before
// bbolt maps it (the binary's test, cmd/state/damage_test.go, shows what
// bbolt does otherwise).
func TestOpenBoltRefusesDamage(t *testing.T) {
	path := writeStore(t)
	l := boltdamage.Inspect(t, path)
	for _, c := range []struct {
		name   string
		damage func(p string)
	}{
		{"cut into the pages in use", func(p string) { boltdamage.Truncate(t, p, int64((l.LastInUse()-1)*l.PageSize)) }},
		{"garbage leaf page", func(p string) { boltdamage.GarbagePage(t, p, l, l.Last(t, "leaf")) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := boltdamage.CopyDir(t, filepath.Dir(path))
			p := filepath.Join(dir, "state.db")
			c.damage(p)
			_, err := OpenBolt(p)
			if !errors.Is(err, boltcheck.ErrDamaged) || !strings.HasPrefix(err.Error(), "open state database "+p+": "+p+" is damaged: ") {
				t.Fatalf("OpenBolt = %v, want boltcheck.ErrDamaged naming the file", err)
			}
		})
	}
}

// One zeroed meta page opens, at the older transaction, with an ERROR
// naming the file and both transactions on the store's logger.
func TestOpenBoltMetaFallback(t *testing.T) {
	path := writeStore(t)
	l := boltdamage.Inspect(t, path)
	boltdamage.ZeroPage(t, path, l, l.NewerMeta())
	var logged bytes.Buffer
	b := mustOpen(t, path, WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
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
	if _, err := b.Write(ctx, scope.Session("s"), "after", structpb.NewBoolValue(true), Guard{}); err != nil {
		t.Fatalf("Write after the fallback: %v", err)
	}
	mustClose(t, b)
	// The commits since rewrote the damaged page: the next start is clean.
	if r, err := boltcheck.Check(path, time.Second); err != nil || r.Fallback != nil {
		t.Fatalf("after a start and a write: %+v, %v; want both meta pages valid", r, err)
	}
}

// The check waits for the lock like bbolt: a file held by another
// process is still ErrLocked, not damage.
func TestOpenBoltLockedNotDamaged(t *testing.T) {
	path := writeStore(t)
	mustOpen(t, path)
	if _, err := OpenBolt(path, WithLockTimeout(100*time.Millisecond)); !errors.Is(err, ErrLocked) {
		t.Fatalf("OpenBolt of a held file = %v, want ErrLocked", err)
	}
}
