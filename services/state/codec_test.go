package state

import (
	"bytes"
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/scope"
)

// overlong is a Value whose string_value is "v", with the length prefix
// of the string written in two bytes (0x81 0x00) instead of one: a
// decoder accepts it, an encoder never writes it, so stored bytes equal
// to it were stored as they arrived.
var overlong = []byte{byte(protowire.EncodeTag(3, protowire.BytesType)), 0x81, 0x00, 'v'}

// writeRequestBytes is an encoded WriteRequest for key k in session s
// whose value field holds each of values, as given.
func writeRequestBytes(t *testing.T, k string, values ...[]byte) []byte {
	t.Helper()
	b, err := proto.Marshal(&statev1.WriteRequest{Scope: scope.Session("s"), Key: k})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		b = protowire.AppendTag(b, valueField, protowire.BytesType)
		b = protowire.AppendBytes(b, v)
	}
	return b
}

// A Write that came through the server's codec stores the value's bytes
// as they arrived; one that did not (a value written in process, or a
// value field the decoder merged from two) stores the value encoded.
func TestWriteStoresReceivedBytes(t *testing.T) {
	stored := func(t *testing.T, st *Memory, k string) []byte {
		t.Helper()
		enc, err := scope.Encode(scope.Session("s"))
		if err != nil {
			t.Fatal(err)
		}
		d := st.docs[string(enc)+k]
		if d == nil {
			t.Fatalf("key %q not stored", k)
		}
		return d.raw
	}
	decode := func(t *testing.T, b []byte) *statev1.WriteRequest {
		t.Helper()
		req := &statev1.WriteRequest{}
		if err := (receivingCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, req); err != nil {
			t.Fatal(err)
		}
		return req
	}
	st := NewMemory()
	defer st.Close()
	s := scope.Session("s")

	req := decode(t, writeRequestBytes(t, "received", overlong))
	if req.GetValue().GetStringValue() != "v" {
		t.Fatalf("decoded value %v, want \"v\"", req.GetValue())
	}
	if _, err := st.Write(context.Background(), s, "received", req.GetValue(), Guard{}); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, st, "received"); !bytes.Equal(got, overlong) {
		t.Errorf("stored %x, want the received bytes %x", got, overlong)
	}
	// The bytes are taken once: writing the same value again encodes it.
	if _, err := st.Write(context.Background(), s, "again", req.GetValue(), Guard{}); err != nil {
		t.Fatal(err)
	}
	canonical, _ := proto.Marshal(structpb.NewStringValue("v"))
	if got := stored(t, st, "again"); !bytes.Equal(got, canonical) {
		t.Errorf("second write stored %x, want the encoding %x", got, canonical)
	}

	// Two occurrences of the field are merged into one value: no one
	// of them is its encoding.
	other, _ := proto.Marshal(structpb.NewStringValue("w"))
	req = decode(t, writeRequestBytes(t, "merged", overlong, other))
	if _, err := st.Write(context.Background(), s, "merged", req.GetValue(), Guard{}); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Read(context.Background(), s, "merged"); err != nil || got.Value.GetStringValue() != "w" {
		t.Fatalf("merged value read back as %v, %v; want \"w\"", got.Value, err)
	}
	if got := stored(t, st, "merged"); bytes.Contains(got, overlong) {
		t.Errorf("stored %x, one of the occurrences as received", got)
	}

	// A value written in process was never received: it is encoded.
	if _, err := st.Write(context.Background(), s, "local", structpb.NewStringValue("v"), Guard{}); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, st, "local"); !bytes.Equal(got, canonical) {
		t.Errorf("in-process write stored %x, want %x", got, canonical)
	}
}

func TestSingleValueBytes(t *testing.T) {
	one := writeRequestBytes(t, "k", overlong)
	if got, ok := singleValueBytes(one); !ok || !bytes.Equal(got, overlong) {
		t.Errorf("one value: %x, %v; want %x", got, ok, overlong)
	}
	if _, ok := singleValueBytes(writeRequestBytes(t, "k")); ok {
		t.Error("no value field: found one")
	}
	if _, ok := singleValueBytes(writeRequestBytes(t, "k", overlong, overlong)); ok {
		t.Error("two value fields: took one")
	}
	if _, ok := singleValueBytes(one[:len(one)-1]); ok {
		t.Error("cut short: took a value")
	}
}

// Through Run (which installs the codec), values of every shape read back
// as they were written.
func TestRunValuesRoundTrip(t *testing.T) {
	store := NewMemory()
	defer store.Close()
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return Run(ctx, Config{Server: devServer, Listener: lis, Store: store})
	})
	c := statev1.NewStateServiceClient(harness.Dial(t, addr))
	v, err := structpb.NewValue(map[string]any{
		"version": 1, "messages": []any{map[string]any{"role": "user", "content": map[string]any{"text": "héllo", "n": -2.5, "ok": true, "none": nil}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := scope.Session("s")
	if _, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "entry", Value: v}); err != nil {
		t.Fatal(err)
	}
	got, err := c.Read(ctx, &statev1.ReadRequest{Scope: s, Key: "entry"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.GetValue(), v) {
		t.Fatalf("read back %v, want %v", got.GetValue(), v)
	}
}

// rewriteInPlace is a StoreMiddleware that changes a Write's value in
// place, as a policy that redacts a value could.
type rewriteInPlace struct{}

func (rewriteInPlace) StoreServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if w, ok := req.(*statev1.WriteRequest); ok {
			w.GetValue().Kind = &structpb.Value_StringValue{StringValue: "rewritten"}
		}
		return h(ctx, req)
	}
}

// Behind a middleware, a Write stores the value the middleware passed
// on, not the bytes it arrived in.
func TestRunMiddlewareRewriteStored(t *testing.T) {
	store := NewMemory()
	defer store.Close()
	s := scope.Session("s")
	t.Run("serve", func(t *testing.T) {
		addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
			return Run(ctx, Config{Server: devServer, Listener: lis, Store: store, Middleware: rewriteInPlace{}})
		})
		c := statev1.NewStateServiceClient(harness.Dial(t, addr))
		if _, err := c.Write(ctx, &statev1.WriteRequest{Scope: s, Key: "k", Value: str("original")}); err != nil {
			t.Fatal(err)
		}
	})
	if got, err := store.Read(ctx, s, "k"); err != nil || got.Value.GetStringValue() != "rewritten" {
		t.Fatalf("stored %v, %v; want the middleware's \"rewritten\"", got.Value, err)
	}
}
