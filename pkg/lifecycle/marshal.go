package lifecycle

import (
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
)

// Marshal is proto.Marshal of ev (bytes of the same size that parse to
// the same event; only the order of fields differs), faster for an
// observable event: protobuf encodes the map of a
// google.protobuf.Struct through reflection, computing every entry's size
// apart, which made encoding most of an orchestrator's event log's cost.
// Here the event's data is encoded by hand (a Value, a Struct, a
// ListValue, as protobuf lays them out) and the rest by proto.Marshal.
// Data that proto.Marshal would refuse (a string that is not UTF-8) or
// that this encoder does not know (unknown fields) goes to proto.Marshal
// whole. ev is read, never changed.
func Marshal(ev *lifecyclev1.LifecycleEvent) ([]byte, error) {
	obs := ev.GetObservable()
	data := obs.GetData()
	if data == nil || !plainValue(data) || len(obs.ProtoReflect().GetUnknown()) > 0 || len(ev.ProtoReflect().GetUnknown()) > 0 {
		return proto.Marshal(ev)
	}
	// The envelope without its event, then the event (field 12) without
	// its data, then the data (field 4 of the event): each field once,
	// which a parser reads as proto.Marshal's order.
	env := &lifecyclev1.LifecycleEvent{Sequence: ev.Sequence, Time: ev.Time, WorkflowId: ev.WorkflowId, AgentId: ev.AgentId,
		CorrelationId: ev.CorrelationId, WorkflowSequence: ev.WorkflowSequence}
	head := &lifecyclev1.ObservableEvent{Source: obs.Source, EventType: obs.EventType, SinceWorkflowStart: obs.SinceWorkflowStart, TraceId: obs.TraceId}
	dataSize := valueSize(data)
	size := proto.Size(head) + protowire.SizeTag(fieldData) + protowire.SizeBytes(dataSize)
	b, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, 0, proto.Size(env)+protowire.SizeTag(fieldObservable)+protowire.SizeBytes(size)), env)
	if err != nil {
		return nil, err
	}
	b = protowire.AppendTag(b, fieldObservable, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	if b, err = (proto.MarshalOptions{}).MarshalAppend(b, head); err != nil {
		return nil, err
	}
	b = protowire.AppendTag(b, fieldData, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(dataSize))
	return appendValue(b, data), nil
}

// Field numbers: LifecycleEvent.observable, ObservableEvent.data, and
// those of google.protobuf.Value, Struct (and its map entries) and
// ListValue.
const (
	fieldObservable protowire.Number = 12
	fieldData       protowire.Number = 4

	valueNull   protowire.Number = 1
	valueNumber protowire.Number = 2
	valueString protowire.Number = 3
	valueBool   protowire.Number = 4
	valueStruct protowire.Number = 5
	valueList   protowire.Number = 6

	structFields protowire.Number = 1
	entryKey     protowire.Number = 1
	entryValue   protowire.Number = 2
	listValues   protowire.Number = 1
)

// plainValue says whether v holds nothing appendValue does not encode
// as proto.Marshal would: no unknown fields, no string that is not
// UTF-8 (proto.Marshal refuses those), no nil inside a struct or list.
func plainValue(v *structpb.Value) bool {
	if v == nil || len(v.ProtoReflect().GetUnknown()) > 0 {
		return false
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return utf8.ValidString(k.StringValue)
	case *structpb.Value_StructValue:
		s := k.StructValue
		if s == nil || len(s.ProtoReflect().GetUnknown()) > 0 {
			return false
		}
		for key, f := range s.Fields {
			if !utf8.ValidString(key) || !plainValue(f) {
				return false
			}
		}
	case *structpb.Value_ListValue:
		l := k.ListValue
		if l == nil || len(l.ProtoReflect().GetUnknown()) > 0 {
			return false
		}
		for _, e := range l.Values {
			if !plainValue(e) {
				return false
			}
		}
	}
	return true
}

// valueSize is the encoded size of v (a plainValue).
func valueSize(v *structpb.Value) int {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		return protowire.SizeTag(valueNull) + protowire.SizeVarint(uint64(k.NullValue))
	case *structpb.Value_NumberValue:
		return protowire.SizeTag(valueNumber) + protowire.SizeFixed64()
	case *structpb.Value_StringValue:
		return protowire.SizeTag(valueString) + protowire.SizeBytes(len(k.StringValue))
	case *structpb.Value_BoolValue:
		return protowire.SizeTag(valueBool) + protowire.SizeVarint(protowire.EncodeBool(k.BoolValue))
	case *structpb.Value_StructValue:
		return protowire.SizeTag(valueStruct) + protowire.SizeBytes(structSize(k.StructValue))
	case *structpb.Value_ListValue:
		return protowire.SizeTag(valueList) + protowire.SizeBytes(listSize(k.ListValue))
	}
	return 0 // no kind set: an empty message
}

// entrySize is the size of a map entry: protobuf writes its key and its
// value even when empty.
func entrySize(key string, v *structpb.Value) int {
	return protowire.SizeTag(entryKey) + protowire.SizeBytes(len(key)) + protowire.SizeTag(entryValue) + protowire.SizeBytes(valueSize(v))
}

func structSize(s *structpb.Struct) int {
	n := 0
	for key, f := range s.Fields {
		n += protowire.SizeTag(structFields) + protowire.SizeBytes(entrySize(key, f))
	}
	return n
}

func listSize(l *structpb.ListValue) int {
	n := 0
	for _, e := range l.Values {
		n += protowire.SizeTag(listValues) + protowire.SizeBytes(valueSize(e))
	}
	return n
}

// appendValue appends v's encoding (a plainValue).
func appendValue(b []byte, v *structpb.Value) []byte {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		b = protowire.AppendTag(b, valueNull, protowire.VarintType)
		return protowire.AppendVarint(b, uint64(k.NullValue))
	case *structpb.Value_NumberValue:
		b = protowire.AppendTag(b, valueNumber, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, math.Float64bits(k.NumberValue))
	case *structpb.Value_StringValue:
		b = protowire.AppendTag(b, valueString, protowire.BytesType)
		return protowire.AppendString(b, k.StringValue)
	case *structpb.Value_BoolValue:
		b = protowire.AppendTag(b, valueBool, protowire.VarintType)
		return protowire.AppendVarint(b, protowire.EncodeBool(k.BoolValue))
	case *structpb.Value_StructValue:
		b = protowire.AppendTag(b, valueStruct, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(structSize(k.StructValue)))
		for key, f := range k.StructValue.Fields {
			b = protowire.AppendTag(b, structFields, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(entrySize(key, f)))
			b = protowire.AppendTag(b, entryKey, protowire.BytesType)
			b = protowire.AppendString(b, key)
			b = protowire.AppendTag(b, entryValue, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(valueSize(f)))
			b = appendValue(b, f)
		}
		return b
	case *structpb.Value_ListValue:
		b = protowire.AppendTag(b, valueList, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(listSize(k.ListValue)))
		for _, e := range k.ListValue.Values {
			b = protowire.AppendTag(b, listValues, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(valueSize(e)))
			b = appendValue(b, e)
		}
		return b
	}
	return b
}
