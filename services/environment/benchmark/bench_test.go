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
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/docker"
	"github.com/secbear/neuron/services/environment/local"
	"github.com/secbear/neuron/services/environment/process"
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

// serve runs an environment server over gRPC and returns a client.
func serve(b *testing.B, backends []environment.Backend, def string) environmentv1.EnvironmentServiceClient {
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	cfg := environment.Config{Backends: backends, Default: def, Defaults: environment.DefaultDefaults(), Log: log,
		Egress: environment.NewEgressFactory(environment.EgressOptions{})}
	switch def {
	case "process":
		cfg.Process = "process"
	case "docker":
		cfg.Container = "docker"
	}
	es, err := environment.NewServer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := grpcserver.New(grpcserver.Config{Name: "environment", Addr: "127.0.0.1:0", Dev: true}, log)
	if err != nil {
		b.Fatal(err)
	}
	environmentv1.RegisterEnvironmentServiceServer(srv, es)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, lis) }()
	conn, err := grpcclient.Dial(grpcclient.Config{Target: lis.Addr().String(), Dev: true, Plaintext: true, Timeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(); cancel(); <-done })
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
	pb, err := process.New(process.Config{OperatorBinary: operator(b), OperatorArgs: operatorArgs, WorkDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	client := serve(b, []environment.Backend{pb}, "process")
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
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, Plaintext: true, Timeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	client := serve(b, []environment.Backend{local.New(operatorv1.NewOperatorServiceClient(conn))}, "local")
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
	db, err := docker.New(docker.Config{Host: eng.Host, DefaultImage: image, OperatorArgs: operatorArgs, WorkDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	srv := serve(b, []environment.Backend{db}, "docker")
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
