package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
)

// child is one service process of `neuron up`. Its stdout and stderr go
// through a pipe to its log file; the reader watches for the SERVING line.
type child struct {
	name string   // state, operator, environment, orchestrator
	addr string   // the address it was told to serve on
	bin  string   // its binary
	args []string // its flags
	// logPath is the log file; logShown is how it is shown to the user.
	logPath, logShown string

	cmd *exec.Cmd
	// serving receives the address from the SERVING log line, once.
	serving chan string
	// exited is closed once the process has exited; exitErr is then set.
	exited  chan struct{}
	exitErr error
	// logDone is closed when the log reader has seen the end of output.
	logDone chan struct{}

	mu   sync.Mutex
	tail []string // the last lines of the log, for error reports
	// httpAddr is the address of its "HTTP SERVING" line (the gateway's
	// HTTP endpoints), logged before SERVING; empty: none.
	httpAddr string
}

// servedHTTP is the address of the child's "HTTP SERVING" line.
func (c *child) servedHTTP() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.httpAddr
}

// tailLines is how many log lines a child keeps for error reports.
const tailLines = 12

// start starts the child with env, through sp.
func (c *child) start(sp *spawner, env []string) error {
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("%s log: %w", c.name, err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return err
	}
	c.cmd = exec.Command(c.bin, c.args...)
	c.cmd.Env = env
	c.cmd.Stdout, c.cmd.Stderr = pw, pw
	c.cmd.SysProcAttr = childProcAttr()
	c.serving = make(chan string, 1)
	c.exited = make(chan struct{})
	c.logDone = make(chan struct{})
	err = sp.start(c.cmd)
	pw.Close() // the child holds its own copy
	if err != nil {
		pr.Close()
		logf.Close()
		return fmt.Errorf("starting %s (%s): %w", c.name, c.bin, err)
	}
	go c.readLog(pr, logf)
	go func() {
		err := c.cmd.Wait()
		c.exitErr = err
		close(c.exited)
	}()
	return nil
}

// readLog copies the child's output to its log file, keeps the last
// lines and reports the SERVING line.
func (c *child) readLog(r io.ReadCloser, logf *os.File) {
	defer close(c.logDone)
	defer logf.Close()
	defer r.Close()
	br := bufio.NewReader(r)
	served := false
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			_, _ = logf.Write(line)
			text := strings.TrimRight(string(line), "\r\n")
			c.mu.Lock()
			c.tail = append(c.tail, text)
			if len(c.tail) > tailLines {
				c.tail = c.tail[len(c.tail)-tailLines:]
			}
			c.mu.Unlock()
			if addr, ok := servingLine(text, "HTTP SERVING"); ok {
				c.mu.Lock()
				c.httpAddr = addr
				c.mu.Unlock()
			}
			if !served {
				if addr, ok := servingAddr(text); ok {
					served = true
					c.serving <- addr
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// servingAddr parses the services' JSON log line {"msg":"SERVING","addr":...}.
func servingAddr(line string) (string, bool) { return servingLine(line, "SERVING") }

// servingLine parses a JSON log line {"msg":msg,"addr":...}.
func servingLine(line, msg string) (string, bool) {
	if !strings.Contains(line, `"`+msg+`"`) {
		return "", false
	}
	var rec struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
	}
	if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != msg {
		return "", false
	}
	return rec.Addr, true
}

// logTail returns the last lines of the child's log, JSON records made
// readable, each indented.
func (c *child) logTail() string {
	// The reader may still be copying the last output of an exited child.
	if c.logDone != nil {
		select {
		case <-c.logDone:
		case <-time.After(time.Second):
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tail) == 0 {
		return "    (the log is empty)\n"
	}
	var b strings.Builder
	for _, l := range c.tail {
		fmt.Fprintf(&b, "    %s\n", readableLog(l))
	}
	return b.String()
}

// readableLog renders a JSON log record as "LEVEL msg key=value ...";
// other lines are returned as they are.
func readableLog(line string) string {
	var rec map[string]any
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &rec) != nil {
		return line
	}
	level, _ := rec["level"].(string)
	msg, _ := rec["msg"].(string)
	keys := make([]string, 0, len(rec))
	for k := range rec {
		switch k {
		case "time", "level", "msg", "service":
		default:
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(level + " " + msg)
	for _, k := range keys {
		v := rec[k]
		if s, ok := v.(string); ok {
			fmt.Fprintf(&b, " %s=%q", k, s)
		} else {
			js, _ := json.Marshal(v)
			fmt.Fprintf(&b, " %s=%s", k, js)
		}
	}
	return b.String()
}

// running reports whether the process has not exited.
func (c *child) running() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// describeExit says how the child ended: "exit status 1", "signal: killed".
func (c *child) describeExit() string {
	if c.exitErr == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(c.exitErr, &ee) {
		return ee.String()
	}
	return c.exitErr.Error()
}

// stop sends SIGTERM and waits up to timeout for the child to exit, then
// kills its process group. It reports whether the child had to be killed
// and whether it exited cleanly (status 0 after SIGTERM).
func (c *child) stop(timeout time.Duration) (killed, clean bool) {
	if c.cmd == nil || c.cmd.Process == nil {
		return false, true
	}
	if c.running() {
		terminate(c.cmd.Process)
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-c.exited:
		case <-t.C:
			kill(c.cmd.Process)
			<-c.exited
			killed = true
		}
	}
	// Let the reader copy the last lines into the log file before neuron
	// exits.
	select {
	case <-c.logDone:
	case <-time.After(2 * time.Second):
	}
	return killed, !killed && (c.exitErr == nil || endedBySIGTERM(c.exitErr))
}

// spawner starts processes from one OS thread that lives as long as
// neuron. On Linux a child asks to get SIGTERM when its parent dies
// (Pdeathsig), and "parent" means the thread that forked it: a Go thread
// can exit under a running child, so every child is forked from this
// locked thread, which never exits before the process does.
type spawner struct {
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

// newSpawner starts the spawner's thread.
func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnRequest)}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread must outlive the children
		for r := range s.reqs {
			r.done <- r.cmd.Start()
		}
	}()
	return s
}

// start starts cmd from the spawner's thread.
func (s *spawner) start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	s.reqs <- spawnRequest{cmd: cmd, done: done}
	return <-done
}
