package grpcclient

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/msgsize"
)

// echoState returns, on Read, the value of the last Write.
type echoState struct {
	statev1.UnimplementedStateServiceServer
	last *structpb.Value
}

func (e *echoState) Write(_ context.Context, req *statev1.WriteRequest) (*statev1.WriteResponse, error) {
	e.last = req.GetValue()
	return &statev1.WriteResponse{Revision: 1}, nil
}

func (e *echoState) Read(context.Context, *statev1.ReadRequest) (*statev1.ReadResponse, error) {
	return &statev1.ReadResponse{Value: e.last, Revision: 1}, nil
}

// A message larger than grpc-go's default 4 MiB receive limit, and up to
// the servers' limit, goes both ways between a server built by
// grpcserver and a client dialled by Dial; a larger one is refused with
// RESOURCE_EXHAUSTED before it is sent.
func TestMessagesUpToTheServersLimit(t *testing.T) {
	srv, err := grpcserver.New(grpcserver.Config{Name: "test", Addr: "127.0.0.1:0", Dev: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fake := &echoState{}
	statev1.RegisterStateServiceServer(srv, fake)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	conn, err := Dial(Config{Target: lis.Addr().String(), Dev: true, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := statev1.NewStateServiceClient(conn)
	sc := &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}

	for _, size := range []int{5 << 20, msgsize.Max - 1024} {
		big := structpb.NewStringValue(strings.Repeat("x", size))
		if _, err := c.Write(context.Background(), &statev1.WriteRequest{Scope: sc, Key: "k", Value: big}); err != nil {
			t.Fatalf("sending %d bytes: %v", size, err)
		}
		resp, err := c.Read(context.Background(), &statev1.ReadRequest{Scope: sc, Key: "k"})
		if err != nil {
			t.Fatalf("receiving %d bytes: %v", size, err)
		}
		if got := len(resp.GetValue().GetStringValue()); got != size {
			t.Fatalf("received %d bytes, want %d", got, size)
		}
	}
	tooBig := structpb.NewStringValue(strings.Repeat("x", msgsize.Max+1))
	_, err = c.Write(context.Background(), &statev1.WriteRequest{Scope: sc, Key: "k", Value: tooBig})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("sending more than msgsize.Max: %v, want RESOURCE_EXHAUSTED", err)
	}
}
