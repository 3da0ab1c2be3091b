package grpcserver

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/interceptor/auth"
)

// echoOperator answers every Execute at once with an output of the size
// the operator benchmark's invocations return, so that what is measured
// is the hop: grpcclient, the transport and the standard chain.
type echoOperator struct {
	operatorv1.UnimplementedOperatorServiceServer
}

func (echoOperator) Execute(context.Context, *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	return &operatorv1.ExecuteResponse{Output: &operatorv1.OperatorOutput{
		Message:    content.Text("done"),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata: &operatorv1.OperatorMetadata{
			TokensIn: 120, TokensOut: 12, TurnsUsed: 2, Model: "mock-1", Provider: "openai-compatible",
			Duration: durationpb.New(time.Millisecond),
		},
	}}, nil
}

// BenchmarkUnaryHop is one Execute through grpcclient and a Server over
// loopback TCP, the handler doing nothing: the CPU (client and server,
// from getrusage) and allocations of the hop alone.
func BenchmarkUnaryHop(b *testing.B) {
	b.Run("dev", func(b *testing.B) { benchHop(b, Config{Dev: true}, grpcclient.Config{Dev: true}) })
	b.Run("auth", func(b *testing.B) {
		const tok = "bench-token-0123456789"
		p, err := auth.NewPolicy([]auth.Principal{{Name: "orchestrator", Tokens: []string{tok}, Allow: []string{"*"}}})
		if err != nil {
			b.Fatal(err)
		}
		file := filepath.Join(b.TempDir(), "token")
		if err := os.WriteFile(file, []byte(tok), 0o600); err != nil {
			b.Fatal(err)
		}
		benchHop(b, Config{Plaintext: true}, grpcclient.Config{Plaintext: true, TokenFile: file}, WithPolicy(p))
	})
}

func benchHop(b *testing.B, cfg Config, ccfg grpcclient.Config, opts ...Option) {
	srv, err := New(cfg, slog.New(slog.DiscardHandler), opts...)
	if err != nil {
		b.Fatal(err)
	}
	operatorv1.RegisterOperatorServiceServer(srv, echoOperator{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	ccfg.Target = lis.Addr().String()
	conn, err := grpcclient.Dial(ccfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := operatorv1.NewOperatorServiceClient(conn)
	req := &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{Message: content.Text("call noop once, then say done")}}
	if _, err := c.Execute(context.Background(), req); err != nil { // connect
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, reads, writes := cpuTime(), syscalls("syscr"), syscalls("syscw")
	for range b.N {
		if _, err := c.Execute(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(syscalls("syscr")-reads)/float64(b.N), "reads/op")
	b.ReportMetric(float64(syscalls("syscw")-writes)/float64(b.N), "writes/op")
}

// syscalls is a counter of /proc/self/io: syscr (read system calls) or
// syscw (writes); 0 where there is no such file.
func syscalls(name string) int64 {
	b, _ := os.ReadFile("/proc/self/io")
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, name+": "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// cpuTime is the CPU time the process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
