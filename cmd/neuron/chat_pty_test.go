//go:build linux

package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
)

// chatMainEnv, set to 1, makes TestChatProcess run neuron.
const chatMainEnv = "NEURON_TEST_RUN_NEURON"

// TestChatProcess is not a test: with NEURON_TEST_RUN_NEURON=1 it runs
// neuron with the arguments after "--" as a process of its own, for
// TestChatPTY; otherwise it does nothing.
func TestChatProcess(t *testing.T) {
	if os.Getenv(chatMainEnv) != "1" {
		t.Skip("a helper process for TestChatPTY, not a test")
	}
	i := slices.Index(os.Args, "--")
	os.Exit(realMain(os.Args[i+1:]))
}

// screen collects what a pseudo-terminal shows.
type screen struct {
	mu   sync.Mutex
	cond *sync.Cond
	buf  bytes.Buffer
	pos  int
	eof  bool
}

func newScreen(r io.Reader) *screen {
	s := &screen{}
	s.cond = sync.NewCond(&s.mu)
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			s.mu.Lock()
			s.buf.Write(b[:n])
			if err != nil {
				s.eof = true
			}
			s.cond.Broadcast()
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return s
}

// expect waits until want is shown after what was expected before, and
// returns what was shown up to it. A process that never shows it fails
// the test when the hang guard fires, with the screen.
func (s *screen) expect(t *testing.T, want string) string {
	t.Helper()
	guard := time.AfterFunc(30*time.Second, func() {
		s.mu.Lock()
		s.eof = true
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer guard.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		rest := s.buf.String()[s.pos:]
		if i := strings.Index(rest, want); i >= 0 {
			s.pos += i + len(want)
			return rest[:i+len(want)]
		}
		if s.eof {
			t.Fatalf("the chat never showed %q; the screen:\n%s", want, s.buf.String())
		}
		s.cond.Wait()
	}
}

// TestChatPTY runs `neuron chat` on a pseudo-terminal against the fake
// orchestrator, as a person would: a message and its streamed answer, an
// approval answered y inline, Ctrl-C at the prompt (nothing to cancel)
// and during a run (the run is canceled, the chat goes on), /history,
// /cost, the line editor's history (arrow up), /quit.
func TestChatPTY(t *testing.T) {
	f := newFakeOrch()
	f.lockstep = true
	addr := serveOrch(t, f)
	cmd := exec.Command(os.Args[0], "-test.run=^TestChatProcess$", "--", "chat", "assistant", "--addr", addr, "--state-addr", "127.0.0.1:1")
	cmd.Env = append(cleanEnv(), chatMainEnv+"=1", "TERM=xterm")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})
	s := newScreen(ptmx)
	typ := func(keys string) {
		t.Helper()
		if _, err := ptmx.Write([]byte(keys)); err != nil {
			t.Fatal(err)
		}
	}

	banner := s.expect(t, "you> ")
	m := regexp.MustCompile(`chat with assistant · session (chat-[0-9a-f]{12}) \(go on later: neuron chat assistant --session chat-[0-9a-f]{12}\)`).FindStringSubmatch(banner)
	if m == nil {
		t.Fatalf("no session in the banner:\n%s", banner)
	}
	session := m[1]

	typ("hello\r")
	if got := s.expect(t, "Hello, world"); !strings.Contains(got, "hello") {
		t.Errorf("the typed line was not echoed: %q", got)
	}
	s.expect(t, "you> ")

	// Ctrl-C at the prompt clears the line and keeps the chat.
	typ("never sent\x03")
	s.expect(t, "nothing is running; /quit or Ctrl-D leaves")
	s.expect(t, "you> ")

	typ("please approve\r")
	s.expect(t, "assistant asks before running 1 tool call(s):")
	s.expect(t, `write({"path":"notes.txt"})`)
	s.expect(t, "approve? [y]es / [n]o / [e]dit: ")
	typ("y\r")
	s.expect(t, "decision recorded")
	s.expect(t, `→ write({"path":"notes.txt"})`)
	s.expect(t, "approved Hello, world")
	s.expect(t, "you> ")

	typ("slow\r")
	f.mu.Lock()
	for len(f.order) < 3 || len(f.wfs[f.order[2]].progress) == 0 || !f.wfs[f.order[2]].caughtUp() {
		f.cond.Wait()
	}
	slow := f.order[2]
	f.mu.Unlock()
	s.expect(t, "Hel")
	typ("\x03") // the terminal sends SIGINT
	s.expect(t, "canceling this answer (the chat goes on)")
	s.expect(t, "(canceled)")
	s.expect(t, "you> ")
	f.mu.Lock()
	cancels := slices.Clone(f.cancels)
	f.mu.Unlock()
	if len(cancels) != 1 || cancels[0] != slow {
		t.Errorf("CancelWorkflow calls %v, want [%s]", cancels, slow)
	}

	typ("/history\r")
	s.expect(t, "you: hello")
	s.expect(t, "assistant: approved Hello, world")
	s.expect(t, "you> ")
	typ("/cost\r")
	s.expect(t, "spent $0.03 in this chat (3 turn(s))")
	s.expect(t, "you> ")
	typ("\x1b[A\r") // arrow up: /cost again
	s.expect(t, "spent $0.03 in this chat (3 turn(s))")
	s.expect(t, "you> ")
	typ("/quit\r")
	s.expect(t, "session "+session+" kept: go on with neuron chat assistant --session "+session)
	if err := <-exited; err != nil {
		t.Fatalf("neuron chat: %v, want exit 0", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.starts) != 3 {
		t.Fatalf("%d turns started, want 3 (the line cleared with Ctrl-C is not sent)", len(f.starts))
	}
	for _, st := range f.starts {
		if st.GetInput().GetSessionId() != session {
			t.Errorf("turn %s in session %q, want %q", st.GetWorkflowId(), st.GetInput().GetSessionId(), session)
		}
	}
}
