package mcp

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

// stdioTestServer is this test binary as a stdio MCP server.
func stdioTestServer(name string, env ...string) Server {
	return Server{Name: name, Command: []string{os.Args[0]}, Env: append([]string{serverModeEnv + "=1"}, env...)}
}

// fakeClock is a settable clock for the pool's idle sweep.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestPool(t *testing.T, cfg PoolConfig) (*Pool, *fakeClock) {
	t.Helper()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	p := NewPool(cfg)
	p.now = clock.Now
	t.Cleanup(p.Close)
	return p, clock
}

func TestKeyIsCanonical(t *testing.T) {
	a := Server{Name: "s", Command: []string{"/bin/x", "--flag"}, Env: []string{"A=1", "B=2"}, ReadOnly: []string{"r", "q"}}
	b := Server{Name: "s", Command: []string{"/bin/x", "--flag"}, Env: []string{"B=2", "A=1"}, ReadOnly: []string{"q", "r", "q"}}
	if Key(a) != Key(b) {
		t.Fatal("the order of env and read_only changed the key")
	}
	for _, c := range []Server{
		{Name: "t", Command: a.Command, Env: a.Env, ReadOnly: a.ReadOnly},
		{Name: "s", Command: []string{"/bin/x", "--other"}, Env: a.Env, ReadOnly: a.ReadOnly},
		{Name: "s", Command: a.Command, Env: []string{"A=1", "B=3"}, ReadOnly: a.ReadOnly},
		{Name: "s", Command: a.Command, Env: a.Env, ReadOnly: a.ReadOnly, Timeout: time.Second},
	} {
		if Key(c) == Key(a) {
			t.Fatalf("%+v has the key of %+v", c, a)
		}
	}
	h1 := Server{Name: "h", URL: "http://x/mcp", Headers: map[string]string{"A": "1", "B": "2"}}
	h2 := Server{Name: "h", URL: "http://x/mcp", Headers: map[string]string{"B": "2", "A": "1"}}
	h3 := Server{Name: "h", URL: "http://x/mcp", Headers: map[string]string{"A": "1", "B": "other"}}
	if Key(h1) != Key(h2) || Key(h1) == Key(h3) {
		t.Fatal("headers: the key must ignore their order and follow their values")
	}
}

// TestPoolSharesConnections: one definition is started once however many
// invocations lease it, concurrently or one after another.
func TestPoolSharesConnections(t *testing.T) {
	p, _ := newTestPool(t, PoolConfig{})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	leases := make([]*Lease, 4)
	errsOut := make([]error, 4)
	for i := range leases {
		wg.Go(func() { leases[i], errsOut[i] = p.Acquire(ctx, stdioTestServer("calc", "X=1", "Y=2")) })
	}
	wg.Wait()
	for i, err := range errsOut {
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
	}
	for _, l := range leases[1:] {
		if l.Registry != leases[0].Registry {
			t.Fatal("leases of one definition do not share the connection")
		}
	}
	o := leases[0].Registry.Call(ctx, "calc__add", []byte(`{"a":40,"b":2}`))
	if o.IsError || o.Content != "42" {
		t.Fatalf("call through the pooled server: %+v", o)
	}
	for _, l := range leases {
		l.Release()
		l.Release() // idempotent
	}
	again, err := p.Acquire(ctx, stdioTestServer("calc", "Y=2", "X=1"))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	if open, starts := p.Stats(); open != 1 || starts != 1 {
		t.Fatalf("open %d, starts %d: want one server started once", open, starts)
	}
}

// TestPoolIdleTimeout: a connection unused for longer than the idle
// timeout is closed by the sweep, and started again when next needed;
// one in use is never closed.
func TestPoolIdleTimeout(t *testing.T) {
	p, clock := newTestPool(t, PoolConfig{IdleTimeout: time.Hour})
	ctx := ctxT(t)
	held, err := p.Acquire(ctx, stdioTestServer("held"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	idle, err := p.Acquire(ctx, stdioTestServer("idle"))
	if err != nil {
		t.Fatal(err)
	}
	idle.Release()
	clock.Advance(30 * time.Minute)
	p.sweep()
	if open, _ := p.Stats(); open != 2 {
		t.Fatalf("open %d after half the idle timeout, want 2", open)
	}
	clock.Advance(31 * time.Minute)
	p.sweep()
	if open, _ := p.Stats(); open != 1 {
		t.Fatalf("open %d after the idle timeout, want 1 (the one in use)", open)
	}
	if o := held.Registry.Call(ctx, "held__add", []byte(`{"a":1,"b":2}`)); o.IsError {
		t.Fatalf("the leased server was closed: %+v", o)
	}
	l, err := p.Acquire(ctx, stdioTestServer("idle"))
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if _, starts := p.Stats(); starts != 3 {
		t.Fatalf("starts %d, want 3 (the idle server started again)", starts)
	}
}

// TestPoolBounded: a full pool closes its least recently used idle
// connection for a new one, and refuses a new one when all are in use.
func TestPoolBounded(t *testing.T) {
	p, clock := newTestPool(t, PoolConfig{MaxServers: 2})
	ctx := ctxT(t)
	a, err := p.Acquire(ctx, stdioTestServer("a"))
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	b, err := p.Acquire(ctx, stdioTestServer("b"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Acquire(ctx, stdioTestServer("c"))
	if !errors.Is(err, errs.ResourceExhausted) || !strings.Contains(err.Error(), `"c"`) || !strings.Contains(err.Error(), "--mcp-pool-size") {
		t.Fatalf("Acquire on a full pool in use: %v, want ResourceExhausted naming the server and the flag", err)
	}
	a.Release()
	clock.Advance(time.Second)
	b.Release()
	c, err := p.Acquire(ctx, stdioTestServer("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if open, _ := p.Stats(); open != 2 {
		t.Fatalf("open %d, want 2", open)
	}
	// a was the least recently used: b is still pooled, a starts again.
	b2, err := p.Acquire(ctx, stdioTestServer("b"))
	if err != nil {
		t.Fatal(err)
	}
	b2.Release()
	if _, starts := p.Stats(); starts != 3 {
		t.Fatalf("starts %d, want 3 (b kept, a evicted)", starts)
	}
}

// TestPoolFailedStartIsRetried: a server that cannot start fails the
// Acquire with an error naming it, and the next Acquire tries again.
func TestPoolFailedStartIsRetried(t *testing.T) {
	p, _ := newTestPool(t, PoolConfig{})
	ctx := ctxT(t)
	crash := Server{Name: "crashy", Command: []string{os.Args[0]}, Env: []string{serverModeEnv + "=crash"}}
	for range 2 {
		_, err := p.Acquire(ctx, crash)
		if !errors.Is(err, errs.Unavailable) || !strings.Contains(err.Error(), `"crashy"`) || !strings.Contains(err.Error(), "config file") {
			t.Fatalf("Acquire of a crashing server: %v, want Unavailable naming it and quoting its stderr", err)
		}
	}
	if open, starts := p.Stats(); open != 0 || starts != 2 {
		t.Fatalf("open %d, starts %d: want nothing pooled and two tries", open, starts)
	}
}

// TestPoolReplacesDeadConnection: a connection that died is started
// again on the next Acquire rather than handed out.
func TestPoolReplacesDeadConnection(t *testing.T) {
	p, _ := newTestPool(t, PoolConfig{})
	ctx := ctxT(t)
	l, err := p.Acquire(ctx, stdioTestServer("calc"))
	if err != nil {
		t.Fatal(err)
	}
	_ = l.entry.client.Close() // the server goes away
	l.Release()
	l2, err := p.Acquire(ctx, stdioTestServer("calc"))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release()
	if o := l2.Registry.Call(ctx, "calc__add", []byte(`{"a":1,"b":2}`)); o.IsError || o.Content != "3" {
		t.Fatalf("call after the replacement: %+v", o)
	}
	if _, starts := p.Stats(); starts != 2 {
		t.Fatalf("starts %d, want 2", starts)
	}
}

// BenchmarkPooledAcquire is what an invocation pays for its MCP server
// when the pool already holds it: a lease and its release.
func BenchmarkPooledAcquire(b *testing.B) {
	p := NewPool(PoolConfig{})
	defer p.Close()
	ctx := context.Background()
	s := stdioTestServer("calc")
	l, err := p.Acquire(ctx, s)
	if err != nil {
		b.Fatal(err)
	}
	l.Release()
	b.ResetTimer()
	for b.Loop() {
		l, err := p.Acquire(ctx, s)
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
}

// BenchmarkUnpooledConnect is what it would pay without the pool: start
// the stdio server, handshake, list and register its tools, close it.
func BenchmarkUnpooledConnect(b *testing.B) {
	ctx := context.Background()
	s := stdioTestServer("calc")
	for b.Loop() {
		c, err := Connect(ctx, s, nil)
		if err != nil {
			b.Fatal(err)
		}
		ts, err := c.Tools(ctx)
		if err != nil {
			b.Fatal(err)
		}
		reg := tool.NewRegistry()
		for _, t := range ts {
			if err := reg.Register(t); err != nil {
				b.Fatal(err)
			}
		}
		_ = c.Close()
	}
}
