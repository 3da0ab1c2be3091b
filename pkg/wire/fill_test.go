package wire_test

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxDepth bounds how deep the filler nests messages. The layer0 graph is
// acyclic and far shallower; the bound only keeps a future recursive
// message from looping forever. Message fields at this depth stay unset,
// and populated() skips them the same way.
const maxDepth = 12

// wellKnownJSON gives valid values for the well-known types the layer0
// protos use. They are filled from JSON so each gets a legal, non-trivial
// value (nested Value kinds, nanos, non-ASCII text).
var wellKnownJSON = map[protoreflect.FullName]string{
	"google.protobuf.Value":     `{"text": "héllo", "n": 1.5, "yes": true, "none": null, "list": [1, "two", {"three": 3}]}`,
	"google.protobuf.Struct":    `{"tenant": "acme", "weight": 0.25, "tags": ["a", "b"], "nested": {"ok": false}}`,
	"google.protobuf.ListValue": `[1, "two", null]`,
	"google.protobuf.Duration":  `"90061.500000001s"`,
	"google.protobuf.Timestamp": `"2025-01-02T03:04:05.123456789Z"`,
}

// variant is one populated instance of a message type.
type variant struct {
	name string
	msg  proto.Message
}

// variants returns instances of mt that together exercise every oneof
// member and every enum value of the message's own fields: a base with
// every field set (the first member of each oneof, the first non-zero
// value of each enum), then one copy per other oneof member and one per
// enum value. Nested messages are covered when their own type is visited.
func variants(mt protoreflect.MessageType) ([]variant, error) {
	base := mt.New()
	if err := fillMessage(base, 0); err != nil {
		return nil, err
	}
	out := []variant{{name: "base", msg: base.Interface()}}

	md := mt.Descriptor()
	for i := range md.Oneofs().Len() {
		od := md.Oneofs().Get(i)
		if od.IsSynthetic() {
			continue // proto3 optional: always set in the base.
		}
		for j := 1; j < od.Fields().Len(); j++ {
			fd := od.Fields().Get(j)
			m := proto.Clone(base.Interface()).ProtoReflect()
			m.Clear(m.WhichOneof(od))
			if err := fillField(m, fd, 0); err != nil {
				return nil, err
			}
			out = append(out, variant{name: fmt.Sprintf("%s=%s", od.Name(), fd.Name()), msg: m.Interface()})
		}
	}

	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		if fd.IsMap() && fd.MapValue().Kind() == protoreflect.EnumKind {
			// A map with enum values: one copy whose map holds every value.
			m := proto.Clone(base.Interface()).ProtoReflect()
			mp := m.Mutable(fd).Map()
			for j, n := range nonZeroValues(fd.MapValue().Enum()) {
				mp.Set(mapKey(fd.MapKey(), j), protoreflect.ValueOfEnum(n))
			}
			out = append(out, variant{name: fmt.Sprintf("%s=every value", fd.Name()), msg: m.Interface()})
			continue
		}
		if fd.Kind() != protoreflect.EnumKind || fd.IsMap() {
			continue
		}
		for _, n := range nonZeroValues(fd.Enum()) {
			m := proto.Clone(base.Interface()).ProtoReflect()
			if fd.IsList() {
				l := m.NewField(fd).List()
				l.Append(protoreflect.ValueOfEnum(n))
				m.Set(fd, protoreflect.ValueOfList(l))
			} else {
				m.Set(fd, protoreflect.ValueOfEnum(n))
			}
			name := fd.Enum().Values().ByNumber(n).Name()
			out = append(out, variant{name: fmt.Sprintf("%s=%s", fd.Name(), name), msg: m.Interface()})
		}
	}
	return out, nil
}

// fillMessage sets every field of m: all plain fields, all proto3
// optional fields, and the first member of each real oneof.
func fillMessage(m protoreflect.Message, depth int) error {
	md := m.Descriptor()
	if js, ok := wellKnownJSON[md.FullName()]; ok {
		return protojson.Unmarshal([]byte(js), m.Interface())
	}
	if strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
		return fmt.Errorf("no filler for well-known type %s; add it to wellKnownJSON", md.FullName())
	}
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() && od.Fields().Get(0) != fd {
			continue
		}
		if err := fillField(m, fd, depth); err != nil {
			return err
		}
	}
	return nil
}

// fillField sets one field of m: lists and maps get two entries.
func fillField(m protoreflect.Message, fd protoreflect.FieldDescriptor, depth int) error {
	if fd.Message() != nil && !fd.IsMap() && depth+1 >= maxDepth {
		return nil // depth limit; see maxDepth.
	}
	switch {
	case fd.IsList():
		l := m.Mutable(fd).List()
		for i := range 2 {
			v, err := value(fd, i, l.NewElement, depth)
			if err != nil {
				return err
			}
			l.Append(v)
		}
	case fd.IsMap():
		mp := m.Mutable(fd).Map()
		for i := range 2 {
			v, err := value(fd.MapValue(), i, mp.NewValue, depth)
			if err != nil {
				return err
			}
			mp.Set(mapKey(fd.MapKey(), i), v)
		}
	default:
		v, err := value(fd, 0, func() protoreflect.Value { return m.NewField(fd) }, depth)
		if err != nil {
			return err
		}
		m.Set(fd, v)
	}
	return nil
}

// value returns the i-th deterministic value for a singular field, list
// element or map value of fd's kind. newMsg makes an empty message of the
// right type. Every value is non-zero, so presence and proto3 implicit
// fields both show up on the wire.
func value(fd protoreflect.FieldDescriptor, i int, newMsg func() protoreflect.Value, depth int) (protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true), nil
	case protoreflect.EnumKind:
		vals := nonZeroValues(fd.Enum())
		if len(vals) == 0 {
			return protoreflect.Value{}, fmt.Errorf("%s: enum %s has no non-zero value", fd.FullName(), fd.Enum().FullName())
		}
		return protoreflect.ValueOfEnum(vals[i%len(vals)]), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(-123 - int32(i)), nil // negative: 10-byte varint
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(-(1 << 40) - int64(i)), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(4_000_000_000 + uint32(i)), nil // above MaxInt32
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(1<<53 + 1 + uint64(i)), nil // not exact as a float64
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(0.5 + float32(i)), nil
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(0.25 + float64(i)), nil
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s-%d-é✓", fd.Name(), i)), nil
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{0x00, 0xff, byte(i), 'b'}), nil
	case protoreflect.MessageKind, protoreflect.GroupKind:
		v := newMsg()
		return v, fillMessage(v.Message(), depth+1)
	}
	return protoreflect.Value{}, fmt.Errorf("%s: unhandled kind %s", fd.FullName(), fd.Kind())
}

// mapKey returns the i-th key (i is 0 or 1) for a map with key field kd.
func mapKey(kd protoreflect.FieldDescriptor, i int) protoreflect.MapKey {
	switch kd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("key-%d", i)).MapKey()
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(i == 1).MapKey()
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(i) - 1).MapKey()
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(i) - 1).MapKey()
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(i) + 1).MapKey()
	default: // uint64, fixed64: the only key kinds left.
		return protoreflect.ValueOfUint64(uint64(i) + 1).MapKey()
	}
}

// nonZeroValues returns the enum's defined numbers other than 0, in
// declaration order.
func nonZeroValues(ed protoreflect.EnumDescriptor) []protoreflect.EnumNumber {
	var out []protoreflect.EnumNumber
	for i := range ed.Values().Len() {
		if n := ed.Values().Get(i).Number(); n != 0 {
			out = append(out, n)
		}
	}
	return out
}

// populated returns the fields the filler should have set but did not:
// every field except the unset members of a real oneof, recursively, down
// to maxDepth. It guards the filler against silently skipping a field kind.
func populated(m protoreflect.Message, depth int) []string {
	md := m.Descriptor()
	if _, ok := wellKnownJSON[md.FullName()]; ok {
		return nil
	}
	var missing []string
	for i := range md.Oneofs().Len() {
		if od := md.Oneofs().Get(i); !od.IsSynthetic() && m.WhichOneof(od) == nil {
			missing = append(missing, string(od.FullName()))
		}
	}
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() && m.WhichOneof(od) != fd {
			continue
		}
		if fd.Message() != nil && !fd.IsMap() && depth+1 >= maxDepth {
			continue
		}
		if !m.Has(fd) {
			missing = append(missing, string(fd.FullName()))
			continue
		}
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := m.Get(fd).List()
			for j := range l.Len() {
				missing = append(missing, populated(l.Get(j).Message(), depth+1)...)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			m.Get(fd).Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
				missing = append(missing, populated(v.Message(), depth+1)...)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			missing = append(missing, populated(m.Get(fd).Message(), depth+1)...)
		}
	}
	slices.Sort(missing)
	return slices.Compact(missing)
}
