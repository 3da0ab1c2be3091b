package egress

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// targetKey carries the checked *target of a forwarded request to the
// upstream transport's dialer.
type targetKey struct{}

// errUnchecked guards against dialling a destination that did not pass
// the checks; it indicates a bug.
var errUnchecked = errors.New("egress: destination was not checked")

// handle serves one client request.
func (p *Proxy) handle(w http.ResponseWriter, r *http.Request) {
	if p.auth != "" {
		got := r.Header.Get("Proxy-Authorization")
		if subtle.ConstantTimeCompare([]byte(got), []byte(p.auth)) != 1 {
			p.recordDenial("no valid proxy token")
			p.log.Info("egress denied", "reason", "no valid proxy token")
			w.Header().Set("Proxy-Authenticate", `Basic realm="neuron-egress"`)
			http.Error(w, "egress: proxy authentication required", http.StatusProxyAuthRequired)
			return
		}
	}
	// The token is the proxy's: it never goes upstream.
	r.Header.Del("Proxy-Authorization")
	if r.Method == http.MethodConnect {
		p.serveConnect(w, r)
		return
	}
	p.serveHTTP(w, r)
}

// badRequest replies 400 with a one-line reason.
func badRequest(w http.ResponseWriter, format string, args ...any) {
	http.Error(w, "egress: bad request: "+fmt.Sprintf(format, args...), http.StatusBadRequest)
}

// serveConnect opens a tunnel to the destination of a CONNECT request.
func (p *Proxy) serveConnect(w http.ResponseWriter, r *http.Request) {
	if r.URL.Host == "" {
		badRequest(w, "CONNECT needs host:port")
		return
	}
	t, err := p.parseTarget(r.URL.Host, 0)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	ctx := r.Context()
	if !p.admit(ctx, w, t, true) {
		return
	}
	up, err := p.dialTarget(ctx, t)
	if err != nil {
		if ref := p.selfRefusal(t, err); ref != nil {
			p.deny(w, ref)
			return
		}
		p.log.Warn("egress dial failed", "dest", p.logDest(t), "err", p.logErr(t, err))
		http.Error(w, "egress: cannot connect to "+t.String()+": "+clientErr(err), http.StatusBadGateway)
		return
	}
	if !p.track(up) {
		up.Close()
		http.Error(w, "egress: proxy is closing", http.StatusServiceUnavailable)
		return
	}
	defer p.untrack(up)
	defer up.Close()

	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "egress: cannot tunnel on this connection", http.StatusInternalServerError)
		return
	}
	cc, brw, err := hj.Hijack()
	if err != nil {
		p.log.Warn("egress hijack failed", "err", err)
		return
	}
	defer cc.Close()
	_ = cc.SetDeadline(time.Time{})
	if _, err := cc.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	// Bytes the client sent right after the CONNECT head (a TLS hello, say)
	// may already sit in the server's read buffer.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			return
		}
	}
	p.log.Debug("egress tunnel open", "dest", p.logDest(t))
	p.splice(cc, up)
	p.log.Debug("egress tunnel closed", "dest", p.logDest(t))
}

// serveHTTP forwards a plain HTTP request, with a credential when its host
// has one.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	var hostport string
	switch {
	case r.URL.IsAbs():
		if r.URL.Scheme != "http" {
			badRequest(w, "only http:// URLs are proxied (use CONNECT for %s)", oneLine(r.URL.Scheme))
			return
		}
		hostport = r.URL.Host
	case strings.HasPrefix(r.URL.Path, "/"):
		hostport = r.Host
	}
	if hostport == "" {
		badRequest(w, "no destination host")
		return
	}
	t, err := p.parseTarget(hostport, 80)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	ctx := r.Context()
	if cr, ok := p.creds[t.host]; ok {
		// Credentialed hosts are reached over TLS on 443 (or their pinned
		// address) whatever port the client named.
		t.port = 443
		if !p.admit(ctx, w, t, false) {
			return
		}
		cr.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, targetKey{}, t)))
		return
	}
	if !p.admit(ctx, w, t, true) {
		return
	}
	p.plain.ServeHTTP(w, r.WithContext(context.WithValue(ctx, targetKey{}, t)))
}

// admit applies the policy (when usePolicy) and the address checks to t.
// It replies and returns false when t is refused.
func (p *Proxy) admit(ctx context.Context, w http.ResponseWriter, t *target, usePolicy bool) bool {
	var ref *refusal
	var err error
	if usePolicy {
		ref, err = p.decide(ctx, t)
		if ref != nil {
			if _, ok := p.creds[t.host]; ok {
				hint := "; send plain HTTP to http://" + t.host + "/ and the proxy adds the credential"
				ref.client += hint
				ref.log += hint
			}
		}
	} else {
		// A credentialed host: the spec named it, and the policy does
		// not apply to it.
		t.lookup = true
	}
	if err == nil && ref == nil {
		ref, err = p.check(ctx, t)
	}
	if err != nil {
		p.log.Warn("egress resolve failed", "dest", p.logDest(t), "err", p.logErr(t, err))
		var re *errResolve
		if errors.As(err, &re) {
			http.Error(w, "egress: "+oneLine(re.Error()), http.StatusBadGateway)
		} else {
			http.Error(w, "egress: internal error", http.StatusInternalServerError)
		}
		return false
	}
	if ref != nil {
		p.deny(w, ref)
		return false
	}
	p.allowed.Add(1)
	p.log.Debug("egress allowed", "dest", p.logDest(t))
	return true
}

// deny records a denial and replies 403 with the reason.
func (p *Proxy) deny(w http.ResponseWriter, ref *refusal) {
	reason := oneLine(ref.client)
	logged := oneLine(ref.log)
	p.recordDenial(logged)
	p.log.Info("egress denied", "reason", logged)
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set(DeniedHeader, reason)
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprintf(w, "egress denied: %s\n", reason)
}

// clientErr renders a dial or upstream error for the client: what went
// wrong, without the addresses a network error carries (the client is
// told what a name resolves to only by connecting to it) nor anything of
// the resolver.
func clientErr(err error) string {
	var de *net.DNSError
	var ne net.Error
	switch {
	case errors.As(err, &de):
		return "cannot resolve the destination"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "destination unreachable"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return "connection failed"
	}
	return oneLine(err.Error())
}

// oneLine replaces control characters so s fits one line and one header.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// parseTarget parses the client's host[:port] ("[v6]:port" for IPv6). A
// missing port is defPort, or an error when defPort is 0.
func (p *Proxy) parseTarget(hostport string, defPort uint16) (*target, error) {
	host, portText := hostport, ""
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && i > strings.LastIndexByte(hostport, ']') {
		h, pt, err := net.SplitHostPort(hostport)
		if err != nil {
			return nil, fmt.Errorf("invalid host:port %q", oneLine(hostport))
		}
		host, portText = h, pt
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	t := &target{port: defPort}
	if portText != "" {
		n, err := strconv.ParseUint(portText, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("invalid port %q", oneLine(portText))
		}
		t.port = uint16(n)
	}
	if t.port == 0 {
		return nil, fmt.Errorf("missing port in %q", oneLine(hostport))
	}
	h, ip, err := normHost(host)
	if err != nil {
		return nil, errors.New(oneLine(err.Error()))
	}
	if strings.HasPrefix(hostport, "[") != ip.Is6() {
		return nil, fmt.Errorf("invalid host %q: IPv6 literals, and only they, go in brackets", oneLine(hostport))
	}
	t.host, t.ip = h, ip
	if !ip.IsValid() {
		t.static = p.static[h]
	}
	return t, nil
}

// rewritePlain points a plain HTTP request at its checked target, keeping
// the client's Host header.
func (p *Proxy) rewritePlain(pr *httputil.ProxyRequest) {
	t, _ := pr.In.Context().Value(targetKey{}).(*target)
	pr.Out.URL.Scheme = "http"
	if t != nil {
		pr.Out.URL.Host = t.String()
	}
	pr.Out.URL.User = nil
	pr.Out.Host = pr.In.Host
}

// upstreamError replies 502 when forwarding fails.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away
	}
	t, ok := r.Context().Value(targetKey{}).(*target)
	if !ok {
		p.log.Warn("egress upstream failed", "err", err.Error())
		http.Error(w, "egress: upstream failed: "+clientErr(err), http.StatusBadGateway)
		return
	}
	if ref := p.selfRefusal(t, err); ref != nil {
		p.deny(w, ref)
		return
	}
	p.log.Warn("egress upstream failed", "dest", p.logDest(t), "err", p.logErr(t, err))
	http.Error(w, "egress: upstream "+t.String()+" failed: "+clientErr(err), http.StatusBadGateway)
}

// dialContext is the upstream transports' dialer: it ignores the address
// the transport asks for and dials the checked target of the request.
func (p *Proxy) dialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	t, ok := ctx.Value(targetKey{}).(*target)
	if !ok {
		return nil, errUnchecked
	}
	return p.dialTarget(ctx, t)
}

// errSelf is a connection that reached this host itself (see dialTarget).
type errSelf struct{ addr netip.Addr }

func (e *errSelf) Error() string { return e.addr.String() + " is a " + hostAddrWhat }

// selfRefusal returns the refusal for a dial that reached this host, or
// nil when err is something else.
func (p *Proxy) selfRefusal(t *target, err error) *refusal {
	var se *errSelf
	if !errors.As(err, &se) {
		return nil
	}
	return p.addrRefusal(t, se.addr, hostAddrWhat)
}

// dialTarget connects to t: its pinned address, else each checked address
// in turn until one answers. It never resolves a name again.
//
// A connection whose local and remote addresses are the same went to
// this host (the kernel picks a local destination's own address as the
// source): it is closed before a byte is sent and refused as an address
// of this host, unless the administrator opened that single address.
// This backs up the address checks when an interface address was added
// after hostAddrs last read them, and covers addresses the host accepts
// without listing them on an interface (local routes).
func (p *Proxy) dialTarget(ctx context.Context, t *target) (net.Conn, error) {
	if t.static != "" {
		return p.dialer.DialContext(ctx, "tcp", t.static)
	}
	if !t.checked || len(t.addrs) == 0 {
		return nil, errUnchecked
	}
	var errs []error
	for _, a := range t.addrs {
		c, err := p.dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a, t.port).String())
		if err == nil {
			if ra, ok := p.reachedSelf(c); ok {
				c.Close()
				return nil, &errSelf{addr: ra}
			}
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// splice copies bytes both ways between the client and the upstream until
// either side closes, the tunnel idles for idleTimeout, or Close closes
// the connections.
func (p *Proxy) splice(client, upstream net.Conn) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{}, 2)
	go func() { p.pipe(upstream, client, &last); done <- struct{}{} }()
	go func() { p.pipe(client, upstream, &last); done <- struct{}{} }()
	<-done
	client.Close()
	upstream.Close()
	<-done
}

// pipe copies src to dst. A read that times out ends the copy only when
// neither direction moved data during the idle timeout.
func (p *Proxy) pipe(dst, src net.Conn, last *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		_ = src.SetReadDeadline(time.Now().Add(p.idleTimeout))
		n, err := src.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			_ = dst.SetWriteDeadline(time.Now().Add(p.idleTimeout))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			last.Store(time.Now().UnixNano())
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < p.idleTimeout {
				continue
			}
			return
		}
	}
}

// reachedSelf reports whether c is a TCP connection to this host (local
// and remote address equal, loopback aside: the loopback ranges govern
// it) that AllowPrivate does not open by its single address, and returns
// that address.
func (p *Proxy) reachedSelf(c net.Conn) (netip.Addr, bool) {
	la, lok := c.LocalAddr().(*net.TCPAddr)
	ra, rok := c.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok {
		return netip.Addr{}, false
	}
	l, r := la.AddrPort().Addr().Unmap(), ra.AddrPort().Addr().Unmap()
	if l != r || r.IsLoopback() || exactlyAllowed(r, p.allowPrivate) {
		return netip.Addr{}, false
	}
	return r, true
}
