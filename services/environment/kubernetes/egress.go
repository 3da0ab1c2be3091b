package kubernetes

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"syscall"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/egress"
)

// egressEndpoint is where an invocation's pod reaches its egress proxy.
type egressEndpoint struct {
	addr  netip.AddrPort
	token string
}

// proxyURL is the operator's --egress-proxy: the token as the password
// of egress.ProxyUser.
func (e *egressEndpoint) proxyURL() string {
	return (&url.URL{Scheme: "http", User: url.UserPassword(egress.ProxyUser, e.token), Host: e.addr.String()}).String()
}

// hasSidecar reports whether creds hold a sidecar credential.
func hasSidecar(creds []environment.Credential) bool {
	for _, c := range creds {
		if c.Injection.GetSidecar() != nil {
			return true
		}
	}
	return false
}

// startEgress starts inv's egress proxy on Config.EgressHost, on a free
// port of the configured range, with a fresh token, when inv has a
// sidecar credential (the only egress the proxy serves here: other
// network rules are the NetworkPolicy's). It returns nil and a no-op
// otherwise.
func (b *Backend) startEgress(inv *environment.Invocation) (*egressEndpoint, func(), error) {
	if !hasSidecar(inv.Credentials) {
		return nil, func() {}, nil
	}
	if b.cfg.EgressHost == "" {
		return nil, nil, fmt.Errorf("a sidecar credential needs the service's egress proxy, and this kubernetes backend has no egress host (--kube-egress-host): %w", errs.FailedPrecondition)
	}
	if inv.EgressListener == nil {
		return nil, nil, fmt.Errorf("a sidecar credential needs an egress proxy, and this environment service starts none on TCP: %w", errs.FailedPrecondition)
	}
	host, err := netip.ParseAddr(b.cfg.EgressHost)
	if err != nil {
		return nil, nil, fmt.Errorf("egress host %q: %v: %w", b.cfg.EgressHost, err, errs.FailedPrecondition)
	}
	l, err := b.listenEgress(host)
	if err != nil {
		return nil, nil, err
	}
	var raw [24]byte
	_, _ = rand.Read(raw[:])
	token := hex.EncodeToString(raw[:])
	stop, err := inv.EgressListener(l, token)
	if err != nil {
		_ = l.Close()
		return nil, nil, fmt.Errorf("starting the egress proxy: %v: %w", err, errs.Retryable)
	}
	port := l.Addr().(*net.TCPAddr).Port
	return &egressEndpoint{addr: netip.AddrPortFrom(host, uint16(port)), token: token}, stop, nil
}

// listenEgress listens on host at a free port of the configured range,
// trying ports from a random one on.
func (b *Backend) listenEgress(host netip.Addr) (net.Listener, error) {
	lo, hi := b.cfg.EgressPortMin, b.cfg.EgressPortMax
	n := hi - lo + 1
	first, _ := rand.Int(rand.Reader, big.NewInt(int64(n)))
	for i := range n {
		port := lo + (int(first.Int64())+i)%n
		l, err := net.Listen("tcp", net.JoinHostPort(host.String(), strconv.Itoa(port)))
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("listening for the egress proxy on %s: %v: %w", host, err, errs.Retryable)
		}
	}
	return nil, fmt.Errorf("every egress proxy port %d-%d on %s is in use (one per running invocation with a sidecar credential); retry later: %w", lo, hi, host, errs.ResourceExhausted)
}
