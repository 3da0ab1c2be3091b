package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/sandbox"
)

// TestStandaloneBashIsolated attacks the bash tool of a serving
// operator, started as `neuron up` and the README start it (no
// environment service around it): each command prints a marker when it
// got out, and none may come back. Its commands run in their own mount,
// user, pid, network, IPC and UTS namespaces under the seccomp filter,
// and the whole process tree is killed when the command ends.
func TestStandaloneBashIsolated(t *testing.T) {
	if err := sandbox.Supported(); err != nil {
		t.Skipf("Landlock unavailable here: %v (the sandbox package's own tests cover the refusal path)", err)
	}
	bin := buildOperator(t)
	// A loopback TCP service of the host, as the state service is.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HOST-TCP-ANSWERED\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	addr := freeAddr(t)
	cmd := exec.Command(bin, "--dev", "--model", "scripted", "--addr", addr, "--workspace", t.TempDir(), "--tools", "bash", "--log-format", "text")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)
	client := operatorv1.NewOperatorServiceClient(conn)
	bash := func(t *testing.T, command string) string {
		t.Helper()
		args, _ := json.Marshal(map[string]any{"command": command, "timeout_seconds": 20})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		resp, err := client.Execute(ctx, &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{
			Message: content.Text("/tool bash " + string(args)),
		}})
		if err != nil {
			t.Fatalf("Execute: %v\n%s", err, stderr.String())
		}
		return content.TextOf(resp.GetOutput().GetMessage())
	}

	marker := fmt.Sprintf("%d.%d", 400+os.Getpid()%100, time.Now().UnixNano()%1000) // a sleep duration no other process uses
	for _, tc := range []struct{ name, command, escaped string }{
		{"host loopback service", fmt.Sprintf("cat < /dev/tcp/127.0.0.1/%d", port), "HOST-TCP-ANSWERED"},
		{"host processes", "test -e /proc/1 && echo SEES-HOST-PROC; echo checked", "SEES-HOST-PROC"},
		{"host sockets and runtime dirs", "for d in /run /var/run /tmp/.X11-unix /root; do test -e $d && echo EXISTS $d; done; echo checked", "EXISTS"},
		{"nested namespace", "unshare --user --map-root-user --net true && echo NESTED-OK", "NESTED-OK"},
		{"netlink", "ip link && echo NETLINK-OK", "NETLINK-OK"},
		{"daemon started", "setsid sleep " + marker + " > /dev/null 2>&1 < /dev/null & echo started", "never"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := bash(t, tc.command)
			if strings.Contains(got, tc.escaped) {
				t.Errorf("bash got out: %q", got)
			}
		})
	}
	// The daemon above left the process group with setsid: it must be
	// gone with the command's pid namespace, not running on the host.
	time.Sleep(200 * time.Millisecond)
	out, _ := exec.Command("pgrep", "-f", "sleep "+marker).Output()
	if len(strings.TrimSpace(string(out))) > 0 {
		exec.Command("pkill", "-f", "sleep "+marker).Run()
		t.Errorf("a setsid daemon outlived the bash call: pids %s", out)
	}
}
