package state

import (
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// testList checks prefixes, byte order, paging and page tokens.
func testList(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"EmptyScope", testListEmpty},
		{"EmptyPrefixListsWholeScope", testListEmptyPrefix},
		{"PrefixFilter", testListPrefix},
		{"ByteOrder", testListByteOrder},
		{"Paging", testListPaging},
		{"DefaultPageSize", testListDefaultPageSize},
		{"PagingStableUnderWrites", testListStable},
		{"DeletedKeysAreNotListed", testListDeleted},
		{"PageTokenOfAnotherScope", testTokenOtherScope},
		{"PageTokenOfAnotherPrefix", testTokenOtherPrefix},
		{"TamperedPageToken", testTokenTampered},
		{"PageSizeOutOfRange", testPageSizeRange},
	})
}

// writeKeys writes keys (in parallel) and returns their revisions.
func (s *suite) writeKeys(t *testing.T, sc *typesv1.Scope, keys []string) map[string]uint64 {
	t.Helper()
	revs := make([]uint64, len(keys))
	parallel(t, len(keys), func(i int) error {
		res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: keys[i], Value: str("value of " + keys[i])})
		if err != nil {
			return fmt.Errorf("Write(%s): %v", show(sc, keys[i]), err)
		}
		revs[i] = res.GetRevision()
		return nil
	})
	out := make(map[string]uint64, len(keys))
	for i, k := range keys {
		out[k] = revs[i]
	}
	return out
}

func numbered(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return keys
}

// firstPage returns the first page of a listing.
func (s *suite) firstPage(t *testing.T, sc *typesv1.Scope, prefix string, size int32) *statev1.ListResponse {
	t.Helper()
	res, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, Prefix: prefix, PageSize: size})
	if err != nil {
		t.Fatalf("List(%s, prefix %q): %v", scope.String(sc), prefix, err)
	}
	return res
}

func testListEmpty(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	res := s.firstPage(t, sc, "", 0)
	if len(res.GetItems()) != 0 || res.GetNextPageToken() != "" {
		t.Fatalf("List of an empty scope = %v, next_page_token %q; want nothing", res.GetItems(), res.GetNextPageToken())
	}
}

func testListEmptyPrefix(t *testing.T, s *suite) {
	sc := scope.Workflow(s.id("wf"))
	keys := []string{"a", "b/c", "zz", "\x00", "日本"}
	s.writeKeys(t, sc, keys)
	wantKeys(t, "List with an empty prefix", s.listAll(t, sc, "", 0), keys)
}

func testListPrefix(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := []string{"p", "p/", "p/a", "p/b", "p/b/c", "pq", "q", "P/a", "o", "p\x00", "p/日"}
	revs := s.writeKeys(t, sc, keys)
	cases := []struct {
		prefix string
		want   []string
	}{
		{"p/", []string{"p/", "p/a", "p/b", "p/b/c", "p/日"}},
		{"p/b", []string{"p/b", "p/b/c"}},
		{"p", []string{"p", "p/", "p/a", "p/b", "p/b/c", "pq", "p\x00", "p/日"}},
		{"P", []string{"P/a"}},
		{"p\x00", []string{"p\x00"}},
		{"p/日", []string{"p/日"}},
		{"r", nil},
		{"p/a/", nil},
	}
	for _, c := range cases {
		items := s.listAll(t, sc, c.prefix, 0)
		wantKeys(t, fmt.Sprintf("List with prefix %q", c.prefix), items, c.want)
		for _, it := range items {
			if it.GetRevision() != revs[it.GetKey()] {
				t.Fatalf("List item %q at revision %d; Write returned %d", it.GetKey(), it.GetRevision(), revs[it.GetKey()])
			}
		}
	}
}

// testListByteOrder: keys come in byte order of their UTF-8 encoding, not
// by code points of UTF-16, case-folded or locale order.
func testListByteOrder(t *testing.T, s *suite) {
	sc := scope.Custom(s.id("c"))
	keys := []string{
		"b", "B", "a", "A", "aa", "a\x00", "a/", "a0", "a-", "a~", "é", "e\u0301", "z",
		"\uffff", "😀", "\u00ff", "10", "9", "1", "", // "" is dropped below
	}
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == "" })
	s.writeKeys(t, sc, keys)
	for _, size := range []int32{0, 1, 4} {
		got := keysOf(s.listAll(t, sc, "", size))
		want := slices.Sorted(slices.Values(keys))
		if !slices.Equal(got, want) {
			t.Fatalf("List (page_size %d) order %s; want byte order %s", size, quoteAll(got), quoteAll(want))
		}
	}
}

func testListPaging(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := numbered("k", 25)
	revs := s.writeKeys(t, sc, keys)
	for _, size := range []int32{1, 3, 7, 24, 25, 26, 1000} {
		t.Run(fmt.Sprint("page_size ", size), func(t *testing.T) {
			items := s.listAll(t, sc, "", size) // checks each page's size
			wantKeys(t, "paged List", items, keys)
			for _, it := range items {
				if it.GetRevision() != revs[it.GetKey()] {
					t.Fatalf("item %q at revision %d; Write returned %d", it.GetKey(), it.GetRevision(), revs[it.GetKey()])
				}
			}
			// Every page but the last is full.
			token, seen := "", 0
			for {
				res, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, PageSize: size, PageToken: token})
				if err != nil {
					t.Fatal(err)
				}
				seen += len(res.GetItems())
				if res.GetNextPageToken() == "" {
					break
				}
				if len(res.GetItems()) != int(size) {
					t.Fatalf("a page before the last has %d items; page_size %d", len(res.GetItems()), size)
				}
				token = res.GetNextPageToken()
			}
			if seen != len(keys) {
				t.Fatalf("second listing saw %d keys; want %d", seen, len(keys))
			}
			// The same listing again gives the same sequence.
			if again := keysOf(s.listAll(t, sc, "", size)); !slices.Equal(again, keysOf(items)) {
				t.Fatalf("second listing %s differs from the first %s", quoteAll(again), quoteAll(keysOf(items)))
			}
		})
	}
}

func testListDefaultPageSize(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := numbered("k", defaultPageSize+1)
	s.writeKeys(t, sc, keys)
	first := s.firstPage(t, sc, "", 0)
	if len(first.GetItems()) != defaultPageSize || first.GetNextPageToken() == "" {
		t.Fatalf("page_size 0 gave %d items, next_page_token %q; want the default %d and a token", len(first.GetItems()), first.GetNextPageToken(), defaultPageSize)
	}
	res, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, PageToken: first.GetNextPageToken()})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.GetItems()) != 1 || res.GetItems()[0].GetKey() != keys[defaultPageSize] || res.GetNextPageToken() != "" {
		t.Fatalf("second page = %v, token %q; want only %q", keysOf(res.GetItems()), res.GetNextPageToken(), keys[defaultPageSize])
	}
}

// testListStable: keys added and removed between pages neither skip nor
// repeat the keys that exist throughout, and order stays byte order.
func testListStable(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := numbered("k", 20)
	s.writeKeys(t, sc, keys)
	var got []string
	token := ""
	for page := 0; ; page++ {
		res, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, PageSize: 4, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, keysOf(res.GetItems())...)
		if res.GetNextPageToken() == "" {
			break
		}
		token = res.GetNextPageToken()
		// Between pages: add keys before and after the position, remove
		// one already listed.
		s.write(t, sc, fmt.Sprintf("k%03d-before", 4*page), str("new"))
		s.write(t, sc, fmt.Sprintf("k%03d-after", 4*page+10), str("new"))
		s.del(t, sc, fmt.Sprintf("k%03d", 4*page))
	}
	if !slices.IsSorted(got) {
		t.Fatalf("listing is not in byte order: %s", quoteAll(got))
	}
	if c := slices.Compact(slices.Clone(got)); len(c) != len(got) {
		t.Fatalf("a key was listed twice: %s", quoteAll(got))
	}
	for _, k := range keys {
		if !slices.Contains(got, k) {
			t.Fatalf("key %q, which existed until it was listed or throughout, was skipped: %s", k, quoteAll(got))
		}
	}
}

func testListDeleted(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := numbered("k", 6)
	s.writeKeys(t, sc, keys)
	s.del(t, sc, "k001")
	s.del(t, sc, "k004")
	wantKeys(t, "List after deletes", s.listAll(t, sc, "", 2), []string{"k000", "k002", "k003", "k005"})
}

// token returns a next_page_token of a listing of sc with prefix.
func (s *suite) token(t *testing.T, sc *typesv1.Scope, prefix string) string {
	t.Helper()
	s.writeKeys(t, sc, []string{prefix + "a", prefix + "b", prefix + "c"})
	res := s.firstPage(t, sc, prefix, 1)
	if res.GetNextPageToken() == "" {
		t.Fatalf("List of 3 keys with page_size 1 returned no next_page_token")
	}
	return res.GetNextPageToken()
}

func (s *suite) wantBadToken(t *testing.T, sc *typesv1.Scope, prefix, token string) {
	t.Helper()
	_, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, Prefix: prefix, PageSize: 1, PageToken: token})
	if err := checkCode(err, codes.InvalidArgument, ""); err != nil {
		t.Fatalf("List(%s, prefix %q) with page_token %q: %v", scope.String(sc), prefix, token, err)
	}
}

func testTokenOtherScope(t *testing.T, s *suite) {
	id := s.id("s")
	a, b := scope.Session(id), scope.Custom(id)
	tok := s.token(t, a, "")
	s.writeKeys(t, b, []string{"a", "b", "c"})
	s.wantBadToken(t, b, "", tok)
	s.wantBadToken(t, scope.Session(s.id("s")), "", tok)
	s.wantBadToken(t, scope.Agent(id, id), "", tok)
}

func testTokenOtherPrefix(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	tok := s.token(t, sc, "x/")
	s.writeKeys(t, sc, []string{"y/a", "y/b"})
	s.wantBadToken(t, sc, "y/", tok)
	s.wantBadToken(t, sc, "", tok)
	s.wantBadToken(t, sc, "x", tok)
	// The token still works where it was issued.
	if _, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, Prefix: "x/", PageSize: 1, PageToken: tok}); err != nil {
		t.Fatalf("the token with its own scope and prefix: %v", err)
	}
}

func testTokenTampered(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	tok := s.token(t, sc, "")
	flip := func(i int) string {
		b := []byte(tok)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	cases := map[string]string{
		"first character changed":  flip(0),
		"middle character changed": flip(len(tok) / 2),
		"truncated":                tok[:len(tok)/2],
		"last character dropped":   tok[:len(tok)-1],
		"character appended":       tok + "A",
		"doubled":                  tok + tok,
		"garbage":                  "not-a-page-token",
		"binary":                   "\x00\x01\x02",
		"long":                     string(make([]byte, 4096)),
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) { s.wantBadToken(t, sc, "", bad) })
	}
}

func testPageSizeRange(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	for _, size := range []int32{-1, -1000, maxPageSize + 1, 1 << 30} {
		_, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, PageSize: size})
		if err := checkCode(err, codes.InvalidArgument, ""); err != nil {
			t.Errorf("List with page_size %d: %v", size, err)
		}
	}
	if _, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, PageSize: maxPageSize}); err != nil {
		t.Errorf("List with page_size %d (the largest allowed): %v", maxPageSize, err)
	}
}
