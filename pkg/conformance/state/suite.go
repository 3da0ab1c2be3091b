package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// The limits assumed when Target leaves them zero: the defaults of the
// reference service (services/state).
const (
	DefaultMaxKeyBytes   = 4096
	DefaultMaxValueBytes = 1 << 20
)

// Request defaults the contract states (state.proto).
const (
	defaultPageSize    = 100
	maxPageSize        = 1000
	defaultSearchLimit = 10
	maxSearchLimit     = 1000
)

// callTimeout bounds every call the suite makes.
const callTimeout = 30 * time.Second

// Target is a StateService under test.
type Target struct {
	// Conn reaches the server with a credential that may call every
	// StateService method (or with none, when the server has auth off).
	// Required.
	Conn grpc.ClientConnInterface
	// ReadOnly reaches the same store with a credential allowed only
	// Read, List and Search. Nil skips the read-only checks.
	ReadOnly grpc.ClientConnInterface
	// Anonymous reaches the same server with no credential at all, for
	// the UNAUTHENTICATED checks. Nil skips them.
	Anonymous grpc.ClientConnInterface
	// MaxKeyBytes and MaxValueBytes are the limits the server was
	// started with; zero means DefaultMaxKeyBytes / DefaultMaxValueBytes.
	MaxKeyBytes, MaxValueBytes int
	// Embedder is the server's embedder: EmbedderNone, EmbedderTest or
	// EmbedderOther (the Vector group's Embedder check).
	Embedder string
	// RetentionMaxEntries is N when the server enforces the retention
	// rule scope=custom,prefix=retained/,max-entries=N (RetentionPrefix)
	// with a short sweep interval; 0 skips the Retention group.
	RetentionMaxEntries int
}

// suite is the state shared by the checks of one Run.
type suite struct {
	c        statev1.StateServiceClient
	ro       statev1.StateServiceClient // nil without Target.ReadOnly
	anon     statev1.StateServiceClient // nil without Target.Anonymous
	health   healthpb.HealthClient
	maxKey   int
	maxValue int
	// ns starts every scope id and global key of this run, so the suite
	// can run against a server that already holds data (even its own).
	ns  string
	seq atomic.Int64
	// embedder is Target.Embedder.
	embedder string
	// retention is Target.RetentionMaxEntries.
	retention int
}

// group is one area of the contract.
type group struct {
	name string
	run  func(*testing.T, *suite)
}

// Run checks target against the StateService contract, one subtest per
// behaviour. Each check uses its own scopes and keys under a random
// namespace, so Run can be repeated against the same server.
func Run(t *testing.T, target Target) {
	t.Helper()
	if target.Conn == nil {
		t.Fatal("conformance: Target.Conn is nil")
	}
	s := &suite{
		c:         statev1.NewStateServiceClient(target.Conn),
		health:    healthpb.NewHealthClient(target.Conn),
		maxKey:    target.MaxKeyBytes,
		maxValue:  target.MaxValueBytes,
		ns:        "conf" + randomHex(6),
		embedder:  target.Embedder,
		retention: target.RetentionMaxEntries,
	}
	if target.ReadOnly != nil {
		s.ro = statev1.NewStateServiceClient(target.ReadOnly)
	}
	if target.Anonymous != nil {
		s.anon = statev1.NewStateServiceClient(target.Anonymous)
	}
	if s.maxKey == 0 {
		s.maxKey = DefaultMaxKeyBytes
	}
	if s.maxValue == 0 {
		s.maxValue = DefaultMaxValueBytes
	}
	if s.maxKey < 64 || s.maxValue < 4096 {
		t.Fatalf("conformance: limits of %d key bytes and %d value bytes are too small for the suite's keys and values (at least 64 and 4096)", s.maxKey, s.maxValue)
	}
	t.Logf("namespace of this run: %s (limits: key %d bytes, value %d bytes)", s.ns, s.maxKey, s.maxValue)
	groups := []group{
		{"Health", testHealth},
		{"Scopes", testScopes},
		{"Revisions", testRevisions},
		{"Idempotency", testIdempotency},
		{"List", testList},
		{"ListValues", testListValues},
		{"Search", testSearch},
		{"Vector", testVector},
		{"Retention", testRetention},
		{"Limits", testLimits},
		{"InvalidArgument", testInvalidArgument},
		{"Access", testAccess},
		{"Concurrency", testConcurrency},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) { g.run(t, s) })
	}
}

// runAll runs each check as a subtest.
func runAll(t *testing.T, s *suite, checks []group) {
	t.Helper()
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { c.run(t, s) })
	}
}

// id returns a fresh scope id (or global key prefix) of this run.
func (s *suite) id(name string) string {
	return fmt.Sprintf("%s-%s-%d", s.ns, name, s.seq.Add(1))
}

// term returns a fresh word for search checks: lower-case letters only,
// so every tokenizer sees one word, and unlikely in any other document.
func term() string {
	const letters = "bcdfghjkmnpqrstvwxz"
	b := []byte("zq")
	for range 9 {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(letters))))
		if err != nil {
			panic(err)
		}
		b = append(b, letters[n.Int64()])
	}
	return string(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return c
}

func str(v string) *structpb.Value { return structpb.NewStringValue(v) }

func num(v float64) *structpb.Value { return structpb.NewNumberValue(v) }

func jsonValue(t *testing.T, v any) *structpb.Value {
	t.Helper()
	pv, err := structpb.NewValue(v)
	if err != nil {
		t.Fatalf("test value: %v", err)
	}
	return pv
}

func rev(n uint64) *uint64 { return &n }

// show renders a scope and key for messages.
func show(sc *typesv1.Scope, key string) string {
	return fmt.Sprintf("%s key %s", scope.String(sc), quote(key))
}

// quote quotes a key for messages, shortening very long ones.
func quote(key string) string {
	if len(key) > 80 {
		return fmt.Sprintf("%q… (%d bytes)", key[:60], len(key))
	}
	return fmt.Sprintf("%q", key)
}

// wantCode fails t unless err is a status with code want and, when reason
// is not empty, an ErrorInfo (domain errs.Domain) with that reason.
func wantCode(t *testing.T, err error, want codes.Code, reason string) {
	t.Helper()
	if err := checkCode(err, want, reason); err != nil {
		t.Fatal(err)
	}
}

func checkCode(err error, want codes.Code, reason string) error {
	if err == nil {
		return fmt.Errorf("call succeeded; want %v", want)
	}
	st := status.Convert(err)
	if st.Code() != want {
		return fmt.Errorf("got %v %q; want %v", st.Code(), st.Message(), want)
	}
	if reason != "" {
		if got := errs.Reason(err); got != reason {
			return fmt.Errorf("got %v with ErrorInfo reason %q (domain %s); want reason %q", want, got, errs.Domain, reason)
		}
	}
	return nil
}

// write writes unconditionally and returns the new revision.
func (s *suite) write(t *testing.T, sc *typesv1.Scope, key string, v *structpb.Value) uint64 {
	t.Helper()
	res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: key, Value: v})
	if err != nil {
		t.Fatalf("Write(%s): %v", show(sc, key), err)
	}
	if res.GetReplayed() {
		t.Fatalf("Write(%s) without idempotency key: replayed = true", show(sc, key))
	}
	if res.GetRevision() == 0 {
		t.Fatalf("Write(%s): revision 0", show(sc, key))
	}
	return res.GetRevision()
}

// read reads a key that must exist.
func (s *suite) read(t *testing.T, sc *typesv1.Scope, key string) *statev1.ReadResponse {
	t.Helper()
	res, err := s.c.Read(ctx(t), &statev1.ReadRequest{Scope: sc, Key: key})
	if err != nil {
		t.Fatalf("Read(%s): %v", show(sc, key), err)
	}
	return res
}

// wantValue fails t unless key holds v at revision r.
func (s *suite) wantValue(t *testing.T, sc *typesv1.Scope, key string, v *structpb.Value, r uint64) {
	t.Helper()
	got := s.read(t, sc, key)
	if got.GetRevision() != r || !proto.Equal(got.GetValue(), v) {
		t.Fatalf("Read(%s) = %v at revision %d; want %v at revision %d", show(sc, key), got.GetValue(), got.GetRevision(), v, r)
	}
}

// wantMissing fails t unless Read of key is NOT_FOUND.
func (s *suite) wantMissing(t *testing.T, sc *typesv1.Scope, key string) {
	t.Helper()
	_, err := s.c.Read(ctx(t), &statev1.ReadRequest{Scope: sc, Key: key})
	if err := checkCode(err, codes.NotFound, ""); err != nil {
		t.Fatalf("Read(%s) of a missing key: %v", show(sc, key), err)
	}
}

// del deletes a key and returns existed.
func (s *suite) del(t *testing.T, sc *typesv1.Scope, key string) bool {
	t.Helper()
	res, err := s.c.Delete(ctx(t), &statev1.DeleteRequest{Scope: sc, Key: key})
	if err != nil {
		t.Fatalf("Delete(%s): %v", show(sc, key), err)
	}
	return res.GetExisted()
}

// listAll pages through List and checks each page's size.
func (s *suite) listAll(t *testing.T, sc *typesv1.Scope, prefix string, size int32) []*statev1.ListItem {
	t.Helper()
	var all []*statev1.ListItem
	token := ""
	limit := int(size)
	if limit == 0 {
		limit = defaultPageSize
	}
	for pages := 0; ; pages++ {
		if pages > 100000 {
			t.Fatalf("List(%s, prefix %q) does not end", scope.String(sc), prefix)
		}
		res, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, Prefix: prefix, PageSize: size, PageToken: token})
		if err != nil {
			t.Fatalf("List(%s, prefix %q, page %d): %v", scope.String(sc), prefix, pages, err)
		}
		if n := len(res.GetItems()); n > limit {
			t.Fatalf("List(%s) page of %d items; page_size %d", scope.String(sc), n, size)
		}
		all = append(all, res.GetItems()...)
		if res.GetNextPageToken() == "" {
			return all
		}
		token = res.GetNextPageToken()
	}
}

func keysOf(items []*statev1.ListItem) []string {
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = it.GetKey()
	}
	return keys
}

// wantKeys fails t unless got lists exactly want, in byte order.
func wantKeys(t *testing.T, what string, got []*statev1.ListItem, want []string) {
	t.Helper()
	want = slices.Clone(want)
	slices.Sort(want)
	want = slices.Compact(want)
	if g := keysOf(got); !slices.Equal(g, want) {
		t.Fatalf("%s listed %d keys %s; want %d keys %s", what, len(g), quoteAll(g), len(want), quoteAll(want))
	}
}

func quoteAll(keys []string) string {
	out := make([]string, 0, min(len(keys), 20))
	for i, k := range keys {
		if i == 20 {
			out = append(out, fmt.Sprintf("… %d more", len(keys)-20))
			break
		}
		out = append(out, quote(k))
	}
	return "[" + strings.Join(out, " ") + "]"
}

func (s *suite) search(t *testing.T, sc *typesv1.Scope, query string, limit int32) []*statev1.SearchResult {
	t.Helper()
	res, err := s.c.Search(ctx(t), &statev1.SearchRequest{Scope: sc, Query: query, Limit: limit})
	if err != nil {
		t.Fatalf("Search(%s, %q): %v", scope.String(sc), query, err)
	}
	for i := 1; i < len(res.GetResults()); i++ {
		if res.Results[i].GetScore() > res.Results[i-1].GetScore() {
			t.Fatalf("Search(%s, %q): results not best first: score %v after %v", scope.String(sc), query, res.Results[i].GetScore(), res.Results[i-1].GetScore())
		}
	}
	return res.GetResults()
}

func resultKeys(rs []*statev1.SearchResult) []string {
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = r.GetKey()
	}
	return keys
}

// parallel runs fn(0..n-1) on a few goroutines and fails t with the
// first errors.
func parallel(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	const workers = 16
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		fails []error
	)
	next := atomic.Int64{}
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					fails = append(fails, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for i, err := range fails {
		if i == 10 {
			t.Errorf("… and %d more failures", len(fails)-10)
			break
		}
		t.Error(err)
	}
	if len(fails) > 0 {
		t.FailNow()
	}
}
