package state

import (
	"bytes"
	"runtime"
	"sync"
	"weak"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers protoCodec
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
)

// A Write's value arrives encoded, is decoded for the checks (shape, JSON
// size) and the interceptors, and used to be encoded again for storage:
// a conversation entry's encoding was 3-7% of the service's CPU on the
// dispatched path. The server's codec (receivingCodec) keeps the bytes
// each WriteRequest's value was decoded from, and prepareWrite stores
// those instead of encoding the value again. They decode to the same
// value, so a Read cannot tell.

// protoCodec is grpc-go's proto codec, which receivingCodec wraps.
var protoCodec = encoding.GetCodecV2("proto")

// valueField is WriteRequest.value's field number.
var valueField = (&statev1.WriteRequest{}).ProtoReflect().Descriptor().Fields().ByName("value").Number()

// receivingCodec is grpc-go's proto codec, which also remembers the
// bytes of each WriteRequest's value it decodes (received). Run installs
// it only when no middleware sits in front of the service: a middleware
// could change a value in place after it was decoded, and the bytes
// would no longer be its encoding.
type receivingCodec struct{}

func (receivingCodec) Name() string { return protoCodec.Name() }

func (receivingCodec) Marshal(v any) (mem.BufferSlice, error) { return protoCodec.Marshal(v) }

func (receivingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*statev1.WriteRequest)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if err := proto.Unmarshal(b, req); err != nil {
		return err
	}
	if req.Value != nil {
		if raw, ok := singleValueBytes(b); ok {
			received.put(req.Value, raw)
		}
	}
	return nil
}

// singleValueBytes returns a copy of the bytes of the value field of the
// encoded WriteRequest b, when it holds exactly one. A field that occurs
// more than once is merged by the decoder, so no one occurrence is the
// value's encoding: false, and the value is encoded as before.
func singleValueBytes(b []byte) ([]byte, bool) {
	var raw []byte
	found := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil, false
		}
		if num == valueField {
			if typ != protowire.BytesType {
				return nil, false
			}
			raw, _ = protowire.ConsumeBytes(b[:m])
			found++
		}
		b = b[m:]
	}
	if found != 1 {
		return nil, false
	}
	return bytes.Clone(raw), true
}

// receivedValues maps a decoded value to the bytes it was decoded from.
// It holds the values weakly: an entry that no Write takes (its request
// was refused before the handler) goes when its value is collected.
type receivedValues struct{ m sync.Map } // weak.Pointer[structpb.Value] -> []byte

// received holds what the server's codec decoded.
var received receivedValues

func (r *receivedValues) put(v *structpb.Value, raw []byte) {
	wp := weak.Make(v)
	r.m.Store(wp, raw)
	runtime.AddCleanup(v, func(wp weak.Pointer[structpb.Value]) { r.m.Delete(wp) }, wp)
}

// take returns and forgets the bytes v was decoded from, if the codec
// decoded it.
func (r *receivedValues) take(v *structpb.Value) ([]byte, bool) {
	raw, ok := r.m.LoadAndDelete(weak.Make(v))
	if !ok {
		return nil, false
	}
	return raw.([]byte), true
}
