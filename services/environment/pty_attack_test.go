package environment_test

import (
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/internal/testenv"
)

// injectServiceTerminal types a marker, one TIOCSTI per character, into
// every terminal the command can find: its standard streams and
// /dev/tty (a command without a terminal of its own shares the service's
// session, whose controlling terminal /dev/tty would name). The marker
// is built at run time, so it appears nowhere but where it was typed.
const injectServiceTerminal = `my $m = join "", map { chr } (90, 81, 88, 74, 55, 55, 10); my @fhs; ` +
	`for my $fd (0, 1, 2) { my $fh; open($fh, "+<&=", $fd) and push @fhs, $fh } ` +
	`my $tty; open($tty, "+<", "/dev/tty") and push @fhs, $tty; ` +
	`for my $fh (@fhs) { for my $c (split //, $m) { ioctl($fh, 0x5412, $c) } } print "tried\n";`

// TestExecServiceTerminalAttack: the environment service binary runs
// with a terminal of its own (a pseudo-terminal the test holds, as its
// controlling terminal, echoing input). Commands in a sandbox, with and
// without a terminal of their own, try to type into every terminal they
// can reach; nothing they type reaches the service's terminal (an
// injected character would be echoed there), so they cannot feed the
// shell or program that reads it.
func TestExecServiceTerminalAttack(t *testing.T) {
	requireSandbox(t)
	bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/environment/cmd/environment")
	ctl, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	defer ctl.Close()
	cmd := exec.Command(bin, "--dev", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--operator-binary", operatorBinary(t), "--log-format", "json")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	screen := &syncBuffer{}
	go func() { _, _ = io.Copy(screen, ctl) }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	serving := regexp.MustCompile(`"msg":"SERVING"[^\n]*"addr":"([^"]+)"`)
	var addr string
	for addr == "" {
		if m := serving.FindStringSubmatch(screen.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the service did not start:\n%s", screen.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	e := &env{client: dialEnv(t, addr)}
	id := e.newSandbox(t)
	for _, own := range []bool{false, true} {
		x := e.startExec(ctx, t, &environmentv1.ExecStart{SandboxId: id, Tty: own, Argv: []string{"perl", "-e", injectServiceTerminal}})
		x.finish()
		if x.err != nil || !strings.Contains(x.stdout.String(), "tried") {
			t.Fatalf("tty %v: the probe did not run: %q %q %v", own, x.stdout.String(), x.stderr.String(), x.err)
		}
		if strings.Contains(x.stdout.String(), "ZQXJ77") {
			t.Errorf("tty %v: the command typed into its own terminal: %q", own, x.stdout.String())
		}
	}
	// Everything echoed before this line is on the screen once it is.
	if _, err := tty.WriteString("SENTINEL-OF-THE-TEST\n"); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(screen.String(), "SENTINEL-OF-THE-TEST") {
		select {
		case <-ctx.Done():
			t.Fatalf("the sentinel never reached the screen:\n%s", screen.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if strings.Contains(screen.String(), "ZQXJ77") {
		t.Errorf("a sandboxed command typed into the service's terminal:\n%s", screen.String())
	}
}
