package state

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// maxPageValueBytes is the contract's bound on a List page with values:
// its keys and encoded values total at most this, unless it holds one
// item.
const maxPageValueBytes = 2 << 20

// testListValues checks List's include_values and reverse.
func testListValues(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"ValuesAreCurrent", testValuesCurrent},
		{"NoValuesUnlessAsked", testValuesUnasked},
		{"Reverse", testReverse},
		{"ReversePrefixAndScope", testReverseBounds},
		{"PageTokenOfTheOtherDirection", testTokenDirection},
		{"PagesOfValuesAreBounded", testValuesBounded},
	})
}

// listPages pages through a listing of sc and returns its items and the
// number of pages; every page must hold at most size items (when size >
// 0) and, with values, at least one item unless it is the only page.
func (s *suite) listPages(t *testing.T, req *statev1.ListRequest) ([]*statev1.ListItem, int) {
	t.Helper()
	var all []*statev1.ListItem
	for pages := 1; ; pages++ {
		if pages > 100000 {
			t.Fatalf("List(%s, prefix %q) does not end", scope.String(req.GetScope()), req.GetPrefix())
		}
		res, err := s.c.List(ctx(t), req)
		if err != nil {
			t.Fatalf("List(%s, prefix %q, reverse %t, include_values %t, page %d): %v",
				scope.String(req.GetScope()), req.GetPrefix(), req.GetReverse(), req.GetIncludeValues(), pages, err)
		}
		if n := len(res.GetItems()); req.GetPageSize() > 0 && n > int(req.GetPageSize()) {
			t.Fatalf("List page of %d items; page_size %d", n, req.GetPageSize())
		}
		if len(res.GetItems()) == 0 && res.GetNextPageToken() != "" {
			t.Fatalf("List page %d is empty but has a next_page_token", pages)
		}
		all = append(all, res.GetItems()...)
		if res.GetNextPageToken() == "" {
			return all, pages
		}
		req = proto.CloneOf(req)
		req.PageToken = res.GetNextPageToken()
	}
}

// wantItems fails t unless got holds exactly the keys want, in that
// order, each with the value and revision of vals and revs (values only
// when withValues, else none).
func wantItems(t *testing.T, what string, got []*statev1.ListItem, want []string, vals map[string]*structpb.Value, revs map[string]uint64, withValues bool) {
	t.Helper()
	if g := keysOf(got); !slices.Equal(g, want) {
		t.Fatalf("%s listed %d keys %s; want %d keys %s", what, len(g), quoteAll(g), len(want), quoteAll(want))
	}
	for _, it := range got {
		if it.GetRevision() != revs[it.GetKey()] {
			t.Fatalf("%s: key %s at revision %d; Write returned %d", what, quote(it.GetKey()), it.GetRevision(), revs[it.GetKey()])
		}
		switch {
		case withValues && !proto.Equal(it.GetValue(), vals[it.GetKey()]):
			t.Fatalf("%s: key %s has value %v; want %v", what, quote(it.GetKey()), it.GetValue(), vals[it.GetKey()])
		case !withValues && it.Value != nil:
			t.Fatalf("%s: key %s has a value without include_values", what, quote(it.GetKey()))
		}
	}
}

// writeValues writes each key with its value of vals, one after the
// other, and returns the revisions.
func (s *suite) writeValues(t *testing.T, sc *typesv1.Scope, keys []string, vals map[string]*structpb.Value) map[string]uint64 {
	t.Helper()
	revs := make(map[string]uint64, len(keys))
	for _, k := range keys {
		revs[k] = s.write(t, sc, k, vals[k])
	}
	return revs
}

func reversed(keys []string) []string {
	out := slices.Clone(keys)
	slices.Reverse(out)
	return out
}

func testValuesCurrent(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := numbered("conversation/", 7)
	vals := map[string]*structpb.Value{}
	for i, k := range keys {
		vals[k] = jsonValue(t, map[string]any{"n": i, "turns": []any{map[string]any{"role": "user", "text": "hello " + k}}, "ok": i%2 == 0, "none": nil})
	}
	vals[keys[3]] = structpb.NewNullValue()
	vals[keys[4]] = str("")
	revs := s.writeValues(t, sc, keys, vals)
	// Overwritten and deleted keys: the listing holds the current values.
	vals[keys[1]] = str("second value")
	revs[keys[1]] = s.write(t, sc, keys[1], vals[keys[1]])
	s.del(t, sc, keys[5])
	keys = slices.Delete(keys, 5, 6)
	s.write(t, sc, "other/x", str("not listed"))

	for _, size := range []int32{0, 1, 2, 100} {
		got, _ := s.listPages(t, &statev1.ListRequest{Scope: sc, Prefix: "conversation/", PageSize: size, IncludeValues: true})
		wantItems(t, fmt.Sprintf("List with include_values, page_size %d", size), got, keys, vals, revs, true)
	}
}

func testValuesUnasked(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := numbered("k", 3)
	vals := map[string]*structpb.Value{keys[0]: str("a"), keys[1]: num(2), keys[2]: jsonValue(t, map[string]any{"x": "y"})}
	revs := s.writeValues(t, sc, keys, vals)
	got, _ := s.listPages(t, &statev1.ListRequest{Scope: sc, PageSize: 2})
	wantItems(t, "List without include_values", got, keys, vals, revs, false)
	got, _ = s.listPages(t, &statev1.ListRequest{Scope: sc, PageSize: 2, Reverse: true})
	wantItems(t, "List reverse without include_values", got, reversed(keys), vals, revs, false)
}

func testReverse(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := numbered("conversation/", 11)
	vals := map[string]*structpb.Value{}
	for _, k := range keys {
		vals[k] = str("turns of " + k)
	}
	revs := s.writeValues(t, sc, keys, vals)
	for _, size := range []int32{0, 1, 3, 11, 1000} {
		for _, values := range []bool{false, true} {
			got, _ := s.listPages(t, &statev1.ListRequest{Scope: sc, Prefix: "conversation/", PageSize: size, Reverse: true, IncludeValues: values})
			wantItems(t, fmt.Sprintf("List reverse, page_size %d, include_values %t", size, values), got, reversed(keys), vals, revs, values)
		}
	}
	// The last n keys in one call: what a conversation's recent history
	// needs.
	res, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, Prefix: "conversation/", PageSize: 4, Reverse: true, IncludeValues: true})
	if err != nil {
		t.Fatal(err)
	}
	wantItems(t, "List reverse, page_size 4 (first page)", res.GetItems(), reversed(keys)[:4], vals, revs, true)
	if res.GetNextPageToken() == "" {
		t.Fatal("List reverse of 11 keys with page_size 4 returned no next_page_token")
	}
}

// testReverseBounds checks that a reversed listing stays within its
// prefix and scope, where neighbouring keys sort just before and after
// it.
func testReverseBounds(t *testing.T, s *suite) {
	id := s.id("s")
	sc := scope.Session(id)
	in := []string{"a/", "a/\u00ff", "a/\U0010ffff", "a/b", "a/b/c"}
	out := []string{"a", "a.", "a0", "a\u00ff", "b", "\U0010ffff"}
	all := append(slices.Clone(in), out...)
	vals := map[string]*structpb.Value{}
	for _, k := range all {
		vals[k] = str("value of " + k)
	}
	revs := s.writeValues(t, sc, all, vals)
	// Neighbouring scopes, whose stored keys may sort next to this one's.
	for _, other := range []*typesv1.Scope{scope.Session(id + "0"), scope.Session(id + "\U0010ffff"), scope.Custom(id), scope.Agent(id, id), scope.Workflow(id)} {
		s.writeKeys(t, other, []string{"a/", "a/z", "zz"})
	}
	want := slices.Clone(in)
	slices.Sort(want)
	for _, size := range []int32{1, 2, 100} {
		got, _ := s.listPages(t, &statev1.ListRequest{Scope: sc, Prefix: "a/", PageSize: size, Reverse: true, IncludeValues: true})
		wantItems(t, fmt.Sprintf("List reverse of prefix \"a/\", page_size %d", size), got, reversed(want), vals, revs, true)
	}
	whole := slices.Clone(all)
	slices.Sort(whole)
	got, _ := s.listPages(t, &statev1.ListRequest{Scope: sc, PageSize: 3, Reverse: true})
	wantItems(t, "List reverse of the whole scope", got, reversed(whole), vals, revs, false)
	got, _ = s.listPages(t, &statev1.ListRequest{Scope: sc, Prefix: "c", Reverse: true})
	wantItems(t, "List reverse of a prefix no key has", got, nil, vals, revs, false)
}

func testTokenDirection(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	s.writeKeys(t, sc, []string{"a", "b", "c"})
	for _, reverse := range []bool{false, true} {
		res, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, PageSize: 1, Reverse: reverse})
		if err != nil {
			t.Fatal(err)
		}
		if res.GetNextPageToken() == "" {
			t.Fatalf("List (reverse %t) of 3 keys with page_size 1 returned no next_page_token", reverse)
		}
		_, err = s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, PageSize: 1, Reverse: !reverse, PageToken: res.GetNextPageToken()})
		if err := checkCode(err, codes.InvalidArgument, ""); err != nil {
			t.Fatalf("List with reverse %t and a page_token of a listing with reverse %t: %v", !reverse, reverse, err)
		}
		// It still works in its own direction, with or without values.
		if _, err := s.c.List(ctx(t), &statev1.ListRequest{Scope: sc, PageSize: 1, Reverse: reverse, IncludeValues: true, PageToken: res.GetNextPageToken()}); err != nil {
			t.Fatalf("the token in its own direction: %v", err)
		}
	}
}

// testValuesBounded writes values of half the value limit, more than
// fill the page bound, and checks that pages with values keep to it and
// still list every key once.
func testValuesBounded(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	size := s.maxValue / 2
	n := maxPageValueBytes/size + 3
	keys := numbered("big/", n)
	vals := map[string]*structpb.Value{}
	for i, k := range keys {
		vals[k] = str(strings.Repeat(string(rune('a'+i%26)), size-16))
	}
	got := make([]uint64, n)
	parallel(t, n, func(i int) error {
		res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: keys[i], Value: vals[keys[i]]})
		if err != nil {
			return fmt.Errorf("Write(%s): %v", show(sc, keys[i]), err)
		}
		got[i] = res.GetRevision()
		return nil
	})
	revs := make(map[string]uint64, n)
	for i, k := range keys {
		revs[k] = got[i]
	}
	for _, reverse := range []bool{false, true} {
		req := &statev1.ListRequest{Scope: sc, Prefix: "big/", PageSize: maxPageSize, IncludeValues: true, Reverse: reverse}
		var all []*statev1.ListItem
		pages := 0
		for {
			pages++
			res, err := s.c.List(ctx(t), req)
			if err != nil {
				t.Fatalf("List of %d values of %d bytes (reverse %t), page %d: %v", n, size, reverse, pages, err)
			}
			total := 0
			for _, it := range res.GetItems() {
				total += len(it.GetKey()) + proto.Size(it.GetValue())
			}
			if len(res.GetItems()) > 1 && total > maxPageValueBytes {
				t.Fatalf("page %d with values holds %d items of %d bytes in all; the bound is %d", pages, len(res.GetItems()), total, maxPageValueBytes)
			}
			if len(res.GetItems()) == 0 && res.GetNextPageToken() != "" {
				t.Fatalf("page %d is empty but has a next_page_token", pages)
			}
			all = append(all, res.GetItems()...)
			if res.GetNextPageToken() == "" {
				break
			}
			req = proto.CloneOf(req)
			req.PageToken = res.GetNextPageToken()
		}
		if pages < 2 {
			t.Fatalf("%d values of %d bytes (%d in all) came in one page; the bound is %d bytes", n, size, n*size, maxPageValueBytes)
		}
		want := keys
		if reverse {
			want = reversed(keys)
		}
		wantItems(t, fmt.Sprintf("List of large values (reverse %t)", reverse), all, want, vals, revs, true)
	}
}
