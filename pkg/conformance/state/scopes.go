package state

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
)

// testScopes checks that every scope kind works and that scopes are
// disjoint whatever the keys and ids contain.
func testScopes(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"EachKind", testEachKind},
		{"KeysNeverCrossScopes", testKeysNeverCrossScopes},
		{"AgentScopeIsNotWorkflowScope", testAgentIsNotWorkflow},
		{"CustomScopeNamedLikeSessionID", testCustomNamedLikeSession},
	})
}

// scopeCase is a scope with whether other runs share it (global, fixed
// custom names), in which case only keys under a run prefix are ours.
type scopeCase struct {
	name   string
	sc     *typesv1.Scope
	shared bool
}

func (s *suite) everyKind() []scopeCase {
	return []scopeCase{
		{"session", scope.Session(s.id("session")), false},
		{"workflow", scope.Workflow(s.id("workflow")), false},
		{"agent", scope.Agent(s.id("workflow"), s.id("agent")), false},
		{"global", scope.Global(), true},
		{"custom", scope.Custom(s.id("custom")), false},
	}
}

// testEachKind runs Write, Read, List, Search and Delete in each kind.
func testEachKind(t *testing.T, s *suite) {
	for _, k := range s.everyKind() {
		t.Run(k.name, func(t *testing.T) {
			p := ""
			if k.shared {
				p = s.id("kind") + "/"
			}
			word := term()
			doc := jsonValue(t, map[string]any{"title": "kind check", "body": map[string]any{"text": "a note about " + word}})
			r1 := s.write(t, k.sc, p+"doc", doc)
			s.wantValue(t, k.sc, p+"doc", doc, r1)
			r2 := s.write(t, k.sc, p+"other", str("plain"))

			items := s.listAll(t, k.sc, p, 0)
			wantKeys(t, "List", items, []string{p + "doc", p + "other"})
			if items[0].GetRevision() != r1 || items[1].GetRevision() != r2 {
				t.Fatalf("List revisions %d, %d; want %d, %d", items[0].GetRevision(), items[1].GetRevision(), r1, r2)
			}

			hits := s.search(t, k.sc, word, 0)
			if len(hits) != 1 || hits[0].GetKey() != p+"doc" || hits[0].GetRevision() != r1 {
				t.Fatalf("Search(%q) = %v; want only %q at revision %d", word, hits, p+"doc", r1)
			}

			if !s.del(t, k.sc, p+"doc") {
				t.Fatal("Delete of an existing key: existed = false")
			}
			s.wantMissing(t, k.sc, p+"doc")
			wantKeys(t, "List after Delete", s.listAll(t, k.sc, p, 0), []string{p + "other"})
			if hits := s.search(t, k.sc, word, 0); len(hits) != 0 {
				t.Fatalf("Search after Delete = %v; want nothing", hits)
			}
		})
	}
}

// keyShapes are keys that break naive encodings of scope + key: path
// syntax, separators, NUL, escapes, unicode (two normal forms of é are
// different keys), whitespace.
var keyShapes = []string{
	"a", "b", "a/b", "/a", "a/", "..", "../..", "./a", "/", "//",
	"\x00", "a\x00b", "\x00\x00", "ключ/日本語/🙂", "é", "e\u0301",
	" ", "a b", "%2F", "\\", "a\\b", "*", "\n",
}

// testKeysNeverCrossScopes writes the same keys, tricky ones included,
// into scopes whose ids are chosen to collide under naive encodings
// (joined with "/", NUL-terminated, kind names as custom names), then
// checks that Read, List, Search and Delete each see only their own scope.
func testKeysNeverCrossScopes(t *testing.T, s *suite) {
	w := s.id("w")
	scopes := []scopeCase{
		{"session w", scope.Session(w), false},
		{"workflow w", scope.Workflow(w), false},
		{"agent w/w", scope.Agent(w, w), false},
		{"agent w/a", scope.Agent(w, "a"), false},
		{"agent w/a/b", scope.Agent(w, "a/b"), false},
		{"agent (w/a)/b", scope.Agent(w+"/a", "b"), false},
		{"custom w", scope.Custom(w), false},
		{"custom session:w", scope.Custom(`session:"` + w + `"`), false},
		{"custom session/w", scope.Custom("session/" + w), false},
		{"session w/a", scope.Session(w + "/a"), false},
		{"session w NUL", scope.Session(w + "\x00"), false},
		{"session w/..", scope.Session(w + "/.."), false},
		{"workflow w/w", scope.Workflow(w + "/" + w), false},
		{"global", scope.Global(), true},
		{"custom global", scope.Custom("global"), true},
		{"custom session", scope.Custom("session"), true},
	}
	// P starts the keys that every scope gets, shared ones included.
	p := s.id("keys") + "/"
	var common []string
	for _, k := range keyShapes {
		common = append(common, p+k)
	}
	common = append(common,
		p+strings.Repeat("L", s.maxKey-len(p)),         // exactly the limit
		p+strings.Repeat("日", (s.maxKey-len(p))/3),     // multi-byte, up to the limit
		p+strings.Repeat("/..", (s.maxKey-len(p))/3-1), // path syntax, near the limit
	)
	type cell struct {
		sc   int
		key  string
		want *statev1.WriteRequest
		rev  uint64
	}
	words := make([]string, len(scopes))
	keys := make([][]string, len(scopes))
	var cells []*cell
	for i, sc := range scopes {
		words[i] = term()
		keys[i] = slices.Clone(common)
		if !sc.shared {
			keys[i] = append(keys[i], keyShapes...)
		}
		for n, k := range keys[i] {
			v := jsonValue(t, map[string]any{"scope": sc.name, "word": words[i], "n": n})
			cells = append(cells, &cell{sc: i, key: k, want: &statev1.WriteRequest{Scope: sc.sc, Key: k, Value: v}})
		}
	}

	parallel(t, len(cells), func(i int) error {
		c := cells[i]
		res, err := s.c.Write(ctx(t), c.want)
		if err != nil {
			return fmt.Errorf("Write(%s): %v", show(c.want.Scope, c.key), err)
		}
		c.rev = res.GetRevision()
		return nil
	})
	parallel(t, len(cells), func(i int) error {
		c := cells[i]
		got, err := s.c.Read(ctx(t), &statev1.ReadRequest{Scope: c.want.Scope, Key: c.key})
		if err != nil {
			return fmt.Errorf("Read(%s): %v", show(c.want.Scope, c.key), err)
		}
		if got.GetRevision() != c.rev || !proto.Equal(got.GetValue(), c.want.Value) {
			return fmt.Errorf("Read(%s) = %v at revision %d; want %v at revision %d (the value of another scope or key?)",
				show(c.want.Scope, c.key), got.GetValue(), got.GetRevision(), c.want.Value, c.rev)
		}
		return nil
	})

	for i, sc := range scopes {
		prefix := ""
		if sc.shared {
			prefix = p
		}
		wantKeys(t, "List of "+scope.String(sc.sc), s.listAll(t, sc.sc, prefix, 0), keys[i])
		hits := s.search(t, sc.sc, words[i], maxSearchLimit)
		got := resultKeys(hits)
		slices.Sort(got)
		want := slices.Sorted(slices.Values(keys[i]))
		if !slices.Equal(got, want) {
			t.Fatalf("Search of %s for its own word found %d keys %s; want its %d keys %s",
				scope.String(sc.sc), len(got), quoteAll(got), len(want), quoteAll(want))
		}
		for j, other := range scopes {
			if j == i {
				continue
			}
			if hits := s.search(t, other.sc, words[i], maxSearchLimit); len(hits) != 0 {
				t.Fatalf("Search of %s found the word written only in %s: %s", scope.String(other.sc), scope.String(sc.sc), quoteAll(resultKeys(hits)))
			}
		}
	}

	// Deleting a key in one scope leaves the same key everywhere else.
	if !s.del(t, scopes[0].sc, p+"a") {
		t.Fatalf("Delete(%s): existed = false", show(scopes[0].sc, p+"a"))
	}
	s.wantMissing(t, scopes[0].sc, p+"a")
	for _, c := range cells {
		if c.sc != 0 && c.key == p+"a" {
			s.wantValue(t, c.want.Scope, c.key, c.want.Value, c.rev)
		}
	}
}

// testAgentIsNotWorkflow: an agent scope and the workflow scope with the
// same workflow id, and two agents of one workflow, are disjoint.
func testAgentIsNotWorkflow(t *testing.T, s *suite) {
	w := s.id("wf")
	wf, a1, a2 := scope.Workflow(w), scope.Agent(w, "a1"), scope.Agent(w, "a2")
	rw := s.write(t, wf, "k", str("workflow"))
	s.wantMissing(t, a1, "k")
	ra := s.write(t, a1, "k", str("agent a1"))
	s.wantMissing(t, a2, "k")
	s.wantValue(t, wf, "k", str("workflow"), rw)
	s.wantValue(t, a1, "k", str("agent a1"), ra)
	wantKeys(t, "List of the workflow", s.listAll(t, wf, "", 0), []string{"k"})
	wantKeys(t, "List of another agent", s.listAll(t, a2, "", 0), nil)
	if !s.del(t, wf, "k") {
		t.Fatal("Delete in the workflow scope: existed = false")
	}
	s.wantValue(t, a1, "k", str("agent a1"), ra)
}

// testCustomNamedLikeSession: a custom scope whose name is a session id
// is not that session.
func testCustomNamedLikeSession(t *testing.T, s *suite) {
	id := s.id("sess")
	sess, custom := scope.Session(id), scope.Custom(id)
	rs := s.write(t, sess, "k", str("session"))
	s.wantMissing(t, custom, "k")
	rc := s.write(t, custom, "k", str("custom"))
	s.wantValue(t, sess, "k", str("session"), rs)
	s.wantValue(t, custom, "k", str("custom"), rc)
	if !s.del(t, custom, "k") {
		t.Fatal("Delete in the custom scope: existed = false")
	}
	s.wantValue(t, sess, "k", str("session"), rs)
}
