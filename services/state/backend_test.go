package state

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// opener opens a fresh, empty backend of one kind for a test.
type opener func(t *testing.T, opts ...Option) Backend

func openMemory(t *testing.T, opts ...Option) Backend {
	m := NewMemory(opts...)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func openBoltTemp(t *testing.T, opts ...Option) Backend {
	b, err := OpenBolt(t.TempDir()+"/state.db", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

var backends = []struct {
	name string
	open opener
}{
	{"memory", openMemory},
	{"bolt", openBoltTemp},
	{"postgres", openPostgres}, // skips without PostgreSQL
}

// TestBackends runs the shared behaviour suite against every backend.
func TestBackends(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range backendSuite {
				t.Run(tc.name, func(t *testing.T) { tc.run(t, b.open) })
			}
		})
	}
}

// backendSuite is the behaviour every backend shares.
var backendSuite = []struct {
	name string
	run  func(*testing.T, opener)
}{
	{"ScopeIsolation", testScopeIsolation},
	{"Revisions", testRevisions},
	{"ExpectedRevision", testExpectedRevision},
	{"Delete", testDelete},
	{"ListPaging", testListPaging},
	{"PageTokens", testPageTokens},
	{"Limits", testLimits},
	{"InvalidArguments", testInvalidArguments},
	{"Idempotency", testIdempotency},
	{"IdempotencyRetention", testIdempotencyRetention},
	{"SearchRanking", testSearchRanking},
	{"SearchSnippets", testSearchSnippets},
	{"SearchFollowsWrites", testSearchFollowsWrites},
	{"Unindexed", testUnindexed},
	{"UnindexedIdempotency", testUnindexedIdempotency},
	{"ConcurrentWriters", testConcurrentWriters},
	{"SearchSeesAcknowledgedWrites", testSearchSeesAcknowledgedWrites},
	{"Closed", testClosed},
}

var ctx = context.Background()

func str(s string) *structpb.Value { return structpb.NewStringValue(s) }

func mustValue(t *testing.T, v any) *structpb.Value {
	t.Helper()
	pv, err := structpb.NewValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

func rev(n uint64) *uint64 { return &n }

// wantCode fails unless err has the gRPC code want (and, when given, a
// message containing msg).
func wantCode(t *testing.T, err error, want codes.Code, msg string) {
	t.Helper()
	if got := errs.Code(err); got != want {
		t.Fatalf("error %v has code %v; want %v", err, got, want)
	}
	if msg != "" && !strings.Contains(err.Error(), msg) {
		t.Fatalf("error %q does not contain %q", err, msg)
	}
}

func write(t *testing.T, b Backend, s *typesv1.Scope, key string, v *structpb.Value) uint64 {
	t.Helper()
	res, err := b.Write(ctx, s, key, v, Guard{})
	if err != nil {
		t.Fatalf("Write(%s, %q): %v", scope.String(s), key, err)
	}
	return res.Revision
}

func read(t *testing.T, b Backend, s *typesv1.Scope, key string) Item {
	t.Helper()
	it, err := b.Read(ctx, s, key)
	if err != nil {
		t.Fatalf("Read(%s, %q): %v", scope.String(s), key, err)
	}
	return it
}

func listAll(t *testing.T, b Backend, s *typesv1.Scope, prefix string, size int) []ListItem {
	t.Helper()
	var all []ListItem
	token := ""
	for {
		page, err := b.List(ctx, s, prefix, token, size)
		if err != nil {
			t.Fatalf("List(%s, %q): %v", scope.String(s), prefix, err)
		}
		if len(page.Items) > size {
			t.Fatalf("page of %d items; size %d", len(page.Items), size)
		}
		all = append(all, page.Items...)
		if page.NextPageToken == "" {
			return all
		}
		token = page.NextPageToken
	}
}

func keysOf(items []ListItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.Key
	}
	return out
}

// nastyKeys are keys that break naive path or prefix schemes.
var nastyKeys = []string{
	"k", "..", "../..", "../k", "/", "/k", "k/", "a/b/../c", "\x00", "k\x00",
	"\x00k", "\x01", "\x01\x01a", "\x04", "日本語", "🙂", "e\u0301", " ", "%2e%2e",
	strings.Repeat("x", DefaultMaxKeyBytes), strings.Repeat("/", 300),
}

// nastyScopes are scopes whose encodings or ids resemble each other.
var nastyScopes = []*typesv1.Scope{
	scope.Session("a"), scope.Session("ab"), scope.Session("a\x01b"), scope.Session("a/b"),
	scope.Session("a\x00"), scope.Workflow("a"), scope.Agent("a", "b"), scope.Agent("a/b", "c"),
	scope.Agent("a", "b/c"), scope.Global(), scope.Custom("a"), scope.Custom(".."),
	scope.Custom("日本"), scope.Session(strings.Repeat("z", scope.MaxIDLen)),
}

func testScopeIsolation(t *testing.T, open opener) {
	b := open(t)
	revs := map[string]uint64{}
	for i, s := range nastyScopes {
		for j, k := range nastyKeys {
			revs[fmt.Sprint(i, "/", j)] = write(t, b, s, k, str(fmt.Sprintf("scope %d key %d isolation", i, j)))
		}
	}
	want := slices.Sorted(slices.Values(nastyKeys))
	for i, s := range nastyScopes {
		for j, k := range nastyKeys {
			it := read(t, b, s, k)
			if it.Value.GetStringValue() != fmt.Sprintf("scope %d key %d isolation", i, j) || it.Revision != revs[fmt.Sprint(i, "/", j)] {
				t.Fatalf("Read(%s, %q) = %v @%d: another scope's value", scope.String(s), k, it.Value, it.Revision)
			}
		}
		if got := keysOf(listAll(t, b, s, "", 7)); !slices.Equal(got, want) {
			t.Fatalf("List(%s) = %q; want %q", scope.String(s), got, want)
		}
		hits, err := b.Search(ctx, s, "isolation", MaxSearchLimit)
		if err != nil {
			t.Fatal(err)
		}
		if len(hits) != len(nastyKeys) {
			t.Fatalf("Search(%s) found %d; want %d", scope.String(s), len(hits), len(nastyKeys))
		}
		for _, h := range hits {
			if !strings.HasPrefix(h.Snippet, fmt.Sprintf("scope %d ", i)) {
				t.Fatalf("Search(%s) returned %q from another scope", scope.String(s), h.Snippet)
			}
		}
	}
	// Deleting in one scope leaves the others alone.
	for _, k := range nastyKeys {
		if _, err := b.Delete(ctx, nastyScopes[0], k, Guard{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := listAll(t, b, nastyScopes[0], "", 100); len(got) != 0 {
		t.Fatalf("after delete, List = %v", got)
	}
	for _, s := range nastyScopes[1:] {
		if got := listAll(t, b, s, "", 100); len(got) != len(nastyKeys) {
			t.Fatalf("List(%s) has %d keys after deletes in another scope", scope.String(s), len(got))
		}
	}
	// A prefix that contains a scope-like byte sequence finds nothing
	// outside the scope.
	if got := listAll(t, b, scope.Session("a"), "\x01b", 100); len(got) != 0 {
		t.Fatalf("prefix escape: %v", got)
	}
}

func testRevisions(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	r1 := write(t, b, s, "k", str("one"))
	if r1 == 0 {
		t.Fatal("revision 0")
	}
	r2 := write(t, b, s, "k", str("two"))
	if r2 <= r1 {
		t.Fatalf("revision went %d -> %d", r1, r2)
	}
	if it := read(t, b, s, "k"); it.Revision != r2 || it.Value.GetStringValue() != "two" {
		t.Fatalf("Read = %v @%d", it.Value, it.Revision)
	}
	if _, err := b.Delete(ctx, s, "k", Guard{}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Read(ctx, s, "k")
	wantCode(t, err, codes.NotFound, `key "k" in session:"s"`)
	r3 := write(t, b, s, "k", str("three"))
	if r3 <= r2 {
		t.Fatalf("revision reused after delete: %d -> %d", r2, r3)
	}
	// Values round-trip exactly.
	v := mustValue(t, map[string]any{"n": 1.5, "b": true, "z": nil, "l": []any{"x", 2.0, map[string]any{}}, "s": "\x00日本"})
	rv := write(t, b, s, "json", v)
	if it := read(t, b, s, "json"); !proto.Equal(it.Value, v) || it.Revision != rv {
		t.Fatalf("Read = %v; want %v", it.Value, v)
	}
}

func testExpectedRevision(t *testing.T, open opener) {
	b := open(t)
	s := scope.Workflow("wf")
	// Must not exist: succeeds once, then is stale.
	res, err := b.Write(ctx, s, "k", str("v1"), Guard{ExpectedRevision: rev(0)})
	if err != nil {
		t.Fatal(err)
	}
	r1 := res.Revision
	_, err = b.Write(ctx, s, "k", str("v2"), Guard{ExpectedRevision: rev(0)})
	wantCode(t, err, codes.FailedPrecondition, "expected it not to exist")
	if errs.Reason(err) != errs.ReasonStaleRevision {
		t.Fatalf("reason %q", errs.Reason(err))
	}
	// Stale: nothing changes.
	_, err = b.Write(ctx, s, "k", str("v2"), Guard{ExpectedRevision: rev(r1 + 100)})
	wantCode(t, err, codes.FailedPrecondition, fmt.Sprintf("is at revision %d; expected %d", r1, r1+100))
	if it := read(t, b, s, "k"); it.Value.GetStringValue() != "v1" || it.Revision != r1 {
		t.Fatalf("stale write changed the value: %v @%d", it.Value, it.Revision)
	}
	// Current: applies.
	res, err = b.Write(ctx, s, "k", str("v2"), Guard{ExpectedRevision: rev(r1)})
	if err != nil || res.Revision <= r1 {
		t.Fatalf("Write = %+v, %v", res, err)
	}
	// Expected on a missing key is stale.
	_, err = b.Write(ctx, s, "missing", str("x"), Guard{ExpectedRevision: rev(5)})
	wantCode(t, err, codes.FailedPrecondition, "does not exist; expected revision 5")
	// Stale delete changes nothing.
	_, err = b.Delete(ctx, s, "k", Guard{ExpectedRevision: rev(r1)})
	wantCode(t, err, codes.FailedPrecondition, "")
	read(t, b, s, "k")
	d, err := b.Delete(ctx, s, "k", Guard{ExpectedRevision: rev(res.Revision)})
	if err != nil || !d.Existed {
		t.Fatalf("Delete = %+v, %v", d, err)
	}
	// Delete of a missing key that must not exist is a no-op; expecting a
	// revision of it is stale.
	if d, err := b.Delete(ctx, s, "k", Guard{ExpectedRevision: rev(0)}); err != nil || d.Existed {
		t.Fatalf("Delete = %+v, %v", d, err)
	}
	_, err = b.Delete(ctx, s, "k", Guard{ExpectedRevision: rev(res.Revision)})
	wantCode(t, err, codes.FailedPrecondition, "")
}

func testDelete(t *testing.T, open opener) {
	b := open(t)
	s := scope.Global()
	d, err := b.Delete(ctx, s, "never", Guard{})
	if err != nil || d.Existed || d.Replayed {
		t.Fatalf("Delete missing = %+v, %v", d, err)
	}
	write(t, b, s, "k", str("v"))
	if d, err := b.Delete(ctx, s, "k", Guard{}); err != nil || !d.Existed {
		t.Fatalf("Delete = %+v, %v", d, err)
	}
	if d, err := b.Delete(ctx, s, "k", Guard{}); err != nil || d.Existed {
		t.Fatalf("second Delete = %+v, %v", d, err)
	}
	if got := listAll(t, b, s, "", 10); len(got) != 0 {
		t.Fatalf("List after delete = %v", got)
	}
}

func testListPaging(t *testing.T, open opener) {
	b := open(t)
	s := scope.Agent("wf", "agent")
	var want []string
	for i := range 25 {
		k := fmt.Sprintf("p/%02d", i)
		write(t, b, s, k, str(k))
		want = append(want, k)
	}
	for _, k := range []string{"o", "p", "q/1", "p0", "\xc3\xa9"} {
		write(t, b, s, k, str(k))
	}
	got := listAll(t, b, s, "p/", 10)
	if !slices.Equal(keysOf(got), want) {
		t.Fatalf("List = %q; want %q", keysOf(got), want)
	}
	for _, it := range got {
		if it.Revision == 0 {
			t.Fatal("List item without revision")
		}
	}
	all := keysOf(listAll(t, b, s, "", 3))
	if !slices.IsSorted(all) || len(all) != 30 {
		t.Fatalf("List all = %q", all)
	}
	// Exactly one full page has no next token.
	page, err := b.List(ctx, s, "p/", "", 25)
	if err != nil || len(page.Items) != 25 || page.NextPageToken != "" {
		t.Fatalf("List = %d items, token %q, %v", len(page.Items), page.NextPageToken, err)
	}

	// Stability: keys added and removed between pages neither duplicate
	// nor hide keys that exist throughout.
	page, err = b.List(ctx, s, "p/", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	write(t, b, s, "p/00a", str("before the cursor"))
	write(t, b, s, "p/15a", str("after the cursor"))
	if _, err := b.Delete(ctx, s, "p/10", Guard{}); err != nil {
		t.Fatal(err)
	}
	seen := keysOf(page.Items)
	for page.NextPageToken != "" {
		page, err = b.List(ctx, s, "p/", page.NextPageToken, 10)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, keysOf(page.Items)...)
	}
	if !slices.IsSorted(seen) || slices.Contains(seen, "p/00a") || !slices.Contains(seen, "p/15a") || slices.Contains(seen, "p/10") || len(seen) != 25 {
		t.Fatalf("paging under change = %q", seen)
	}
}

func testPageTokens(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	for i := range 5 {
		write(t, b, s, fmt.Sprint("k", i), str("v"))
	}
	page, err := b.List(ctx, s, "k", "", 2)
	if err != nil || page.NextPageToken == "" {
		t.Fatalf("List = %+v, %v", page, err)
	}
	tok := page.NextPageToken
	flip := func(i int) string {
		r := []byte(tok)
		if r[i] == 'A' {
			r[i] = 'B'
		} else {
			r[i] = 'A'
		}
		return string(r)
	}
	other := open(t)
	for i := range 5 {
		write(t, other, s, fmt.Sprint("k", i), str("v"))
	}
	otherPage, err := other.List(ctx, s, "k", "", 2)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		scope  *typesv1.Scope
		prefix string
		token  string
		msg    string
	}{
		{"not base64", s, "k", "!!!", "malformed"},
		{"too short", s, "k", "AAAA", "malformed"},
		{"flipped first byte", s, "k", flip(0), ""},
		{"flipped middle byte", s, "k", flip(len(tok) / 2), ""},
		{"flipped last byte", s, "k", flip(len(tok) - 1), ""},
		{"truncated", s, "k", tok[:len(tok)-4], ""},
		{"other scope", scope.Session("t"), "k", tok, "different scope or prefix"},
		{"other prefix", s, "k1", tok, "different scope or prefix"},
		{"other store", s, "k", otherPage.NextPageToken, "not issued by this server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.List(ctx, tt.scope, tt.prefix, tt.token, 2)
			wantCode(t, err, codes.InvalidArgument, tt.msg)
		})
	}
	for _, size := range []int{0, -1, MaxPageSize + 1} {
		_, err := b.List(ctx, s, "", "", size)
		wantCode(t, err, codes.InvalidArgument, "page_size")
	}
	// The genuine token still works.
	if next, err := b.List(ctx, s, "k", tok, 2); err != nil || len(next.Items) != 2 || next.Items[0].Key != "k2" {
		t.Fatalf("List(next) = %+v, %v", next, err)
	}
}

func testLimits(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	_, err := b.Write(ctx, s, strings.Repeat("k", 5000), str("v"), Guard{})
	wantCode(t, err, codes.InvalidArgument, "key is 5000 bytes; the limit is 4096 (--max-key-bytes)")
	_, err = b.Read(ctx, s, strings.Repeat("k", 5000))
	wantCode(t, err, codes.InvalidArgument, "the limit is 4096")
	_, err = b.Delete(ctx, s, strings.Repeat("k", 5000), Guard{})
	wantCode(t, err, codes.InvalidArgument, "the limit is 4096")
	write(t, b, s, strings.Repeat("k", 4096), str("at the limit"))

	big := str(strings.Repeat("x", DefaultMaxValueBytes)) // + 2 quotes
	_, err = b.Write(ctx, s, "big", big, Guard{})
	wantCode(t, err, codes.ResourceExhausted, "value is 1048578 bytes as JSON; the limit is 1048576 (--max-value-bytes)")
	if errs.Reason(err) != errs.ReasonLimitExceeded {
		t.Fatalf("reason %q", errs.Reason(err))
	}
	write(t, b, s, "fits", str(strings.Repeat("<", DefaultMaxValueBytes-2))) // no HTML escaping counted

	small := open(t, WithLimits(Limits{MaxKeyBytes: 8, MaxValueBytes: 20}))
	_, err = small.Write(ctx, s, "123456789", str("v"), Guard{})
	wantCode(t, err, codes.InvalidArgument, "key is 9 bytes; the limit is 8 (--max-key-bytes)")
	_, err = small.Write(ctx, s, "k", mustValue(t, map[string]any{"a": "0123456789012345"}), Guard{})
	wantCode(t, err, codes.ResourceExhausted, "value is 24 bytes as JSON; the limit is 20")
	write(t, small, s, "12345678", str("ok"))
}

func testInvalidArguments(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	nested := &structpb.Value{Kind: &structpb.Value_ListValue{ListValue: &structpb.ListValue{Values: []*structpb.Value{{}}}}}
	tests := []struct {
		name string
		call func() error
		msg  string
	}{
		{"nil scope", func() error { _, err := b.Read(ctx, nil, "k"); return err }, "scope is required"},
		{"empty scope", func() error { _, err := b.Write(ctx, &typesv1.Scope{}, "k", str("v"), Guard{}); return err }, "no kind set"},
		{"empty session id", func() error { _, err := b.List(ctx, scope.Session(""), "", "", 1); return err }, "session_id is empty"},
		{"empty key", func() error { _, err := b.Read(ctx, s, ""); return err }, "key is empty"},
		{"invalid utf8 key", func() error { _, err := b.Write(ctx, s, "\xff", str("v"), Guard{}); return err }, "UTF-8"},
		{"nil value", func() error { _, err := b.Write(ctx, s, "k", nil, Guard{}); return err }, "value is required"},
		{"value without kind", func() error { _, err := b.Write(ctx, s, "k", &structpb.Value{}, Guard{}); return err }, "no kind set"},
		{"nested value without kind", func() error { _, err := b.Write(ctx, s, "k", nested, Guard{}); return err }, "no kind set"},
		{"NaN", func() error { _, err := b.Write(ctx, s, "k", structpb.NewNumberValue(nan()), Guard{}); return err }, "JSON cannot represent"},
		{"long idempotency key", func() error {
			_, err := b.Write(ctx, s, "k", str("v"), Guard{IdempotencyKey: strings.Repeat("i", 513)})
			return err
		}, "idempotency_key is 513 characters; the limit is 512"},
		{"empty query", func() error { _, err := b.Search(ctx, s, "", 1); return err }, "query is empty"},
		{"zero limit", func() error { _, err := b.Search(ctx, s, "q", 0); return err }, "limit is 0"},
		{"huge limit", func() error { _, err := b.Search(ctx, s, "q", MaxSearchLimit+1); return err }, "limit is 1001"},
		{"search nil scope", func() error { _, err := b.Search(ctx, nil, "q", 1); return err }, "scope is required"},
		{"delete nil scope", func() error { _, err := b.Delete(ctx, nil, "k", Guard{}); return err }, "scope is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCode(t, tt.call(), codes.InvalidArgument, tt.msg)
		})
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := b.Write(canceled, s, "k", str("v"), Guard{})
	wantCode(t, err, codes.Canceled, "")
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

func testIdempotency(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	g := Guard{IdempotencyKey: "effect-1"}
	first, err := b.Write(ctx, s, "k", str("v1"), g)
	if err != nil || first.Replayed {
		t.Fatalf("Write = %+v, %v", first, err)
	}
	again, err := b.Write(ctx, s, "k", str("v1"), g)
	if err != nil || !again.Replayed || again.Revision != first.Revision {
		t.Fatalf("retry = %+v, %v; want revision %d replayed", again, err, first.Revision)
	}
	// The retry applied nothing, even after the key moved on.
	later := write(t, b, s, "k", str("v2"))
	again, err = b.Write(ctx, s, "k", str("v1"), g)
	if err != nil || !again.Replayed || again.Revision != first.Revision {
		t.Fatalf("late retry = %+v, %v", again, err)
	}
	if it := read(t, b, s, "k"); it.Revision != later || it.Value.GetStringValue() != "v2" {
		t.Fatalf("retry was applied: %v @%d", it.Value, it.Revision)
	}
	// The same idempotency key for another key or operation is refused.
	_, err = b.Write(ctx, s, "other", str("v"), g)
	wantCode(t, err, codes.InvalidArgument, "different operation or key")
	_, err = b.Delete(ctx, s, "k", g)
	wantCode(t, err, codes.InvalidArgument, "different operation or key")
	// Scopes have separate idempotency keys.
	res, err := b.Write(ctx, scope.Session("t"), "k", str("v"), g)
	if err != nil || res.Replayed {
		t.Fatalf("other scope = %+v, %v", res, err)
	}
	// A failed attempt records nothing: its retry is evaluated afresh.
	gs := Guard{IdempotencyKey: "cas", ExpectedRevision: rev(1 << 40)}
	_, err = b.Write(ctx, s, "k", str("v3"), gs)
	wantCode(t, err, codes.FailedPrecondition, "")
	gs.ExpectedRevision = rev(later)
	if res, err := b.Write(ctx, s, "k", str("v3"), gs); err != nil || res.Replayed {
		t.Fatalf("retry after failure = %+v, %v", res, err)
	}
	// Deletes replay their first result.
	gd := Guard{IdempotencyKey: "del-1"}
	d, err := b.Delete(ctx, s, "k", gd)
	if err != nil || !d.Existed || d.Replayed {
		t.Fatalf("Delete = %+v, %v", d, err)
	}
	write(t, b, s, "k", str("recreated"))
	d, err = b.Delete(ctx, s, "k", gd)
	if err != nil || !d.Existed || !d.Replayed {
		t.Fatalf("Delete retry = %+v, %v", d, err)
	}
	if it := read(t, b, s, "k"); it.Value.GetStringValue() != "recreated" {
		t.Fatal("delete retry was applied")
	}
	d, err = b.Delete(ctx, s, "nothing", Guard{IdempotencyKey: "del-2"})
	if err != nil || d.Existed {
		t.Fatalf("Delete missing = %+v, %v", d, err)
	}
	if d, err = b.Delete(ctx, s, "nothing", Guard{IdempotencyKey: "del-2"}); err != nil || d.Existed || !d.Replayed {
		t.Fatalf("Delete missing retry = %+v, %v", d, err)
	}
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func testIdempotencyRetention(t *testing.T, open opener) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	b := open(t, WithClock(clock.Now), WithIdempotencyRetention(time.Hour))
	s := scope.Session("s")
	g := Guard{IdempotencyKey: "i"}
	first, err := b.Write(ctx, s, "k", str("v"), g)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(59 * time.Minute)
	if res, err := b.Write(ctx, s, "k", str("v"), g); err != nil || !res.Replayed {
		t.Fatalf("retry within retention = %+v, %v", res, err)
	}
	clock.Advance(2 * time.Minute)
	res, err := b.Write(ctx, s, "k", str("v"), g)
	if err != nil || res.Replayed || res.Revision <= first.Revision {
		t.Fatalf("retry after retention = %+v, %v; want a new write", res, err)
	}
	// The new record is remembered from now.
	if again, err := b.Write(ctx, s, "k", str("v"), g); err != nil || !again.Replayed || again.Revision != res.Revision {
		t.Fatalf("retry of the new write = %+v, %v", again, err)
	}
	// Old records are pruned by later writes.
	for i := range 10 {
		if _, err := b.Write(ctx, s, "p", str("v"), Guard{IdempotencyKey: fmt.Sprint("old", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if n, per := idemRecords(t, b), entriesPerRecord(b); n != 11*per {
		t.Fatalf("%d idempotency entries; want 11 records of %d", n, per)
	}
	clock.Advance(2 * time.Hour)
	write(t, b, s, "trigger", str("v"))
	if n := idemRecords(t, b); n != 0 {
		t.Fatalf("%d idempotency records left after retention", n)
	}
}

// entriesPerRecord is how many entries idemRecords counts per record: bolt
// keeps each in two buckets (by key and by time).
func entriesPerRecord(b Backend) int {
	if _, ok := b.(*Bolt); ok {
		return 2
	}
	return 1
}

// idemRecords counts the idempotency entries a backend holds.
func idemRecords(t *testing.T, b Backend) int {
	t.Helper()
	switch b := b.(type) {
	case *Memory:
		b.mu.RLock()
		defer b.mu.RUnlock()
		return len(b.idems)
	case *Bolt:
		return boltCount(t, b, bucketIdem) + boltCount(t, b, bucketIdemAt)
	case *Postgres:
		return pgIdemRecords(t, b)
	}
	t.Fatalf("unknown backend %T", b)
	return 0
}

func testSearchRanking(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	write(t, b, s, "once", str("the deployment of the kernel happened on monday with a pipeline"))
	write(t, b, s, "thrice", str("kernel notes: the kernel build and the kernel config for monday"))
	write(t, b, s, "none", str("nothing relevant is in this note at all, only tuesday"))
	write(t, b, scope.Session("other"), "elsewhere", str("kernel kernel kernel kernel kernel"))
	hits, err := b.Search(ctx, s, "kernel", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(hits) != 2 || hits[0].Key != "thrice" || hits[1].Key != "once" {
		t.Fatalf("Search = %+v; want thrice, once", hits)
	}
	if !(hits[0].Score > hits[1].Score) || hits[1].Score <= 0 {
		t.Fatalf("scores %v, %v", hits[0].Score, hits[1].Score)
	}
	for _, h := range hits {
		if !strings.Contains(h.Snippet, "kernel") || h.Revision == 0 {
			t.Fatalf("hit %+v", h)
		}
	}
	// Limit, and a query that matches nothing.
	if hits, err := b.Search(ctx, s, "kernel", 1); err != nil || len(hits) != 1 || hits[0].Key != "thrice" {
		t.Fatalf("Search limit 1 = %+v, %v", hits, err)
	}
	if hits, err := b.Search(ctx, s, "zebra", 10); err != nil || len(hits) != 0 {
		t.Fatalf("Search zebra = %+v, %v", hits, err)
	}
	// Several terms: a document matching both ranks first.
	hits, err = b.Search(ctx, s, "pipeline monday", 10)
	if err != nil || len(hits) != 2 || hits[0].Key != "once" {
		t.Fatalf("Search two terms = %+v, %v", hits, err)
	}
	// Strings nested anywhere in a JSON value are searched; keys are too.
	write(t, b, s, "doc/quantum", mustValue(t, map[string]any{"title": "Notes", "tags": []any{"physics", map[string]any{"deep": "entanglement"}}, "n": 42}))
	if hits, err := b.Search(ctx, s, "entanglement", 10); err != nil || len(hits) != 1 || hits[0].Key != "doc/quantum" {
		t.Fatalf("Search nested = %+v, %v", hits, err)
	}
	if hits, err := b.Search(ctx, s, "quantum", 10); err != nil || len(hits) != 1 || hits[0].Key != "doc/quantum" {
		t.Fatalf("Search by key = %+v, %v", hits, err)
	}
}

func testSearchSnippets(t *testing.T, open opener) {
	b := open(t)
	s := scope.Custom("snips")
	long := strings.Repeat("filler words go here and say nothing much. ", 20) +
		"The migration of the database finished at noon. " +
		strings.Repeat("more filler text that is not interesting. ", 20)
	write(t, b, s, "long", str(long))
	hits, err := b.Search(ctx, s, "migration", 5)
	if err != nil || len(hits) != 1 {
		t.Fatalf("Search = %+v, %v", hits, err)
	}
	sn := hits[0].Snippet
	if !strings.Contains(sn, "migration of the database") || !strings.HasPrefix(sn, "…") || !strings.HasSuffix(sn, "…") || len(sn) > snippetBytes+10 {
		t.Fatalf("snippet %q", sn)
	}
	write(t, b, s, "short", mustValue(t, []any{"alpha line", "beta\nmigration line"}))
	hits, err = b.Search(ctx, s, "beta", 5)
	if err != nil || len(hits) != 1 || hits[0].Snippet != "alpha line beta migration line" {
		t.Fatalf("short snippet = %+v, %v", hits, err)
	}
}

func testSearchFollowsWrites(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	r1 := write(t, b, s, "k", str("original walrus"))
	if hits, _ := b.Search(ctx, s, "walrus", 5); len(hits) != 1 || hits[0].Revision != r1 {
		t.Fatalf("Search after write = %+v", hits)
	}
	r2 := write(t, b, s, "k", str("replaced penguin"))
	if hits, _ := b.Search(ctx, s, "walrus", 5); len(hits) != 0 {
		t.Fatalf("old text still found: %+v", hits)
	}
	if hits, _ := b.Search(ctx, s, "penguin", 5); len(hits) != 1 || hits[0].Revision != r2 {
		t.Fatalf("Search after update = %+v", hits)
	}
	if _, err := b.Delete(ctx, s, "k", Guard{}); err != nil {
		t.Fatal(err)
	}
	if hits, _ := b.Search(ctx, s, "penguin", 5); len(hits) != 0 {
		t.Fatalf("deleted key found: %+v", hits)
	}
}

// hitKeys returns the keys of hits in order.
func hitKeys(hits []SearchHit) []string {
	keys := make([]string, len(hits))
	for i, h := range hits {
		keys[i] = h.Key
	}
	return keys
}

// search returns the hits of query in s, failing t on an error.
func search(t *testing.T, b Backend, s *typesv1.Scope, query string) []SearchHit {
	t.Helper()
	hits, err := b.Search(ctx, s, query, MaxSearchLimit)
	if err != nil {
		t.Fatalf("Search(%q): %v", query, err)
	}
	return hits
}

// testUnindexed: a value written with Guard.Unindexed is stored, read and
// listed as usual, never found by Search (by its value or its key); it
// removes the indexed value it replaces from the index; a later indexed
// Write indexes the key again.
func testUnindexed(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	unindexed := Guard{Unindexed: true}

	r1, err := b.Write(ctx, s, "history/quokka", str("the ocelot said hello"), unindexed)
	if err != nil {
		t.Fatal(err)
	}
	if it := read(t, b, s, "history/quokka"); it.Revision != r1.Revision || it.Value.GetStringValue() != "the ocelot said hello" {
		t.Fatalf("Read = %v @%d", it.Value, it.Revision)
	}
	if got := keysOf(listAll(t, b, s, "", 10)); !slices.Equal(got, []string{"history/quokka"}) {
		t.Fatalf("List = %q", got)
	}
	if got := hitKeys(search(t, b, s, "ocelot")); len(got) != 0 {
		t.Fatalf("Search by value found the unindexed key: %q", got)
	}
	if got := hitKeys(search(t, b, s, "quokka")); len(got) != 0 {
		t.Fatalf("Search by key found the unindexed key: %q", got)
	}

	// An indexed key beside it is found; the unindexed one still is not.
	write(t, b, s, "note", str("an ocelot and a heron"))
	if got := hitKeys(search(t, b, s, "ocelot")); !slices.Equal(got, []string{"note"}) {
		t.Fatalf("Search = %q; want only note", got)
	}

	// Replacing the indexed value with an unindexed one removes it from
	// the index, by value and by key.
	r2, err := b.Write(ctx, s, "note", str("an ocelot and a heron, now private"), unindexed)
	if err != nil {
		t.Fatal(err)
	}
	if got := hitKeys(search(t, b, s, "ocelot heron note private")); len(got) != 0 {
		t.Fatalf("Search after an unindexed replace = %q", got)
	}
	if it := read(t, b, s, "note"); it.Revision != r2.Revision || !strings.Contains(it.Value.GetStringValue(), "private") {
		t.Fatalf("Read = %v @%d", it.Value, it.Revision)
	}
	// A compare-and-set works on unindexed values as on any other.
	_, err = b.Write(ctx, s, "note", str("stale"), Guard{ExpectedRevision: rev(r1.Revision), Unindexed: true})
	wantCode(t, err, codes.FailedPrecondition, "")

	// A later indexed Write indexes the key again.
	r3, err := b.Write(ctx, s, "note", str("the heron is back"), Guard{ExpectedRevision: rev(r2.Revision)})
	if err != nil {
		t.Fatal(err)
	}
	hits := search(t, b, s, "heron")
	if len(hits) != 1 || hits[0].Key != "note" || hits[0].Revision != r3.Revision || !strings.Contains(hits[0].Snippet, "heron") {
		t.Fatalf("Search after re-indexing = %+v", hits)
	}
	if got := hitKeys(search(t, b, s, "private")); len(got) != 0 {
		t.Fatalf("the unindexed value was indexed: %q", got)
	}

	// Unindexed over unindexed, and deleting unindexed values.
	if _, err := b.Write(ctx, s, "history/quokka", str("the ocelot said goodbye"), unindexed); err != nil {
		t.Fatal(err)
	}
	if got := hitKeys(search(t, b, s, "ocelot goodbye quokka")); len(got) != 0 {
		t.Fatalf("Search = %q", got)
	}
	if d, err := b.Delete(ctx, s, "history/quokka", Guard{}); err != nil || !d.Existed {
		t.Fatalf("Delete = %+v, %v", d, err)
	}
	if _, err := b.Read(ctx, s, "history/quokka"); errs.Code(err) != codes.NotFound {
		t.Fatalf("Read after Delete: %v", err)
	}
	// Indexed, then unindexed, then deleted: not found at any point.
	write(t, b, s, "short", str("a brief walrus"))
	if _, err := b.Write(ctx, s, "short", str("a brief walrus"), unindexed); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Delete(ctx, s, "short", Guard{}); err != nil {
		t.Fatal(err)
	}
	if got := hitKeys(search(t, b, s, "walrus")); len(got) != 0 {
		t.Fatalf("Search = %q", got)
	}
	if got := hitKeys(search(t, b, s, "heron")); !slices.Equal(got, []string{"note"}) {
		t.Fatalf("Search = %q", got)
	}
}

// testUnindexedIdempotency: a replayed Write changes nothing, whatever its
// Unindexed says.
func testUnindexedIdempotency(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	first, err := b.Write(ctx, s, "k", str("secret penguin"), Guard{IdempotencyKey: "w1", Unindexed: true})
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.Write(ctx, s, "k", str("secret penguin"), Guard{IdempotencyKey: "w1"})
	if err != nil || !again.Replayed || again.Revision != first.Revision {
		t.Fatalf("retry = %+v, %v", again, err)
	}
	if got := hitKeys(search(t, b, s, "penguin")); len(got) != 0 {
		t.Fatalf("a replay indexed the key: %q", got)
	}
	second, err := b.Write(ctx, s, "j", str("public penguin"), Guard{IdempotencyKey: "w2"})
	if err != nil {
		t.Fatal(err)
	}
	again, err = b.Write(ctx, s, "j", str("public penguin"), Guard{IdempotencyKey: "w2", Unindexed: true})
	if err != nil || !again.Replayed || again.Revision != second.Revision {
		t.Fatalf("retry = %+v, %v", again, err)
	}
	if got := hitKeys(search(t, b, s, "penguin")); !slices.Equal(got, []string{"j"}) {
		t.Fatalf("a replay unindexed the key: %q", got)
	}
}

// testSearchSeesAcknowledgedWrites: many concurrent writers, each
// searching for what it just wrote (read-your-writes), indexed and
// unindexed writes mixed; at the end Search finds every indexed key and
// no unindexed one.
func testSearchSeesAcknowledgedWrites(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("many")
	const writers, each = 16, 12
	var wg sync.WaitGroup
	errc := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				key := fmt.Sprintf("w%02d-%02d", w, i)
				word := fmt.Sprintf("word%dx%d", w, i)
				hidden := i%3 == 2
				res, err := b.Write(ctx, s, key, str("indexed "+word), Guard{Unindexed: hidden})
				if err != nil {
					errc <- err
					return
				}
				hits, err := b.Search(ctx, s, word, 5)
				if err != nil {
					errc <- err
					return
				}
				switch {
				case hidden && len(hits) != 0:
					errc <- fmt.Errorf("unindexed %s found: %+v", key, hits)
					return
				case !hidden && (len(hits) != 1 || hits[0].Key != key || hits[0].Revision != res.Revision):
					errc <- fmt.Errorf("Search right after the Write of %s (revision %d) = %+v", key, res.Revision, hits)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	hits := search(t, b, s, "indexed")
	if want := writers * (each - each/3); len(hits) != want {
		t.Fatalf("Search found %d keys; want %d", len(hits), want)
	}
	for _, h := range hits {
		var w, i int
		if _, err := fmt.Sscanf(h.Key, "w%02d-%02d", &w, &i); err != nil || i%3 == 2 {
			t.Fatalf("hit %q (unindexed or unknown)", h.Key)
		}
	}
}

func testConcurrentWriters(t *testing.T, open opener) {
	b := open(t)
	s := scope.Workflow("busy")
	const writers, each = 8, 25
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[uint64]bool{}
	)
	errc := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for i := range each {
				// Half the writes go to a shared key, half to own keys.
				key := "shared"
				if i%2 == 1 {
					key = fmt.Sprintf("w%d/%d", w, i)
				}
				res, err := b.Write(ctx, s, key, str(fmt.Sprintf("writer %d item %d", w, i)), Guard{IdempotencyKey: fmt.Sprint(w, "-", i)})
				if err != nil {
					errc <- err
					return
				}
				if res.Revision <= last {
					errc <- fmt.Errorf("writer %d saw revision %d after %d", w, res.Revision, last)
					return
				}
				last = res.Revision
				mu.Lock()
				if seen[res.Revision] {
					errc <- fmt.Errorf("revision %d given twice", res.Revision)
				}
				seen[res.Revision] = true
				mu.Unlock()
				if i%5 == 0 {
					if _, err := b.Search(ctx, s, "writer", 3); err != nil {
						errc <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if len(seen) != writers*each {
		t.Fatalf("%d revisions; want %d", len(seen), writers*each)
	}
	items := listAll(t, b, s, "", 1000)
	if len(items) != writers*(each/2)+1 {
		t.Fatalf("%d keys", len(items))
	}
	hits, err := b.Search(ctx, s, "writer", MaxSearchLimit)
	if err != nil || len(hits) != len(items) {
		t.Fatalf("Search found %d of %d keys: %v", len(hits), len(items), err)
	}
}

func testClosed(t *testing.T, open opener) {
	b := open(t)
	s := scope.Session("s")
	write(t, b, s, "k", str("v"))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := b.Read(ctx, s, "k")
	wantCode(t, err, codes.Unavailable, "closed")
	_, err = b.Write(ctx, s, "k", str("v"), Guard{})
	wantCode(t, err, codes.Unavailable, "closed")
	_, err = b.Search(ctx, s, "v", 1)
	wantCode(t, err, codes.Unavailable, "closed")
	if err := b.Close(); err != nil && !errors.Is(err, errClosed) {
		t.Fatalf("second Close: %v", err)
	}
}
