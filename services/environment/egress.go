package environment

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	"github.com/secbear/neuron/services/environment/egress"
)

// EgressOptions are the administrator's egress settings, shared by every
// invocation's proxy.
type EgressOptions struct {
	// StaticHosts pins host names to addresses, trusted as given.
	StaticHosts map[string]string
	// AllowPrivate lists private or loopback ranges the proxies may
	// reach despite the address checks.
	AllowPrivate []netip.Prefix
	// TLS configures connections to credentialed hosts (extra roots).
	TLS *tls.Config
	// Resolver resolves names; nil is the system resolver.
	Resolver egress.Resolver
}

// NewEgressFactory returns an EgressFactory that starts one egress.Proxy
// per invocation with opts. The proxy injects the sidecar credentials and
// scrubs every credential value of the invocation from its logs.
func NewEgressFactory(opts EgressOptions) EgressFactory {
	serve := NewEgressListenFactory(opts)
	return func(path string, policy NetworkPolicy, creds []Credential, log *slog.Logger) (func(), error) {
		l, err := egress.ListenUnix(path)
		if err != nil {
			return nil, fmt.Errorf("egress proxy: %w", err)
		}
		return serve(l, "", policy, creds, log)
	}
}

// EgressListenFactory starts an egress proxy for one invocation on l (a
// TCP listener a backend made, which the proxy closes), requiring token
// of every request when not empty (egress.Config.Token).
type EgressListenFactory func(l net.Listener, token string, policy NetworkPolicy, creds []Credential, log *slog.Logger) (stop func(), err error)

// NewEgressListenFactory returns an EgressListenFactory that starts one
// egress.Proxy per invocation with opts, as NewEgressFactory.
func NewEgressListenFactory(opts EgressOptions) EgressListenFactory {
	return func(l net.Listener, token string, policy NetworkPolicy, creds []Credential, log *slog.Logger) (func(), error) {
		cfg := egress.Config{
			Token:        token,
			Policy:       egress.Policy{DefaultAllow: policy.DefaultAllow},
			Resolver:     opts.Resolver,
			StaticHosts:  opts.StaticHosts,
			AllowPrivate: opts.AllowPrivate,
			TLS:          opts.TLS,
			Log:          log.With("component", "egress"),
		}
		for _, r := range policy.Rules {
			cfg.Policy.Rules = append(cfg.Policy.Rules, egress.Rule{Host: r.Host, Prefix: r.Prefix, Port: r.Port, Allow: r.Allow})
		}
		for _, c := range creds {
			cfg.Secrets = append(cfg.Secrets, c.Value)
			if s := c.Injection.GetSidecar(); s != nil {
				cfg.Credentials = append(cfg.Credentials, egress.Credential{Host: strings.ToLower(s.GetHost()), Header: s.GetHeader(), Value: c.Value})
			}
		}
		p, err := egress.New(cfg)
		if err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("egress proxy: %w", err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := p.Serve(l); err != nil {
				log.Warn("egress proxy stopped", "error", err.Error())
			}
		}()
		return func() {
			_ = p.Close()
			<-done
			st := p.Stats()
			if st.Denied > 0 {
				// The denials are in the proxy's log form: no name the
				// sandbox chose, no secret (see egress.Stats).
				log.Info("egress summary", "allowed", st.Allowed, "denied", st.Denied, "denials", strings.Join(st.Denials, "; "))
			}
		}, nil
	}
}
