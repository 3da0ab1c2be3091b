package benchmark

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"google.golang.org/protobuf/encoding/protojson"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/benchkit"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/docker"
	// The backends the benchmarks start register themselves with Run.
	_ "github.com/secbear/neuron/services/environment/local"
	_ "github.com/secbear/neuron/services/environment/process"
)

func TestMain(m *testing.M) {
	sandbox.Main() // the process backend re-executes this test binary
	os.Exit(m.Run())
}

// operator is the static operator binary, built once per test binary.
func operator(b *testing.B) string {
	return testenv.BuildStatic(b, "github.com/secbear/neuron/services/operator/cmd/operator")
}

// operatorArgs: scripted model, no tools, quiet logs.
var operatorArgs = []string{"--tools", "", "--log-level", "warn"}

func input() *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{Message: content.Text("ping")}
}

func check(out *operatorv1.OperatorOutput) error {
	if got := content.TextOf(out.GetMessage()); !strings.Contains(got, "You said: ping") {
		return fmt.Errorf("unexpected output %q", got)
	}
	return nil
}

func BenchmarkForkExec(b *testing.B) {
	in, _ := protojson.Marshal(input())
	bin := operator(b)
	args := append(append([]string{}, operatorArgs...), environment.OneShotArgs()...)
	var peak int64
	res := benchkit.Concurrent(b, 1, func(_, _ int) error {
		var stdout bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdin = bytes.NewReader(in)
		cmd.Stdout = &stdout
		cmd.Dir = b.TempDir()
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + cmd.Dir}
		if err := cmd.Run(); err != nil {
			return err
		}
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			peak = max(peak, ru.Maxrss) // KiB
		}
		out := &operatorv1.OperatorOutput{}
		if err := protojson.Unmarshal(stdout.Bytes(), out); err != nil {
			return err
		}
		return check(out)
	})
	res.Report(b, "runs/s")
	b.ReportMetric(float64(peak)/1024, "peak-rss-MB")
}

// serve runs the environment service as its binary does (environment.Run:
// the production interceptor chain, egress proxies and defaults), with
// cfg's backend settings, and returns a client.
func serve(b *testing.B, cfg environment.Config) environmentv1.EnvironmentServiceClient {
	cfg.Server = grpcserver.Config{Name: "environment", Dev: true, ShutdownTimeout: 2 * time.Second}
	cfg.Log = slog.New(slog.NewJSONHandler(io.Discard, nil))
	cfg.DataDir = b.TempDir()
	cfg.OperatorArgs = operatorArgs
	addr := harness.Serve(b, func(ctx context.Context, lis net.Listener) error {
		cfg.Listener = lis
		return environment.Run(ctx, cfg)
	})
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, Plaintext: true, Timeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return environmentv1.NewEnvironmentServiceClient(conn)
}

func run(client environmentv1.EnvironmentServiceClient, peak *uint64) error {
	resp, err := client.Run(context.Background(), &environmentv1.RunRequest{Input: input(), Spec: &environmentv1.EnvironmentSpec{}})
	if err != nil {
		return err
	}
	if peak != nil {
		*peak = max(*peak, resp.GetUsage().GetPeakMemoryBytes())
	}
	return check(resp.GetOutput())
}

func BenchmarkProcess(b *testing.B) {
	if err := sandbox.Supported(); err != nil {
		b.Skipf("no Landlock: %v", err)
	}
	if err := sandbox.CgroupSupported(); err != nil {
		b.Skipf("no cgroup: %v", err)
	}
	client := serve(b, environment.Config{Backend: "process", OperatorBinary: operator(b)})
	var peak uint64
	res := benchkit.Concurrent(b, 1, func(_, _ int) error { return run(client, &peak) })
	res.Report(b, "runs/s")
	b.ReportMetric(float64(peak)/(1<<20), "peak-mem-MB")
}

func BenchmarkLocal(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, operator(b), append([]string{"--dev", "--addr", addr}, operatorArgs...)...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cancel(); _ = cmd.Wait() })
	client := serve(b, environment.Config{Backend: "local", Operator: grpcclient.Config{Target: addr, Dev: true, Plaintext: true, Timeout: time.Minute}})
	for i := 0; ; i++ { // wait until the operator serves
		if err := run(client, nil); err == nil {
			break
		} else if i == 200 {
			b.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.ResetTimer()
	res := benchkit.Concurrent(b, 1, func(_, _ int) error { return run(client, nil) })
	res.Report(b, "runs/s")
}

func BenchmarkDocker(b *testing.B) {
	eng := testenv.Docker(b) // skips when no engine can start
	cli, err := client.New(client.WithHost(eng.Host))
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const image = "neuron/operator:bench"
	if err := docker.BuildImage(ctx, cli, "../../operator/Dockerfile", operator(b), "/etc/ssl/certs/ca-certificates.crt", image); err != nil {
		b.Fatal(err)
	}
	srv := serve(b, environment.Config{Backend: "docker", DockerHost: eng.Host, DefaultImage: image})
	spec := &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{{
		Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{}}}}}
	b.ResetTimer()
	res := benchkit.Concurrent(b, 1, func(_, _ int) error {
		resp, err := srv.Run(context.Background(), &environmentv1.RunRequest{Input: input(), Spec: spec})
		if err != nil {
			return err
		}
		return check(resp.GetOutput())
	})
	res.Report(b, "runs/s")
}
