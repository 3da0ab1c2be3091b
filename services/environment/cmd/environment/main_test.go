package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Main() // the process backend re-executes this test binary
	os.Exit(m.Run())
}

// TestBadConfigFailsWithOneClearLine: the binary refuses bad config
// before it serves, naming what to fix.
func TestBadConfigFailsWithOneClearLine(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"security off without --dev", []string{"--data-dir", dir}, "--auth-policy"},
		{"unknown backend", []string{"--dev", "--backend", "vm"}, `unknown backend "vm"`},
		{"process as container backend", []string{"--dev", "--container-backend", "process"}, "want docker or kubernetes"},
		{"local without an operator", []string{"--dev", "--backend", "local"}, "--operator-addr"},
		{"missing operator binary", []string{"--dev", "--operator-binary", filepath.Join(dir, "nope")}, "not an executable"},
		{"bad memory default", []string{"--dev", "--default-memory", "lots"}, "--default-memory"},
		{"bad static host", []string{"--dev", "--egress-static-hosts", "api.example.com"}, "host=ip:port"},
		{"bad private range", []string{"--dev", "--egress-allow-private", "10.0.0.0/99"}, "not a CIDR"},
		{"timeouts", []string{"--dev", "--default-timeout", "2h", "--max-timeout", "1h"}, "--default-timeout"},
		{"bad disk default", []string{"--dev", "--default-disk", "0"}, "--default-disk"},
		{"no concurrency", []string{"--dev", "--max-concurrent", "0"}, "--max-concurrent 0"},
		{"unknown flag", []string{"--colour"}, "flag provided but not defined"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), tt.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

// TestServes: wired as in production (process backend, the real operator
// binary), it logs SERVING and runs an invocation over gRPC.
func TestServes(t *testing.T) {
	if err := sandbox.Supported(); err != nil {
		t.Skipf("no Landlock: %v", err)
	}
	if err := sandbox.CgroupSupported(); err != nil {
		t.Skipf("no cgroup: %v", err)
	}
	dir := t.TempDir()
	op := testenv.BuildStatic(t, "github.com/secbear/neuron/services/operator/cmd/operator")
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--dev", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--operator-binary", op, "--operator-args", "--tools read"}, pw)
		pw.Close()
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	addr := ""
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "SERVING" {
			addr = line.Addr
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if addr == "" {
		t.Fatal("no SERVING line")
	}
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, Plaintext: true, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := environmentv1.NewEnvironmentServiceClient(conn).Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{Message: content.Text("through the binary")},
		Spec:  &environmentv1.EnvironmentSpec{Isolation: []*environmentv1.IsolationBoundary{{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBackend() != "process" || !strings.Contains(content.TextOf(resp.GetOutput().GetMessage()), "You said: through the binary") {
		t.Errorf("response %v", resp)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "data", "work"))
	for _, e := range entries {
		if e.Name() != ".lock" { // the process backend's hold on its work dir
			t.Errorf("work directory left behind: %s", e.Name())
		}
	}
}
