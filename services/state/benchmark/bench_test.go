//go:build unix

package benchmark

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/benchkit"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/state"
)

// TestMain shares one PostgreSQL server between the runs of the
// service-postgres benchmarks (started on the first testenv.Postgres
// call, if any; a fresh database per run).
func TestMain(m *testing.M) { os.Exit(testenv.PostgresMain(m)) }

// Workload.
const (
	readKeys  = 1000  // keys preloaded for Read
	writeKeys = 10000 // Write cycles over this many keys
	values    = 64    // distinct values, built once
)

// concurrencies are the numbers of goroutines issuing calls at once. They
// are explicit goroutines (not RunParallel, which multiplies by
// GOMAXPROCS), all sharing one client connection or one *bolt.DB.
var concurrencies = []int{1, 64}

var benchScope = scope.Session("bench")

// BenchmarkRead reads preloaded keys through the service (on bbolt, and
// on PostgreSQL as service-postgres), from raw bbolt, and calls the echo
// server, at each concurrency.
func BenchmarkRead(b *testing.B) {
	svc := startService(b)
	raw := openRaw(b)
	echo := startEcho(b)
	vals := makeValues(b)
	reads := make([]*statev1.ReadRequest, readKeys)
	for i := range reads {
		key := fmt.Sprintf("key-%05d", i)
		reads[i] = &statev1.ReadRequest{Scope: benchScope, Key: key}
		if _, err := svc.Write(context.Background(), &statev1.WriteRequest{Scope: benchScope, Key: key, Value: vals.msg[i%values]}); err != nil {
			b.Fatal(err)
		}
		if err := raw.Update(func(tx *bolt.Tx) error { return tx.Bucket(rawBucket).Put([]byte(key), vals.raw[i%values]) }); err != nil {
			b.Fatal(err)
		}
	}
	ping := &healthpb.HealthCheckRequest{}
	settle(b) // let bleve finish merging the preload's segments

	readWith := func(svc statev1.StateServiceClient) func(b *testing.B, conc int) {
		return func(b *testing.B, conc int) {
			measure(b, conc, func(i int) error {
				_, err := svc.Read(context.Background(), reads[i%readKeys])
				return err
			})
		}
	}
	forEachConc(b, "service", readWith(svc))
	b.Run("service-postgres", func(b *testing.B) {
		pg := startPostgresService(b) // skips without PostgreSQL
		for i, r := range reads {
			if _, err := pg.Write(context.Background(), &statev1.WriteRequest{Scope: benchScope, Key: r.GetKey(), Value: vals.msg[i%values]}); err != nil {
				b.Fatal(err)
			}
		}
		eachConc(b, readWith(pg))
	})
	forEachConc(b, "bolt", func(b *testing.B, conc int) {
		measure(b, conc, func(i int) error {
			key := []byte(reads[i%readKeys].GetKey())
			return raw.View(func(tx *bolt.Tx) error {
				v := tx.Bucket(rawBucket).Get(key)
				if v == nil {
					return fmt.Errorf("key %s missing", key)
				}
				_ = slices.Clone(v) // copy out, as the service does
				return nil
			})
		})
	})
	forEachConc(b, "echo", func(b *testing.B, conc int) {
		measure(b, conc, func(int) error {
			_, err := echo.Check(context.Background(), ping)
			return err
		})
	})
}

// BenchmarkWrite overwrites keys through the service (on bbolt, and on
// PostgreSQL as service-postgres) and in raw bbolt (one Update per write,
// and bbolt's own Batch), at each concurrency. The bbolt ones are durable:
// every acknowledged write is fsynced. The PostgreSQL test server is not
// (testenv runs it with fsync and synchronous_commit off).
//
// service writes full-text indexed values (what agents' memory writes
// are); service-unindexed writes the same values with
// WriteRequest.unindexed, to keys of their own (what conversation history
// is). Each target starts once the process is idle again, so background
// index work left by one is not measured as part of the next.
func BenchmarkWrite(b *testing.B) {
	svc := startService(b)
	raw := openRaw(b)
	vals := makeValues(b)
	writes := make([]*statev1.WriteRequest, writeKeys)
	unindexed := make([]*statev1.WriteRequest, writeKeys)
	for i := range writes {
		writes[i] = &statev1.WriteRequest{Scope: benchScope, Key: fmt.Sprintf("key-%05d", i), Value: vals.msg[i%values]}
		unindexed[i] = &statev1.WriteRequest{Scope: benchScope, Key: fmt.Sprintf("history-%05d", i), Value: vals.msg[i%values], Unindexed: true}
	}
	var next atomic.Int64 // the key to write next, shared by every run

	writeWith := func(svc statev1.StateServiceClient, reqs []*statev1.WriteRequest) func(b *testing.B, conc int) {
		return func(b *testing.B, conc int) {
			measure(b, conc, func(int) error {
				_, err := svc.Write(context.Background(), reqs[next.Add(1)%writeKeys])
				return err
			})
		}
	}
	forEachConc(b, "service-unindexed", writeWith(svc, unindexed))
	forEachConc(b, "service", writeWith(svc, writes))
	b.Run("service-postgres", func(b *testing.B) {
		eachConc(b, writeWith(startPostgresService(b), writes)) // skips without PostgreSQL
	})
	rawPut := func(i int64) func(tx *bolt.Tx) error {
		return func(tx *bolt.Tx) error {
			return tx.Bucket(rawBucket).Put([]byte(writes[i%writeKeys].GetKey()), vals.raw[i%values])
		}
	}
	forEachConc(b, "bolt", func(b *testing.B, conc int) {
		measure(b, conc, func(int) error { return raw.Update(rawPut(next.Add(1))) })
	})
	forEachConc(b, "boltbatch", func(b *testing.B, conc int) {
		measure(b, conc, func(int) error { return raw.Batch(rawPut(next.Add(1))) })
	})
}

// forEachConc runs fn as target/conc=N for each concurrency.
func forEachConc(b *testing.B, target string, fn func(b *testing.B, conc int)) {
	b.Run(target, func(b *testing.B) { eachConc(b, fn) })
}

// eachConc runs fn as conc=N under b for each concurrency, each once the
// process is idle (settle).
func eachConc(b *testing.B, fn func(b *testing.B, conc int)) {
	for _, conc := range concurrencies {
		settle(b)
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) { fn(b, conc) })
	}
}

// measure runs op b.N times split over conc goroutines (call i of
// goroutine w is op(w + i*conc)) and reports throughput, the 50th and
// 99th percentile latency, and the CPU time of the process (client and
// server, user and system) per call, which other load on the machine
// changes less than throughput.
func measure(b *testing.B, conc int, op func(i int) error) {
	r := benchkit.Concurrent(b, conc, func(w, i int) error { return op(w + i*conc) })
	r.Report(b, "ops/s")
	b.ReportMetric(benchkit.Micros(r.CPU)/float64(max(len(r.Latencies), 1)), "cpu-us/op")
}

// benchValues are the values written, as messages and as the bytes raw
// bbolt stores (the same proto encoding the service stores).
type benchValues struct {
	msg []*structpb.Value
	raw [][]byte
}

func makeValues(b *testing.B) benchValues {
	var v benchValues
	for i := range values {
		msg, err := structpb.NewValue(map[string]any{
			"title": fmt.Sprintf("note %d", i),
			"text":  fmt.Sprintf("benchmark note %d: the agent read the quarterly report and filed a summary for review", i),
			"tags":  []any{"bench", "state"},
		})
		if err != nil {
			b.Fatal(err)
		}
		raw, err := proto.Marshal(msg)
		if err != nil {
			b.Fatal(err)
		}
		v.msg, v.raw = append(v.msg, msg), append(v.raw, raw)
	}
	return v
}

// startService serves the real StateService on a bbolt file, on loopback
// TCP, through state.Run as cmd/state starts it (the standard chain of
// pkg/grpcserver in dev mode: call log, errmap, recovery, protovalidate;
// then the audit interceptor), logging JSON at info level (to io.Discard,
// so the cost of formatting is in, the terminal's is not).
func startService(b *testing.B) statev1.StateServiceClient {
	b.Helper()
	return serve(b, state.Config{Backend: state.BackendBolt, DataDir: b.TempDir()})
}

// startPostgresService is startService on the PostgreSQL backend, on a
// fresh database of the server testenv.Postgres runs (PostgreSQL from
// the Debian packages, over loopback TCP, fsync off). It skips b when
// PostgreSQL cannot start here. The pool is pgxpool's default, as the
// binary's with a DSN that sets no pool_max_conns.
func startPostgresService(b *testing.B) statev1.StateServiceClient {
	b.Helper()
	return serve(b, state.Config{Backend: state.BackendPostgres, PostgresDSN: testenv.Postgres(b)})
}

// serve runs state.Run with cfg (dev mode, the binary's logger) until b
// ends and returns a client of it.
func serve(b *testing.B, cfg state.Config) statev1.StateServiceClient {
	b.Helper()
	log, err := logging.New(io.Discard, logging.Options{Level: "info", Format: "json", Service: "state"})
	if err != nil {
		b.Fatal(err)
	}
	addr := harness.Serve(b, func(ctx context.Context, lis net.Listener) error {
		cfg.Server = grpcserver.Config{Name: "state", Dev: true}
		cfg.Log, cfg.Listener = log, lis
		return state.Run(ctx, cfg)
	})
	return statev1.NewStateServiceClient(harness.Dial(b, addr))
}

// startEcho serves a bare grpc-go server (no options, no interceptors)
// with only the standard health service, on loopback TCP.
func startEcho(b *testing.B) healthpb.HealthClient {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	b.Cleanup(func() {
		gs.Stop()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	// One plain client connection (harness.Dial), as for the service,
	// so the comparison is of the servers.
	c := healthpb.NewHealthClient(harness.Dial(b, lis.Addr().String()))
	if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		b.Fatal(err)
	}
	return c
}

// settle waits (at most 30s) until this process is nearly idle: after a
// preload, bleve merges index segments in the background for a while,
// and on 2 cores that would be measured as part of whatever runs next.
func settle(b *testing.B) {
	b.Helper()
	const window = 200 * time.Millisecond
	deadline := time.Now().Add(30 * time.Second)
	for {
		before := benchkit.CPUTime(b)
		time.Sleep(window)
		busy := benchkit.CPUTime(b) - before
		if busy < window/10 {
			return
		}
		if time.Now().After(deadline) {
			b.Logf("process still busy (%v CPU per %v) after 30s; measuring anyway", busy, window)
			return
		}
	}
}

var rawBucket = []byte("kv")

// openRaw opens a bbolt file with one bucket, with the options the
// service uses (defaults plus a lock timeout: fsync on every commit).
func openRaw(b *testing.B) *bolt.DB {
	b.Helper()
	db, err := bolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(rawBucket)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	return db
}
