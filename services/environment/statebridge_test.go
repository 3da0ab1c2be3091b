package environment_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/middleware/errmap"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/state"
)

// startState serves an in-memory StateService on loopback.
func startState(t *testing.T) statev1.StateServiceClient {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(errmap.UnaryServerInterceptor()))
	statev1.RegisterStateServiceServer(srv, state.NewServer(state.NewMemory()))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return statev1.NewStateServiceClient(conn)
}

// With a state service configured, an invocation that names a session
// runs (the operator reads its history through the read-only bridge);
// inside, the bridge serves reads and refuses writes.
func TestStateBridge(t *testing.T) {
	requireSandbox(t)
	st := startState(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := st.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("s1"), Key: "notes/x", Value: structpb.NewStringValue("visible")}); err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, envOptions{state: st})
	resp, err := e.client.Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{Message: textContent("hello again"), SessionId: proto.String("s1")},
		Spec:  &environmentv1.EnvironmentSpec{},
	})
	if err != nil {
		t.Fatalf("a session invocation through the bridge: %v", err)
	}
	if !strings.Contains(text(resp), "You said: hello again") {
		t.Errorf("output %q", text(resp))
	}
	// Without a state service, the operator refuses a session clearly.
	plain := startEnv(t, envOptions{})
	_, err = plain.client.Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{Message: textContent("hi"), SessionId: proto.String("s1")},
		Spec:  &environmentv1.EnvironmentSpec{},
	})
	if err == nil {
		t.Error("a session invocation without a state service succeeded")
	}
}

// The bridge itself: reads pass through, writes and deletes are
// PERMISSION_DENIED, and nothing reaches the real store.
func TestStateBridgeReadOnly(t *testing.T) {
	st := startState(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := st.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("s1"), Key: "k", Value: structpb.NewStringValue("v")}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shortTemp(t), "state.sock")
	stop, err := environment.ServeStateBridgeForTest(sock, st)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bridge := statev1.NewStateServiceClient(conn)
	got, err := bridge.Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "k"})
	if err != nil || got.GetValue().GetStringValue() != "v" {
		t.Fatalf("read through the bridge: %v %v", got, err)
	}
	if _, err := bridge.List(ctx, &statev1.ListRequest{Scope: scope.Session("s1")}); err != nil {
		t.Errorf("list: %v", err)
	}
	_, err = bridge.Write(ctx, &statev1.WriteRequest{Scope: scope.Session("s1"), Key: "k", Value: structpb.NewStringValue("overwritten")})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "write_memory") {
		t.Errorf("write through the bridge: %v", err)
	}
	_, err = bridge.Delete(ctx, &statev1.DeleteRequest{Scope: scope.Session("s1"), Key: "k"})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("delete through the bridge: %v", err)
	}
	if got, _ := st.Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "k"}); got.GetValue().GetStringValue() != "v" {
		t.Errorf("the store changed: %v", got)
	}
	// A missing key keeps its code through the bridge.
	if _, err := bridge.Read(ctx, &statev1.ReadRequest{Scope: scope.Session("s1"), Key: "missing"}); status.Code(err) != codes.NotFound {
		t.Errorf("missing key: %v", err)
	}
}
