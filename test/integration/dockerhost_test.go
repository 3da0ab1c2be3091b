package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// relayDockerHost returns a DOCKER_HOST ("unix://PATH") that reaches the
// engine at host ("unix://PATH", a testenv.DockerEngine's Host) until the
// test ends.
//
// testcontainers-go (v0.44.0) resolves the Docker host once per process:
// internal/core.ExtractDockerHost keeps its first answer (from
// DOCKER_HOST) in a sync.Once, and neither a provider nor a request takes
// another host. testenv.Docker, though, starts every test's engine on a
// fresh socket, so a second run in the same process (-count=2) would
// talk to the first run's engine, long gone. The relay's socket path is
// fixed for the process (it holds the pid) and each test serves it anew,
// forwarding every connection byte for byte (hijacked attach and exec
// streams included) to its own engine's socket.
func relayDockerHost(t *testing.T, host string) string {
	t.Helper()
	target, ok := strings.CutPrefix(host, "unix://")
	if !ok {
		t.Fatalf("the engine's host %q is not a unix socket", host)
	}
	// Short, for the 108-byte limit of socket paths.
	path := filepath.Join(os.TempDir(), fmt.Sprintf("neuron-it-tc-%d.sock", os.Getpid()))
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("removing the stale relay socket %s: %v", path, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("the Docker relay socket: %v", err)
	}
	r := &engineRelay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	// Registered before the containers' and the network's cleanups, so it
	// runs after them: they still reach the engine through it.
	t.Cleanup(r.close)
	return "unix://" + path
}

// engineRelay forwards the connections of a unix listener to a unix
// socket.
type engineRelay struct {
	ln     *net.UnixListener // removes its socket file when closed
	target string            // the engine's socket path
	wg     sync.WaitGroup    // serve and the forwards

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // both ends of every open forward
}

func (r *engineRelay) serve() {
	defer r.wg.Done()
	for {
		in, err := r.ln.AcceptUnix()
		if err != nil {
			return // closed
		}
		r.wg.Add(1) // while serve's own count is held: never races Wait
		go r.forward(in)
	}
}

// forward copies both ways between in and a new connection to the
// engine, passing on each direction's end as a half-close, until both
// directions have ended or the relay closes.
func (r *engineRelay) forward(in *net.UnixConn) {
	defer r.wg.Done()
	out, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: r.target, Net: "unix"})
	if err != nil {
		_ = in.Close() // the client sees the engine's absence as a closed connection
		return
	}
	if !r.track(in, out) {
		_ = in.Close()
		_ = out.Close()
		return
	}
	defer r.untrack(in, out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src *net.UnixConn) {
		_, _ = io.Copy(dst, src)
		_ = dst.CloseWrite()
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

func (r *engineRelay) track(conns ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	for _, c := range conns {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *engineRelay) untrack(conns ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(r.conns, c)
	}
}

// close stops accepting, cuts the open forwards and waits for them.
func (r *engineRelay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
