package boltcheck

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

var benchMB = flag.Int("boltcheck.mb", 32, "size of the file BenchmarkCheck checks, in MB")

// BenchmarkCheck checks a healthy file of -boltcheck.mb megabytes (one
// bucket of random keys and a bucket per 1000 "workflows", like the
// services' files) with the page cache warm, which is what a restart
// pays, and runs bbolt's own tx.Check on it for comparison. On Linux,
// BenchmarkCheckCold drops the file from the page cache first.
//
//	go test -run '^$' -bench Check -benchtime 5x ./pkg/boltcheck/ -args -boltcheck.mb=200
func BenchmarkCheck(b *testing.B) {
	path := bigDB(b)
	b.Run("boltcheck", func(b *testing.B) { benchCheck(b, path, nil) })
	b.Run("bbolt-tx.Check", func(b *testing.B) {
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true})
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		for range b.N {
			err := db.View(func(tx *bolt.Tx) error {
				for err := range tx.Check() {
					return err
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchCheck times Check of path, running before (if set) untimed
// before each.
func benchCheck(b *testing.B, path string, before func()) {
	var (
		r   Report
		err error
	)
	for range b.N {
		if before != nil {
			b.StopTimer()
			before()
			b.StartTimer()
		}
		if r, err = Check(path, time.Second); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(r.Size)/(1<<20), "MB")
	b.ReportMetric(float64(r.Pages), "pages")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bigPath != "" {
		_ = os.RemoveAll(filepath.Dir(bigPath))
	}
	os.Exit(code)
}

// bigDB writes the file of BenchmarkCheck, once per test binary.
func bigDB(b *testing.B) string {
	bigOnce.Do(func() { bigPath, bigErr = writeBigDB(*benchMB) })
	if bigErr != nil {
		b.Fatal(bigErr)
	}
	return bigPath
}

var (
	bigOnce sync.Once
	bigPath string
	bigErr  error
)

func writeBigDB(mb int) (string, error) {
	dir, err := os.MkdirTemp("", "boltcheck-bench")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "big.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true, NoFreelistSync: true})
	if err != nil {
		return "", err
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for n := 0; ; n++ {
		if fi, err := os.Stat(path); err != nil {
			return "", err
		} else if fi.Size() >= int64(mb)<<20 {
			break
		}
		err := db.Update(func(tx *bolt.Tx) error {
			kv, err := tx.CreateBucketIfNotExists([]byte("kv"))
			if err != nil {
				return err
			}
			wf, err := tx.CreateBucketIfNotExists([]byte("workflows"))
			if err != nil {
				return err
			}
			sub, err := wf.CreateBucket(fmt.Appendf(nil, "wf-%08d", n))
			if err != nil {
				return err
			}
			for i := range 1000 {
				k := binary.BigEndian.AppendUint64(nil, rng.Uint64())
				if err := kv.Put(k, make([]byte, 50+rng.IntN(400))); err != nil {
					return err
				}
				if err := sub.Put(binary.BigEndian.AppendUint64(nil, uint64(i)), make([]byte, 50+rng.IntN(200))); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	return path, db.Close()
}
