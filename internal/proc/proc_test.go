package proc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The test binary is the process under test when NEURON_PROC_CHILD says
// what to do: "serve <addr>" serves health until SIGTERM; "exit" exits
// at once. It prints the NEURON_PROC_* and NEURON_SVC_* variables it sees.
func TestMain(m *testing.M) {
	switch mode := os.Getenv("NEURON_PROC_CHILD"); {
	case mode == "exit":
		os.Exit(3)
	case strings.HasPrefix(mode, "serve "):
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "NEURON_PROC_") || strings.HasPrefix(kv, "NEURON_SVC_") {
				fmt.Println("env", kv)
			}
		}
		lis, err := net.Listen("tcp", strings.TrimPrefix(mode, "serve "))
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		s := grpc.NewServer()
		healthpb.RegisterHealthServer(s, health.NewServer())
		go func() {
			ch := make(chan os.Signal, 1)
			signal.Notify(ch, syscall.SIGTERM)
			<-ch
			fmt.Println("stopping")
			s.GracefulStop()
		}()
		_ = s.Serve(lis)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func child(t *testing.T, mode string) (*Proc, string) {
	t.Setenv("NEURON_PROC_CHILD", mode)
	t.Setenv("NEURON_SVC_TOKEN", "from the test's environment")
	log := filepath.Join(t.TempDir(), "child.log")
	return Start(t, os.Args[0], Options{Name: "child", LogPath: log, EnvPrefix: "NEURON_SVC"}), log
}

func healthOf(t *testing.T, addr string) healthpb.HealthClient {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

// A served process is SERVING, stops cleanly on SIGTERM, and never saw
// the variables under its prefix.
func TestServeAndTerminate(t *testing.T) {
	addr := FreeAddr(t)
	p, _ := child(t, "serve "+addr)
	p.WaitServing(context.Background(), t, healthOf(t, addr), "", 10*time.Millisecond)
	p.Terminate(t)
	if log := p.Log(); !strings.Contains(log, "stopping") || strings.Contains(log, "NEURON_SVC_TOKEN") {
		t.Errorf("log of the child: %q; want it stopped on SIGTERM without NEURON_SVC_TOKEN", log)
	}
}

// SIGKILL ends a live process.
func TestKill(t *testing.T) {
	addr := FreeAddr(t)
	p, _ := child(t, "serve "+addr)
	p.WaitServing(context.Background(), t, healthOf(t, addr), "", 10*time.Millisecond)
	p.Kill(t)
	select {
	case <-p.Exited():
	default:
		t.Fatal("Kill returned with the process alive")
	}
}

// recorder is a testing.TB that keeps a fatal failure instead of ending
// the goroutine.
type recorder struct {
	testing.TB
	fatal string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic(r)
}

func (r *recorder) Helper() {}

// A process that exits before it serves fails WaitServing, and one that
// exited on its own fails Kill: a crash test must notice both.
func TestExitedOnItsOwn(t *testing.T) {
	p, _ := child(t, "exit")
	run := func(f func(tb testing.TB)) string {
		r := &recorder{TB: t}
		func() {
			defer func() {
				if v := recover(); v != nil && v != r {
					panic(v)
				}
			}()
			f(r)
		}()
		return r.fatal
	}
	if msg := run(func(tb testing.TB) {
		p.WaitServing(context.Background(), tb, healthOf(t, FreeAddr(t)), "", 10*time.Millisecond)
	}); !strings.Contains(msg, "exited while starting") {
		t.Errorf("WaitServing of a process that exited: %q", msg)
	}
	if msg := run(func(tb testing.TB) { p.Kill(tb) }); !strings.Contains(msg, "exited on its own") && !strings.Contains(msg, "SIGKILL") {
		t.Errorf("Kill of a process that exited: %q", msg)
	}
}
