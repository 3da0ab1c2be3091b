package grpcserver

import (
	"context"
	"flag"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/secbear/neuron/pkg/flagenv"
	"github.com/secbear/neuron/pkg/telemetry/telemetrytest"
)

// --otel-endpoint, a flag every service has through BindFlags, exports a
// server span per call, flushed when Serve returns.
func TestOTelEndpointExportsCalls(t *testing.T) {
	r := telemetrytest.Start(t)
	cfg := Config{Name: "probe", Addr: "127.0.0.1:0"}
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	cfg.BindFlags(fs)
	if err := flagenv.Parse(fs, "NEURON_PROBE", []string{"--dev", "--otel-endpoint", r.GRPCAddr}, func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	spans := telemetrytest.Named(r.Spans(), "grpc.health.v1.Health/Check")
	if len(spans) != 1 || spans[0].Service != "neuron-probe" {
		t.Fatalf("want one server span of neuron-probe, got %+v", r.Spans())
	}
}
