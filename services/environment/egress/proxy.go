package egress

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/secbear/neuron/services/environment/scrub"
)

// Credential is an API credential the proxy adds to plain HTTP requests for
// Host, which it then sends over TLS to https://Host. The agent never sees
// Value.
type Credential struct {
	// Host is the DNS name the credential is for, matched
	// case-insensitively and exactly (no wildcards, port ignored).
	Host string
	// Header is the header carrying Value. Empty means
	// "Authorization: Bearer <Value>".
	Header string
	// Value is the secret.
	Value string
}

// Resolver resolves names to addresses; *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config configures a Proxy. The zero value is a proxy that denies
// everything.
type Config struct {
	// Policy decides which destinations are reachable.
	Policy Policy
	// Credentials are injected into plain HTTP requests for their hosts.
	Credentials []Credential
	// Resolver resolves destination names; nil means net.DefaultResolver.
	// A name is only sent to it when the Policy could allow the name by
	// name (see Policy).
	Resolver Resolver
	// StaticHosts pins hosts to addresses ("host" -> "ip:port" or
	// "host:port") chosen by the service's administrator, e.g. to point a
	// credentialed host at a test upstream or an internal gateway. A pinned
	// host is reached at its pinned address whatever port the client asked
	// for; it bypasses the Resolver and the address checks (a "host:port"
	// value is resolved by the system resolver when dialled). The policy
	// still applies to pinned hosts without a credential.
	StaticHosts map[string]string
	// AllowPrivate lists address ranges the administrator allows despite
	// the address checks. A cloud-metadata address, and an address of
	// this host's own network interfaces, is only exempted by a
	// single-address prefix naming it (e.g. 169.254.169.254/32), never by
	// a wider range: opening 10.0.0.0/8 opens the internal network, not
	// the host the proxy runs on. A loopback range opens loopback.
	AllowPrivate []netip.Prefix
	// TLS configures the TLS client used toward credentialed hosts (set
	// RootCAs for a private CA); nil means the system roots. ServerName is
	// always set to the credentialed host.
	TLS *tls.Config
	// DialTimeout bounds each resolution and dial; 0 means 10s.
	DialTimeout time.Duration
	// IdleTimeout closes tunnels with no traffic in either direction, and
	// idle client and upstream connections, after this long; 0 means 2m.
	IdleTimeout time.Duration
	// MaxConns bounds concurrent client connections; 0 means 64. Further
	// clients wait until a connection closes.
	MaxConns int
	// Log receives denials (Info), upstream failures (Warn) and allowed
	// destinations (Debug); nil discards. Credential values and header
	// values are never logged; names the client chose appear as a keyed
	// hash (see Stats.Denials), and every record is scrubbed of Secrets
	// and the credential values.
	Log *slog.Logger
	// Token, when set, is required of every client request as
	// "Proxy-Authorization: Basic base64(neuron:Token)" (what an HTTP
	// client sends for a proxy URL http://neuron:Token@host:port);
	// a request without it is answered 407 and never forwarded. A proxy
	// on a TCP port needs it: a network policy tells pods apart by
	// address, not invocations whose policies both reach the port.
	Token string
	// Secrets are the values the proxy's logs must never contain: every
	// value injected into the invocation, whatever its injection. The
	// Credentials' values are added. Each is replaced in every log record
	// (in any case, as host names are lower-cased, and with its
	// encodings), as is anything shaped like a credential (see package
	// scrub).
	Secrets []string
}

// Stats counts the proxy's decisions since New.
type Stats struct {
	// Allowed counts tunnels opened and requests forwarded.
	Allowed int64
	// Denied counts refused tunnels and requests.
	Denied int64
	// Denials holds the reasons of the last 32 denials, oldest first, as
	// logged: IP literals and names from the spec or the administrator
	// appear as they are, a name the client chose as a keyed hash
	// ("<h:0123456789ab>.example.com:443"), so a secret the client put in
	// a name is not repeated here.
	Denials []string
}

// Defaults for the zero Config fields, and fixed limits.
const (
	defaultDialTimeout = 10 * time.Second
	defaultIdleTimeout = 2 * time.Minute
	defaultMaxConns    = 64

	readHeaderTimeout      = 30 * time.Second
	maxHeaderBytes         = 64 << 10
	maxResponseHeaderBytes = 1 << 20
	maxDenials             = 32
)

// DeniedHeader is the response header carrying the reason of a denial; the
// 403 body says "egress denied: <reason>".
const DeniedHeader = "X-Neuron-Egress-Denied"

// credential is a validated Credential.
type credential struct {
	header string // canonical header name
	value  string // full header value ("Bearer ..." for the default)
	proxy  *httputil.ReverseProxy
	tr     *http.Transport
}

// Proxy is the egress proxy of one invocation. Create it with New, serve
// it with Serve and stop it with Close.
type Proxy struct {
	policy       Policy
	creds        map[string]*credential
	static       map[string]string
	allowPrivate []netip.Prefix
	resolver     Resolver
	dialTimeout  time.Duration
	idleTimeout  time.Duration
	log          *slog.Logger
	dialer       *net.Dialer
	hosts        hostAddrs       // this host's own addresses, refused
	known        map[string]bool // names logged verbatim (see logDest)
	logKey       [32]byte        // the key of logDest's hash
	// auth is the Proxy-Authorization every request must carry; ""
	// when Config.Token is unset.
	auth string

	srv   *http.Server
	plain *httputil.ReverseProxy
	tr    *http.Transport

	sem       chan struct{} // one token per open client connection
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error

	allowed atomic.Int64
	denied  atomic.Int64

	mu      sync.Mutex
	closed  bool
	conns   map[io.Closer]struct{} // client connections and tunnel upstreams
	denials []string
}

// New validates cfg and returns a proxy ready to Serve.
func New(cfg Config) (*Proxy, error) {
	if cfg.DialTimeout < 0 || cfg.IdleTimeout < 0 || cfg.MaxConns < 0 {
		return nil, errors.New("egress: negative DialTimeout, IdleTimeout or MaxConns")
	}
	policy, err := cfg.Policy.normalize()
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		auth:        proxyAuth(cfg.Token),
		policy:      policy,
		creds:       make(map[string]*credential, len(cfg.Credentials)),
		static:      make(map[string]string, len(cfg.StaticHosts)),
		resolver:    cfg.Resolver,
		dialTimeout: cmp(cfg.DialTimeout, defaultDialTimeout),
		idleTimeout: cmp(cfg.IdleTimeout, defaultIdleTimeout),
		log:         cfg.Log,
		done:        make(chan struct{}),
		conns:       make(map[io.Closer]struct{}),
	}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	secrets := append([]string(nil), cfg.Secrets...)
	for _, c := range cfg.Credentials {
		secrets = append(secrets, c.Value)
	}
	p.log = slog.New(scrub.NewHandler(p.log.Handler(), scrub.New(secrets)))
	if _, err := rand.Read(p.logKey[:]); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	p.known = make(map[string]bool)
	for _, r := range policy.Rules {
		if r.Host != "" && !strings.HasPrefix(r.Host, "*.") {
			p.known[r.Host] = true
		}
	}
	p.sem = make(chan struct{}, cmp(cfg.MaxConns, defaultMaxConns))
	p.dialer = &net.Dialer{Timeout: p.dialTimeout}

	for _, pr := range cfg.AllowPrivate {
		if !pr.IsValid() {
			return nil, fmt.Errorf("egress: invalid AllowPrivate prefix %v", pr)
		}
		p.allowPrivate = append(p.allowPrivate, normPrefix(pr))
	}
	for h, addr := range cfg.StaticHosts {
		host, ip, err := normHost(h)
		if err != nil || ip.IsValid() {
			return nil, fmt.Errorf("egress: StaticHosts key %q is not a DNS name", h)
		}
		ah, port, err := net.SplitHostPort(addr)
		if err != nil || ah == "" {
			return nil, fmt.Errorf("egress: StaticHosts[%q] = %q: want ip:port or host:port", h, addr)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("egress: StaticHosts[%q] = %q: invalid port", h, addr)
		}
		p.static[host] = addr
		p.known[host] = true
	}

	errorLog := slog.NewLogLogger(p.log.Handler(), slog.LevelWarn)
	p.tr = p.newTransport(nil)
	p.plain = &httputil.ReverseProxy{
		Rewrite:       p.rewritePlain,
		Transport:     p.tr,
		FlushInterval: -1,
		ErrorHandler:  p.upstreamError,
		ErrorLog:      errorLog,
	}
	for i, c := range cfg.Credentials {
		cr, host, err := p.newCredential(c, cfg.TLS, errorLog)
		if err != nil {
			return nil, fmt.Errorf("egress: credential %d: %w", i+1, err)
		}
		if _, dup := p.creds[host]; dup {
			return nil, fmt.Errorf("egress: credential %d: host %s has two credentials", i+1, host)
		}
		p.creds[host] = cr
		p.known[host] = true
	}

	p.srv = &http.Server{
		Handler:                      http.HandlerFunc(p.handle),
		ReadHeaderTimeout:            readHeaderTimeout,
		IdleTimeout:                  p.idleTimeout,
		MaxHeaderBytes:               maxHeaderBytes,
		ErrorLog:                     errorLog,
		DisableGeneralOptionsHandler: true,
	}
	return p, nil
}

// proxyAuth is the Proxy-Authorization header value of token: Basic
// with user "neuron"; "" for no token.
func proxyAuth(token string) string {
	if token == "" {
		return ""
	}
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("neuron:"+token))
}

// ProxyUser is the user name of a proxy URL carrying Config.Token.
const ProxyUser = "neuron"

// cmp returns v, or def when v is zero.
func cmp[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// framingHeaders may not carry a credential: the proxy or the transport
// owns them.
var framingHeaders = map[string]bool{
	"Host": true, "Connection": true, "Content-Length": true, "Transfer-Encoding": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Keep-Alive": true,
	"Proxy-Authorization": true, "Proxy-Authenticate": true, "Proxy-Connection": true,
}

// newCredential validates c and builds the reverse proxy that serves its
// host. It returns the normalized host.
func (p *Proxy) newCredential(c Credential, base *tls.Config, errorLog *log.Logger) (*credential, string, error) {
	if c.Host == "" || c.Value == "" {
		return nil, "", errors.New("Host and Value are required")
	}
	host, ip, err := normHost(c.Host)
	if err != nil || ip.IsValid() {
		return nil, "", fmt.Errorf("host %q is not a DNS name", c.Host)
	}
	for i := 0; i < len(c.Value); i++ {
		if b := c.Value[i]; b < 0x20 && b != '\t' || b == 0x7f {
			return nil, "", fmt.Errorf("host %s: value contains a control character", host)
		}
	}
	cr := &credential{header: "Authorization", value: "Bearer " + c.Value}
	if c.Header != "" {
		if !validToken(c.Header) {
			return nil, "", fmt.Errorf("host %s: invalid header name %q", host, c.Header)
		}
		cr.header = http.CanonicalHeaderKey(c.Header)
		cr.value = c.Value
		if framingHeaders[cr.header] {
			return nil, "", fmt.Errorf("host %s: header %s cannot carry a credential", host, cr.header)
		}
	}
	var tc *tls.Config
	if base != nil {
		tc = base.Clone()
	} else {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tc.ServerName = host
	cr.tr = p.newTransport(tc)
	cr.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = host
			pr.Out.URL.User = nil
			pr.Out.Host = host
			pr.Out.Header.Del(cr.header)
			pr.Out.Header.Set(cr.header, cr.value)
		},
		Transport:     cr.tr,
		FlushInterval: -1,
		ErrorHandler:  p.upstreamError,
		ErrorLog:      errorLog,
	}
	return cr, host, nil
}

// validToken reports whether s is an HTTP token (a valid header name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c < 0x7f && c > ' ' && strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// newTransport returns an upstream transport that only dials the checked
// target carried by the request context. tc is nil for plain HTTP.
func (p *Proxy) newTransport(tc *tls.Config) *http.Transport {
	return &http.Transport{
		Proxy:                  nil, // never chain to the environment's proxy
		DialContext:            p.dialContext,
		TLSClientConfig:        tc,
		ForceAttemptHTTP2:      tc != nil,
		TLSHandshakeTimeout:    p.dialTimeout,
		IdleConnTimeout:        p.idleTimeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		DisableCompression:     true, // pass bodies through as the upstream sent them
	}
}

// Serve accepts client connections on l until Close, then returns nil. It
// returns the listener's error if accepting fails otherwise. l is closed
// when Serve returns.
func (p *Proxy) Serve(l net.Listener) error {
	err := p.srv.Serve(&limitListener{Listener: l, p: p})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops every Serve, closes the listeners and every open client
// connection, tunnel and upstream connection. It is idempotent.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		close(p.done)
		p.closeErr = p.srv.Close()
		p.mu.Lock()
		p.closed = true
		open := make([]io.Closer, 0, len(p.conns))
		for c := range p.conns {
			open = append(open, c)
		}
		p.mu.Unlock()
		for _, c := range open {
			c.Close()
		}
		p.tr.CloseIdleConnections()
		for _, c := range p.creds {
			c.tr.CloseIdleConnections()
		}
	})
	return p.closeErr
}

// Stats returns the decision counters and the last denial reasons.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{
		Allowed: p.allowed.Load(),
		Denied:  p.denied.Load(),
		Denials: append([]string(nil), p.denials...),
	}
}

// recordDenial counts and remembers one denial.
func (p *Proxy) recordDenial(reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.denied.Add(1)
	if len(p.denials) == maxDenials {
		copy(p.denials, p.denials[1:])
		p.denials = p.denials[:maxDenials-1]
	}
	p.denials = append(p.denials, reason)
}

// track registers c to be closed by Close. It returns false, and c must be
// closed by the caller, when the proxy is already closed.
func (p *Proxy) track(c io.Closer) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// untrack forgets c.
func (p *Proxy) untrack(c io.Closer) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// limitListener bounds the open client connections to cap(p.sem) and
// registers each with the proxy.
type limitListener struct {
	net.Listener
	p *Proxy
}

// Accept waits for a free connection slot, then for a client.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.p.sem <- struct{}{}:
	case <-l.p.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.p.sem
		return nil, err
	}
	tc := &clientConn{Conn: c, p: l.p}
	if !l.p.track(tc) {
		tc.Close()
		return nil, net.ErrClosed
	}
	return tc, nil
}

// clientConn is an accepted client connection; closing it frees its slot.
type clientConn struct {
	net.Conn
	p    *Proxy
	once sync.Once
}

// Close closes the connection once and frees its slot.
func (c *clientConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		err = c.Conn.Close()
		c.p.untrack(c)
		<-c.p.sem
	})
	return err
}

// ListenUnix listens on the Unix socket path with mode 0666, so that a
// sandbox running as another uid can connect. A stale socket at path is
// removed first; a socket still being served, or a file that is not a
// socket, is an error. The socket file is removed when the listener closes.
func ListenUnix(path string) (net.Listener, error) {
	fi, err := os.Lstat(path)
	switch {
	case err == nil:
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("egress: %s exists and is not a socket", path)
		}
		d := net.Dialer{Timeout: time.Second}
		if c, err := d.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("egress: %s is in use", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("egress: remove stale socket: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("egress: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("egress: %w", err)
	}
	return l, nil
}
