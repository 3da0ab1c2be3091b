package scope

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// nastyIDs are ids chosen to confuse a naive encoding (separators, path
// tricks, NUL, length-prefix look-alikes, unicode, the longest allowed).
var nastyIDs = []string{
	"a", "b", "ab", "a/b", "a\x00b", "..", "../..", "/", "\x00", "\x01",
	"\x02\x01a", "\x01\x01", "é", "e\u0301", "日本語", "🙂",
	" ", "a b", "a:b", "\"", "\\", strings.Repeat("x", MaxIDLen),
	strings.Repeat("日", MaxIDLen), strings.Repeat("\x00", 130),
}

// allScopes builds every kind of scope over ids.
func allScopes(ids []string) []*typesv1.Scope {
	out := []*typesv1.Scope{Global()}
	for _, a := range ids {
		out = append(out, Session(a), Workflow(a), Custom(a))
		for _, b := range ids {
			out = append(out, Agent(a, b))
		}
	}
	return out
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		scope *typesv1.Scope
		want  string // substring of the message; "" means valid
	}{
		{"nil", nil, "scope is required"},
		{"no kind", &typesv1.Scope{}, "scope has no kind set"},
		{"session with nil message", &typesv1.Scope{Kind: &typesv1.Scope_Session{}}, "session.session_id is empty"},
		{"empty session", Session(""), "session.session_id is empty"},
		{"empty workflow", Workflow(""), "workflow.workflow_id is empty"},
		{"empty agent id", Agent("wf", ""), "agent.agent_id is empty"},
		{"empty agent workflow", Agent("", "a"), "agent.workflow_id is empty"},
		{"empty custom", Custom(""), "custom.name is empty"},
		{"too long", Session(strings.Repeat("x", MaxIDLen+1)), "is 257 characters; the limit is 256"},
		{"invalid utf8", Custom("\xff\xfe"), "not valid UTF-8"},
		{"longest unicode", Session(strings.Repeat("日", MaxIDLen)), ""},
		{"global", Global(), ""},
		{"global with nil message", &typesv1.Scope{Kind: &typesv1.Scope_Global{}}, ""},
		{"agent", Agent("wf", "a"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(tt.scope)
			_, encErr := Encode(tt.scope)
			if tt.want == "" {
				if err != nil || encErr != nil {
					t.Fatalf("Validate = %v, Encode err = %v; want nil", err, encErr)
				}
				return
			}
			if errs.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v (code %v); want INVALID_ARGUMENT containing %q", err, errs.Code(err), tt.want)
			}
			if errs.Code(encErr) != codes.InvalidArgument {
				t.Fatalf("Encode err = %v; want INVALID_ARGUMENT", encErr)
			}
		})
	}
}

func TestEncodeGolden(t *testing.T) {
	tests := []struct {
		scope *typesv1.Scope
		want  []byte
	}{
		{Session("s"), []byte{1, 1, 's'}},
		{Workflow("wf"), []byte{2, 2, 'w', 'f'}},
		{Agent("w", "a"), []byte{3, 1, 'w', 1, 'a'}},
		{Global(), []byte{4}},
		{Custom("c"), []byte{5, 1, 'c'}},
	}
	for _, tt := range tests {
		got, err := Encode(tt.scope)
		if err != nil || !bytes.Equal(got, tt.want) {
			t.Errorf("Encode(%s) = %v, %v; want %v", String(tt.scope), got, err, tt.want)
		}
	}
}

// TestDistinctScopesNeverCollide checks, over every pair of scopes built
// from nastyIDs, that encodings are injective and prefix-free and that
// scope+key composition never lets one scope see another's keys.
func TestDistinctScopesNeverCollide(t *testing.T) {
	scopes := allScopes(nastyIDs)
	enc := make([][]byte, len(scopes))
	seen := make(map[string]int, len(scopes))
	for i, s := range scopes {
		e, err := Encode(s)
		if err != nil {
			t.Fatalf("Encode(%s): %v", String(s), err)
		}
		enc[i] = e
		if j, dup := seen[string(e)]; dup {
			t.Fatalf("%s and %s encode equal", String(scopes[j]), String(s))
		}
		seen[string(e)] = i
		back, err := Decode(e)
		if err != nil || !proto.Equal(back, normalize(s)) {
			t.Fatalf("Decode(Encode(%s)) = %s, %v", String(s), String(back), err)
		}
	}
	for i := range scopes {
		for j := range scopes {
			if i == j { // allScopes builds no duplicates
				continue
			}
			if bytes.HasPrefix(enc[j], enc[i]) {
				t.Fatalf("encoding of %s is a prefix of %s", String(scopes[i]), String(scopes[j]))
			}
		}
	}
}

// normalize returns s as Decode returns it (a global scope always holds
// a GlobalScope message).
func normalize(s *typesv1.Scope) *typesv1.Scope {
	if s.GetGlobal() != nil || proto.Equal(s, &typesv1.Scope{Kind: &typesv1.Scope_Global{}}) {
		return Global()
	}
	return s
}

func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"unknown kind", []byte{9, 1, 'a'}},
		{"zero kind", []byte{0}},
		{"truncated length", []byte{1}},
		{"truncated id", []byte{1, 5, 'a'}},
		{"non-minimal length", []byte{1, 0x81, 0x00, 'a'}},
		{"empty id", []byte{1, 0}},
		{"trailing bytes", []byte{4, 'x'}},
		{"agent missing second id", []byte{3, 1, 'w'}},
		{"invalid utf8", []byte{5, 1, 0xff}},
		{"overlong varint", []byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Decode(tt.b)
			if errs.Code(err) != codes.InvalidArgument {
				t.Fatalf("Decode(%v) = %s, %v; want INVALID_ARGUMENT", tt.b, String(s), err)
			}
		})
	}
}

func TestSplit(t *testing.T) {
	e, err := Encode(Agent("w/", "\x00"))
	if err != nil {
		t.Fatal(err)
	}
	s, rest, err := Split(append(e, "../key"...))
	if err != nil || !proto.Equal(s, Agent("w/", "\x00")) || string(rest) != "../key" {
		t.Fatalf("Split = %s, %q, %v", String(s), rest, err)
	}
}

func TestString(t *testing.T) {
	tests := []struct {
		scope *typesv1.Scope
		want  string
	}{
		{nil, "<nil scope>"},
		{&typesv1.Scope{}, "<empty scope>"},
		{Session("s1"), `session:"s1"`},
		{Agent("wf", "a\n1"), `agent:"wf"/"a\n1"`},
		{Global(), "global"},
		{Custom(`a"b`), `custom:"a\"b"`},
		{Workflow("w"), `workflow:"w"`},
	}
	for _, tt := range tests {
		if got := String(tt.scope); got != tt.want {
			t.Errorf("String = %s; want %s", got, tt.want)
		}
	}
}

func TestEqual(t *testing.T) {
	if !Equal(Agent("a", "b"), Agent("a", "b")) || Equal(Agent("a", "b"), Agent("b", "a")) || Equal(nil, nil) {
		t.Fatal("Equal is wrong")
	}
}
