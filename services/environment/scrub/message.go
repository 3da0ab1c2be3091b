package scrub

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// anyName is the full name of google.protobuf.Any.
const anyName protoreflect.FullName = "google.protobuf.Any"

// Message scrubs every string field of m in place, recursively, and
// returns the number of replacements made. A nil m does nothing.
//
// It walks set fields by reflection: singular, oneof, repeated and map
// fields, extensions and nested messages at any depth.
// google.protobuf.Struct, Value and ListValue are ordinary messages to
// this walk, so JSON payloads are covered. String map keys are scrubbed
// too; an entry whose key changes is moved to the new key, and if two
// keys scrub to the same text the later ones (in sorted key order) get a
// "#2", "#3", ... suffix rather than overwrite each other. A bytes field
// is scrubbed when it is valid UTF-8 (text carried as bytes) and left as
// it is otherwise (images, serialized messages).
//
// A google.protobuf.Any is skipped whole: its value is a serialized
// message that Message does not decode, and scrubbing its bytes as text
// could corrupt it. Unpack an Any and scrub the result if it can carry
// secrets.
//
// Unknown fields cannot be walked; when the raw bytes of a message's
// unknown fields contain anything to replace, they are dropped and the
// replacements counted.
func (s *Scrubber) Message(m proto.Message) int {
	if m == nil {
		return 0
	}
	r := m.ProtoReflect()
	if !r.IsValid() {
		return 0
	}
	return s.message(r)
}

func (s *Scrubber) message(m protoreflect.Message) int {
	if m.Descriptor().FullName() == anyName {
		return 0
	}
	n := 0
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			n += s.mapField(fd, v.Map())
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				nv, k, set := s.value(fd.Kind(), l.Get(i))
				if set {
					l.Set(i, nv)
				}
				n += k
			}
		default:
			nv, k, set := s.value(fd.Kind(), v)
			if set {
				m.Set(fd, nv)
			}
			n += k
		}
		return true
	})
	if raw := m.GetUnknown(); len(raw) > 0 {
		if _, k := s.scrub(string(raw)); k > 0 {
			m.SetUnknown(nil)
			n += k
		}
	}
	return n
}

// value scrubs one singular value of kind k and returns the number of
// replacements. A message is scrubbed in place; a string or bytes value
// with replacements is returned replaced, with set true, for the caller
// to store.
func (s *Scrubber) value(k protoreflect.Kind, v protoreflect.Value) (_ protoreflect.Value, n int, set bool) {
	switch k {
	case protoreflect.StringKind:
		out, n := s.scrub(v.String())
		return protoreflect.ValueOfString(out), n, n > 0
	case protoreflect.BytesKind:
		b := v.Bytes()
		if !utf8.Valid(b) {
			return v, 0, false
		}
		out, n := s.scrub(string(b))
		if n == 0 {
			return v, 0, false
		}
		return protoreflect.ValueOfBytes([]byte(out)), n, true
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return v, s.message(v.Message()), false
	}
	return v, 0, false
}

// mapField scrubs the keys and values of a map field in place.
func (s *Scrubber) mapField(fd protoreflect.FieldDescriptor, m protoreflect.Map) int {
	var keys []protoreflect.MapKey
	m.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
		keys = append(keys, k)
		return true
	})
	stringKeys := fd.MapKey().Kind() == protoreflect.StringKind
	if stringKeys {
		// Sorted, so that the suffixes of colliding keys are deterministic.
		slices.SortFunc(keys, func(a, b protoreflect.MapKey) int {
			return strings.Compare(a.String(), b.String())
		})
	}
	type entry struct {
		key string
		val protoreflect.Value
	}
	var moved []entry
	n := 0
	for _, k := range keys {
		nv, c, set := s.value(fd.MapValue().Kind(), m.Get(k))
		if set {
			m.Set(k, nv)
		}
		n += c
		if !stringKeys {
			continue
		}
		key, c := s.scrub(k.String())
		if c == 0 {
			continue
		}
		n += c
		moved = append(moved, entry{key, m.Get(k)})
		m.Clear(k)
	}
	for _, e := range moved {
		key := e.key
		for i := 2; m.Has(protoreflect.ValueOfString(key).MapKey()); i++ {
			key = fmt.Sprintf("%s#%d", e.key, i)
		}
		m.Set(protoreflect.ValueOfString(key).MapKey(), e.val)
	}
	return n
}
