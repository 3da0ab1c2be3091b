package scope

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// build makes a scope of kind k%5 from ids a and b.
func build(k uint8, a, b string) *typesv1.Scope {
	switch k % 5 {
	case 0:
		return Session(a)
	case 1:
		return Workflow(a)
	case 2:
		return Agent(a, b)
	case 3:
		return Global()
	default:
		return Custom(a)
	}
}

// FuzzEncode checks, for two arbitrary scopes and keys, that the encoding
// round-trips, that distinct scopes never encode equal, that no scope's
// encoding prefixes another scope's key space, and that scope+key
// composition is injective.
func FuzzEncode(f *testing.F) {
	f.Add(uint8(0), "a", "", "k", uint8(0), "a", "", "k")
	f.Add(uint8(0), "a", "", "\x01bk", uint8(0), "a\x01b", "", "k")
	f.Add(uint8(2), "w", "a", "/x", uint8(2), "w/a", "", "x")
	f.Add(uint8(2), "w\x00", "a", "", uint8(2), "w", "\x00a", "")
	f.Add(uint8(3), "", "", "\x01\x01a", uint8(0), "a", "", "")
	f.Add(uint8(4), "..", "", "../../etc", uint8(1), "..", "", "../../etc")
	f.Fuzz(func(t *testing.T, k1 uint8, a1, b1, key1 string, k2 uint8, a2, b2, key2 string) {
		s1, s2 := build(k1, a1, b1), build(k2, a2, b2)
		e1, err1 := Encode(s1)
		e2, err2 := Encode(s2)
		if (err1 == nil) != (Validate(s1) == nil) || (err2 == nil) != (Validate(s2) == nil) {
			t.Fatalf("Encode and Validate disagree: %v / %v", err1, err2)
		}
		if err1 != nil || err2 != nil {
			return
		}
		for _, c := range []struct {
			s *typesv1.Scope
			e []byte
		}{{s1, e1}, {s2, e2}} {
			back, err := Decode(c.e)
			if err != nil || !proto.Equal(back, c.s) {
				t.Fatalf("Decode(Encode(%s)) = %s, %v", String(c.s), String(back), err)
			}
		}
		same := proto.Equal(s1, s2)
		if same != bytes.Equal(e1, e2) {
			t.Fatalf("%s vs %s: proto.Equal=%v but encodings equal=%v", String(s1), String(s2), same, !same)
		}
		c1 := append(bytes.Clone(e1), key1...)
		c2 := append(bytes.Clone(e2), key2...)
		if bytes.HasPrefix(c2, e1) && !same {
			t.Fatalf("key %q of %s falls under the prefix of %s", key2, String(s2), String(s1))
		}
		if bytes.Equal(c1, c2) != (same && key1 == key2) {
			t.Fatalf("composition not injective: %s+%q vs %s+%q", String(s1), key1, String(s2), key2)
		}
	})
}

// FuzzDecode checks that Decode never panics and accepts only what Encode
// produces.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{1, 1, 'a'})
	f.Add([]byte{3, 1, 'w', 1, 'a'})
	f.Add([]byte{4})
	f.Add([]byte{1, 0x80, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err != nil {
			return
		}
		e, err := Encode(s)
		if err != nil || !bytes.Equal(e, b) {
			t.Fatalf("Decode(%v) = %s but Encode gives %v, %v", b, String(s), e, err)
		}
	})
}
