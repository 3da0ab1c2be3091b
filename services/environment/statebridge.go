package environment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/middleware/errmap"
)

// stateReader is the StateService an invocation sees: Read, List and
// Search go to the real state service; Write and Delete are refused, so
// the read/write asymmetry (operators declare effects, the orchestrator
// writes) holds inside the sandbox whatever the operator runs.
type stateReader struct {
	statev1.UnimplementedStateServiceServer
	client statev1.StateServiceClient
}

func (r stateReader) Read(ctx context.Context, req *statev1.ReadRequest) (*statev1.ReadResponse, error) {
	resp, err := r.client.Read(ctx, req)
	return resp, errs.FromGRPC(err)
}

func (r stateReader) List(ctx context.Context, req *statev1.ListRequest) (*statev1.ListResponse, error) {
	resp, err := r.client.List(ctx, req)
	return resp, errs.FromGRPC(err)
}

func (r stateReader) Search(ctx context.Context, req *statev1.SearchRequest) (*statev1.SearchResponse, error) {
	resp, err := r.client.Search(ctx, req)
	return resp, errs.FromGRPC(err)
}

func (stateReader) Write(context.Context, *statev1.WriteRequest) (*statev1.WriteResponse, error) {
	return nil, fmt.Errorf("an invocation has read-only access to state; declare a write_memory effect instead: %w", errs.PermissionDenied)
}

func (stateReader) Delete(context.Context, *statev1.DeleteRequest) (*statev1.DeleteResponse, error) {
	return nil, fmt.Errorf("an invocation has read-only access to state; declare a delete_memory effect instead: %w", errs.PermissionDenied)
}

// serveStateBridge serves a read-only StateService forwarding to client
// on a Unix socket at path, for one invocation (its session history).
func serveStateBridge(path string, client statev1.StateServiceClient, log *slog.Logger) (func(), error) {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("state bridge: %w", err)
	}
	// The sandboxed operator may run as another uid.
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("state bridge: %w", err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(errmap.UnaryServerInterceptor(errmap.WithLogger(log))))
	statev1.RegisterStateServiceServer(srv, stateReader{client: client})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			log.Warn("state bridge stopped", "error", err.Error())
		}
	}()
	return func() {
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			srv.Stop()
		}
		<-done
		_ = os.Remove(path)
	}, nil
}
