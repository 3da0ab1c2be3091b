package orchestrator

import (
	"context"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/google/go-cmp/cmp"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
)

// knownJSON gives the well-known types a non-trivial value.
var knownJSON = map[protoreflect.FullName]string{
	"google.protobuf.Value":     `{"text": "héllo", "n": 1.5, "yes": true, "none": null, "list": [1, "two", {"three": 3}]}`,
	"google.protobuf.Struct":    `{"tenant": "acme", "weight": 0.25, "tags": ["a", "b"], "nested": {"ok": false}}`,
	"google.protobuf.ListValue": `[1, "two", null]`,
	"google.protobuf.Duration":  `"-90061.500000001s"`,
	"google.protobuf.Timestamp": `"2025-01-02T03:04:05.123Z"`,
}

// fill sets every field of m (each oneof's member i modulo its size, each
// enum its value i modulo its count), recursively to depth 8.
func fill(t testing.TB, m protoreflect.Message, i, depth int) {
	t.Helper()
	if js, ok := knownJSON[m.Descriptor().FullName()]; ok {
		if err := protojson.Unmarshal([]byte(js), m.Interface()); err != nil {
			t.Fatal(err)
		}
		return
	}
	if depth > 8 {
		return
	}
	fds := m.Descriptor().Fields()
	for j := range fds.Len() {
		fd := fds.Get(j)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() && od.Fields().Get(i%od.Fields().Len()) != fd {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for k := range 2 {
				if fd.Message() != nil {
					e := l.NewElement()
					fill(t, e.Message(), i+k, depth+1)
					l.Append(e)
				} else {
					l.Append(scalar(fd, i+k))
				}
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for k := range 2 {
				key := scalar(fd.MapKey(), i+k).MapKey()
				if fd.MapValue().Message() != nil {
					v := mp.NewValue()
					fill(t, v.Message(), i+k, depth+1)
					mp.Set(key, v)
				} else {
					mp.Set(key, scalar(fd.MapValue(), i+k))
				}
			}
		case fd.Message() != nil:
			fill(t, m.Mutable(fd).Message(), i, depth+1)
		default:
			m.Set(fd, scalar(fd, i))
		}
	}
}

// scalar is a non-zero value of fd's kind.
func scalar(fd protoreflect.FieldDescriptor, i int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(strings.Repeat("ü", i+1) + string(fd.Name()))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{0xff, byte(i), 0})
	case protoreflect.EnumKind:
		vs := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vs.Get((i + 1) % vs.Len()).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(-7 - i))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(7 + i))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(math.MinInt64 + int64(i))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(math.MaxUint64 - uint64(i))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(0.1 + float32(i))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64([]float64{0.1, math.NaN(), math.Inf(1), math.Inf(-1)}[i%4])
	}
	panic(fd.Kind())
}

// TestTranscriptValue checks that a transcript entry is stored as the
// Value protojson's text decodes to (what WriteTranscript wrote before
// it built the Value directly), for every field of a TranscriptStep and
// of the operator's input and output in it: oneof members, enums, 64-bit
// integers, bytes, maps, special floats and the well-known types.
func TestTranscriptValue(t *testing.T) {
	for i := range 4 {
		rec := &orchestratorv1.TranscriptStep{}
		fill(t, rec.ProtoReflect(), i, 0)
		want, err := viaJSON(rec.ProtoReflect())
		if err != nil {
			t.Fatal(err)
		}
		got, err := valueOf(rec.ProtoReflect())
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("variant %d: valueOf differs from protojson's (-want +got):\n%s", i, diff)
		}
	}
}

// TestTranscriptValueRefuses checks that what protojson cannot encode
// is refused, not stored: the entry would break every GetTranscript page
// holding it.
func TestTranscriptValueRefuses(t *testing.T) {
	for name, rec := range map[string]*orchestratorv1.TranscriptStep{
		"invalid UTF-8":        {AgentId: "a\xff"},
		"a Value without kind": {ToolCalls: []*orchestratorv1.TranscriptToolCall{{Input: &structpb.Value{}}}},
		"a NaN in a Value":     {ToolCalls: []*orchestratorv1.TranscriptToolCall{{Input: structpb.NewNumberValue(math.NaN())}}},
		"a key not UTF-8":      {ToolCalls: []*orchestratorv1.TranscriptToolCall{{Input: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"\xff": structpb.NewNullValue()}})}}},
		"a time out of range":  {StartTime: &timestamppb.Timestamp{Seconds: -1e12}},
	} {
		if _, err := viaJSON(rec.ProtoReflect()); err == nil {
			t.Fatalf("%s: protojson encodes it; the case tests nothing", name)
		}
		if v, err := valueOf(rec.ProtoReflect()); err == nil {
			t.Errorf("%s: valueOf = %v, want an error", name, v)
		}
		// WriteTranscript fails INTERNAL without calling State.
		st := &countingState{}
		if err := WriteTranscript(context.Background(), st, "wf", rec); err == nil || st.n != 0 {
			t.Errorf("%s: WriteTranscript = %v after %d writes, want an error and none", name, err, st.n)
		}
	}
}

// BenchmarkWriteTranscript is the orchestrator's side of a transcript
// write (the State call answered at once), for a filled entry.
func BenchmarkWriteTranscript(b *testing.B) {
	rec := &orchestratorv1.TranscriptStep{}
	fill(b, rec.ProtoReflect(), 0, 0)
	st := &countingState{}
	b.ReportAllocs()
	for b.Loop() {
		if err := WriteTranscript(context.Background(), st, "wf", rec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTranscriptValue compares building a filled entry's Value
// directly (valueOf, what WriteTranscript does) with protojson's text
// parsed back (viaJSON, what it did before).
func BenchmarkTranscriptValue(b *testing.B) {
	rec := &orchestratorv1.TranscriptStep{}
	fill(b, rec.ProtoReflect(), 0, 0)
	for name, encode := range map[string]func(protoreflect.Message) (*structpb.Value, error){"direct": valueOf, "protojson": viaJSON} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := encode(rec.ProtoReflect()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type countingState struct {
	statev1.StateServiceClient
	n int
}

// Write encodes the request, as the gRPC client would.
func (s *countingState) Write(_ context.Context, req *statev1.WriteRequest, _ ...grpc.CallOption) (*statev1.WriteResponse, error) {
	s.n++
	_, err := proto.Marshal(req)
	return &statev1.WriteResponse{}, err
}
