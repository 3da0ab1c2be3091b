package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

// Pool defaults.
const (
	DefaultPoolSize       = 32
	DefaultIdleTimeout    = 5 * time.Minute
	DefaultConnectTimeout = 30 * time.Second
)

// PoolConfig configures a Pool. Zero values take the defaults.
type PoolConfig struct {
	// MaxServers bounds the open connections. When the pool is full, the
	// least recently used idle connection is closed to make room; when
	// every connection is in use, Acquire fails with
	// errs.ResourceExhausted. Zero: DefaultPoolSize.
	MaxServers int
	// IdleTimeout closes a connection no invocation has used for this
	// long. Zero: DefaultIdleTimeout.
	IdleTimeout time.Duration
	// ConnectTimeout bounds starting a server, its handshake and listing
	// its tools. Zero: DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// Registry are the options of each server's tool registry (default
	// timeout, output limit), the deployment's own.
	Registry []tool.Option
	// Log receives the servers' logs; nil discards them.
	Log *slog.Logger
}

// Pool shares MCP connections between invocations: one connection per
// server definition, keyed by a canonical hash of the definition (Key),
// so invocations of a busy agent reuse the server instead of starting it
// per call. Each connection has its own tool.Registry holding the
// server's tools (compiled once per connection). A server that cannot be
// started fails the Acquire that needed it and is tried again by the next
// one; a connection that died is replaced on the next Acquire. Safe for
// concurrent use.
type Pool struct {
	cfg  PoolConfig
	log  *slog.Logger
	now  func() time.Time
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	entries map[string]*poolEntry
	closed  bool
	starts  int
}

type poolEntry struct {
	key    string
	name   string
	ready  chan struct{} // closed when connecting ended (client or err set)
	client *Client
	reg    *tool.Registry
	err    error
	// Guarded by Pool.mu.
	refs     int
	lastUsed time.Time
	removed  bool // out of the map; the last Release closes it
}

// NewPool returns a pool; Close it to close every connection. It sweeps
// idle connections in the background.
func NewPool(cfg PoolConfig) *Pool {
	if cfg.MaxServers <= 0 {
		cfg.MaxServers = DefaultPoolSize
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Pool{cfg: cfg, log: log, now: time.Now, stop: make(chan struct{}), entries: map[string]*poolEntry{}}
	p.wg.Go(p.sweeper)
	return p
}

// Lease is an invocation's use of one pooled server. Release it when the
// invocation ends; the connection stays open for the next one.
type Lease struct {
	// Registry holds the server's tools. It is shared: only read it and
	// call its tools.
	Registry *tool.Registry
	pool     *Pool
	entry    *poolEntry
	once     sync.Once
}

// Release returns the lease. It is idempotent.
func (l *Lease) Release() {
	l.once.Do(func() { l.pool.release(l.entry) })
}

// Key is the canonical hash of a server definition: every field that
// changes what is started or reached, or how its tools are offered
// (maps and lists that are sets sorted, header values included but only
// hashed). Two definitions with one key share a connection.
func Key(s Server) string {
	type canonical struct {
		Name     string
		Command  []string
		Env      []string
		URL      string
		Headers  [][2]string
		Timeout  time.Duration
		ReadOnly []string
	}
	c := canonical{Name: s.Name, Command: s.Command, Env: slices.Sorted(slices.Values(s.Env)), URL: s.URL,
		Timeout: s.Timeout, ReadOnly: slices.Compact(slices.Sorted(slices.Values(s.ReadOnly)))}
	for k, v := range s.Headers {
		c.Headers = append(c.Headers, [2]string{k, v})
	}
	slices.SortFunc(c.Headers, func(a, b [2]string) int {
		if a[0] < b[0] {
			return -1
		}
		if a[0] > b[0] {
			return 1
		}
		return 0
	})
	b, _ := json.Marshal(c) // strings, slices and an int: never fails
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Acquire returns a lease on a connection to s: an open one of the same
// definition (Key), or a new one started now. ctx bounds the wait only;
// a start, once begun, runs to its own timeout so that a caller giving
// up does not fail the others waiting for the same server. Errors: an
// invalid s wraps errs.InvalidArgument; a server that cannot be started
// or reached, or whose tools cannot be listed, errs.Unavailable; one
// whose tools the registry refuses errs.FailedPrecondition; a pool whose
// connections are all in use errs.ResourceExhausted. Each names the
// server. HTTPClient, when set on s, is not part of the key.
func (p *Pool) Acquire(ctx context.Context, s Server) (*Lease, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	key := Key(s)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("MCP server %q: the operator is shutting down: %w", s.Name, errs.Unavailable)
	}
	e := p.entries[key]
	if e != nil && isReady(e) && (e.err != nil || !e.client.Alive()) {
		p.log.Info("MCP server connection is gone; starting it again", "mcp_server", s.Name)
		p.removeLocked(e)
		e = nil
	}
	if e == nil {
		if len(p.entries) >= p.cfg.MaxServers && !p.evictLocked() {
			p.mu.Unlock()
			return nil, fmt.Errorf("MCP server %q: the operator's MCP connection pool is full (%d servers, all in use by running invocations); retry later, or raise --mcp-pool-size: %w",
				s.Name, p.cfg.MaxServers, errs.ResourceExhausted)
		}
		e = &poolEntry{key: key, name: s.Name, ready: make(chan struct{})}
		p.entries[key] = e
		p.starts++
		p.wg.Go(func() { p.connect(e, s) })
	}
	e.refs++
	e.lastUsed = p.now()
	p.mu.Unlock()

	select {
	case <-e.ready:
	case <-ctx.Done():
		p.release(e)
		return nil, fmt.Errorf("MCP server %q: waiting for it to start was interrupted: %w", s.Name, context.Cause(ctx))
	}
	if e.err != nil {
		p.release(e)
		return nil, e.err
	}
	return &Lease{Registry: e.reg, pool: p, entry: e}, nil
}

func isReady(e *poolEntry) bool {
	select {
	case <-e.ready:
		return true
	default:
		return false
	}
}

// connect starts the server of e and lists its tools into a registry of
// its own. A failure is recorded in e, which leaves the map so that the
// next Acquire tries again.
func (p *Pool) connect(e *poolEntry, s Server) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ConnectTimeout)
	defer cancel()
	c, reg, err := p.open(ctx, s)
	p.mu.Lock()
	e.client, e.reg, e.err = c, reg, err
	if err != nil {
		p.log.Warn("MCP server failed to start", "mcp_server", s.Name, "err", err.Error())
		if p.entries[e.key] == e {
			delete(p.entries, e.key)
		}
		e.removed = true
	} else if p.closed {
		e.removed = true
	}
	closeNow := c != nil && e.removed && e.refs == 0
	close(e.ready)
	p.mu.Unlock()
	if closeNow {
		_ = c.Close()
	}
}

func (p *Pool) open(ctx context.Context, s Server) (*Client, *tool.Registry, error) {
	c, err := Connect(ctx, s, p.log)
	if err != nil {
		return nil, nil, err
	}
	tools, err := c.Tools(ctx)
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	reg := tool.NewRegistry(p.cfg.Registry...)
	for _, t := range tools {
		if err := reg.Register(t); err != nil {
			_ = c.Close()
			return nil, nil, fmt.Errorf("MCP server %q offers a tool the operator cannot use: %v: %w", s.Name, err, errs.FailedPrecondition)
		}
	}
	p.log.Info("MCP server pooled", "mcp_server", s.Name, "tools", len(tools))
	return c, reg, nil
}

func (p *Pool) release(e *poolEntry) {
	p.mu.Lock()
	e.refs--
	e.lastUsed = p.now()
	closeNow := e.removed && e.refs == 0 && e.client != nil
	p.mu.Unlock()
	if closeNow {
		_ = e.client.Close()
	}
}

// removeLocked takes e out of the map; it is closed now when unused,
// else by its last Release.
func (p *Pool) removeLocked(e *poolEntry) {
	if p.entries[e.key] == e {
		delete(p.entries, e.key)
	}
	e.removed = true
	if e.refs == 0 && e.client != nil {
		c := e.client
		p.wg.Go(func() { _ = c.Close() })
	}
}

// evictLocked closes the least recently used idle connection, reporting
// whether there was one.
func (p *Pool) evictLocked() bool {
	var lru *poolEntry
	for _, e := range p.entries {
		if e.refs == 0 && isReady(e) && (lru == nil || e.lastUsed.Before(lru.lastUsed)) {
			lru = e
		}
	}
	if lru == nil {
		return false
	}
	p.log.Info("MCP pool full: closing the least recently used idle server", "mcp_server", lru.name)
	p.removeLocked(lru)
	return true
}

// sweeper closes idle connections until Close.
func (p *Pool) sweeper() {
	every := max(p.cfg.IdleTimeout/2, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.sweep()
		}
	}
}

// sweep closes the connections idle for longer than IdleTimeout, and
// drops those that died while idle.
func (p *Pool) sweep() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for _, e := range p.entries {
		if e.refs != 0 || !isReady(e) {
			continue
		}
		if now.Sub(e.lastUsed) > p.cfg.IdleTimeout || !e.client.Alive() {
			p.log.Info("MCP server idle: closing it", "mcp_server", e.name)
			p.removeLocked(e)
		}
	}
}

// Stats reports the open connections (and those starting) and how many
// servers the pool has started since it was made.
func (p *Pool) Stats() (open, starts int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.entries), p.starts
}

// Close closes every connection not in use now, and the others when
// their leases are released; later Acquires fail. It waits for starts in
// progress to end.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.stop)
	for _, e := range p.entries {
		if isReady(e) {
			p.removeLocked(e)
		} else {
			e.removed = true
		}
	}
	p.entries = map[string]*poolEntry{}
	p.mu.Unlock()
	p.wg.Wait()
}
