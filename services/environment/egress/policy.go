package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Rule is one network rule of a Policy; the first rule that matches a
// destination decides it.
type Rule struct {
	// Host is a domain name, matched case-insensitively against the name
	// the client asked for: exact ("api.example.com") or a wildcard
	// ("*.example.com", any subdomain at any depth but not the apex
	// "example.com"). An IP literal here matches a client that gave that
	// literal. Empty when Prefix is set.
	Host string
	// Prefix is an address range, valid only when Host is empty. It
	// matches a client that gave an IP literal inside it, or a name whose
	// resolved addresses are all inside it, once the name was cleared for
	// resolution (see Policy): a Prefix rule never allows a name alone.
	Prefix netip.Prefix
	// Port restricts the rule to one destination port; 0 matches any port.
	Port uint32
	// Allow is the decision for a matching destination.
	Allow bool
}

// String renders the rule for denial reasons, e.g. "deny *.example.com:443".
func (r Rule) String() string {
	verb := "deny"
	if r.Allow {
		verb = "allow"
	}
	what := r.Host
	if what == "" {
		what = r.Prefix.String()
	}
	if r.Port != 0 {
		what += ":" + strconv.FormatUint(uint64(r.Port), 10)
	}
	return verb + " " + what
}

// Policy is the ordered rule list of one invocation. A destination no rule
// matches gets DefaultAllow. Hosts with a Credential are reachable through
// plain HTTP whatever the policy says; every destination still goes through
// the address checks (see Config.AllowPrivate and Config.StaticHosts).
//
// A name the client asks for is sent to the resolver only when the policy
// could allow it by name: the first Host rule that matches it allows it,
// or no Host rule matches it and DefaultAllow is set. Otherwise it is
// refused unresolved (nothing reaches DNS), even when a Prefix rule would
// have allowed its addresses: under a policy whose only allow rules are
// Prefixes, clients use IP literals, or the policy names the host. A
// cleared name meets the rules in order, Prefix rules included.
type Policy struct {
	// Rules are tried in order; the first match wins.
	Rules []Rule
	// DefaultAllow decides destinations no rule matches.
	DefaultAllow bool
}

// normalize validates the policy and returns a copy with lower-case hosts
// and masked, unmapped prefixes.
func (p Policy) normalize() (Policy, error) {
	out := Policy{DefaultAllow: p.DefaultAllow, Rules: make([]Rule, 0, len(p.Rules))}
	for i, r := range p.Rules {
		if r.Port > 65535 {
			return Policy{}, fmt.Errorf("egress: rule %d: port %d out of range", i+1, r.Port)
		}
		switch {
		case r.Host != "" && r.Prefix.IsValid():
			return Policy{}, fmt.Errorf("egress: rule %d: set Host or Prefix, not both", i+1)
		case r.Host != "":
			h, err := normPattern(r.Host)
			if err != nil {
				return Policy{}, fmt.Errorf("egress: rule %d: %w", i+1, err)
			}
			r.Host = h
		case r.Prefix.IsValid():
			r.Prefix = normPrefix(r.Prefix)
		default:
			return Policy{}, fmt.Errorf("egress: rule %d: Host or Prefix is required", i+1)
		}
		out.Rules = append(out.Rules, r)
	}
	return out, nil
}

// normPattern validates a rule's Host and returns its canonical form.
func normPattern(s string) (string, error) {
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		h, ip, err := normHost(rest)
		if err != nil || ip.IsValid() {
			return "", fmt.Errorf("invalid wildcard host %q", s)
		}
		return "*." + h, nil
	}
	h, _, err := normHost(s)
	if err != nil {
		return "", err
	}
	return h, nil
}

// errBadHost reports a host that is neither a DNS name nor an IP literal.
var errBadHost = errors.New("invalid host")

// normHost lower-cases a host name, drops one trailing dot and validates
// it. For an IP literal (without brackets) it returns the canonical text
// and the address.
func normHost(s string) (string, netip.Addr, error) {
	h := strings.ToLower(s)
	if ip, err := netip.ParseAddr(h); err == nil {
		if ip.Zone() != "" {
			return "", netip.Addr{}, fmt.Errorf("%w %q: IPv6 zones are not allowed", errBadHost, s)
		}
		return ip.String(), ip, nil
	}
	h = strings.TrimSuffix(h, ".")
	if !validHostname(h) {
		return "", netip.Addr{}, fmt.Errorf("%w %q", errBadHost, s)
	}
	return h, netip.Addr{}, nil
}

// validHostname reports whether h (lower case) is a DNS name: labels of
// letters, digits, '-' and '_', 1-63 bytes each, 253 bytes at most. A name
// whose last label is numeric is refused: it is no DNS name, and resolvers
// may read it as an IPv4 address in an odd notation ("127.1").
func validHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		return false
	}
	return true
}

// hostMatches reports whether a rule's host pattern matches host.
func hostMatches(pattern, host string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return len(host) > len(suffix) && strings.HasSuffix(host, suffix)
	}
	return pattern == host
}

// target is one destination asked for by the client.
type target struct {
	host   string     // normalized name, or canonical IP literal text
	port   uint16     // destination port
	ip     netip.Addr // set when host is an IP literal
	static string     // the StaticHosts address, "" when not pinned

	// lookup is set once the policy lets the proxy send host to the
	// resolver (see decide); resolve refuses to look a name up before.
	lookup   bool
	resolved bool
	addrs    []netip.Addr // unmapped; the addresses dialled when not pinned
	checked  bool         // addrs passed the address checks
}

// String renders host:port for the client's messages.
func (t *target) String() string {
	h := t.host
	if t.ip.Is6() {
		h = "[" + h + "]"
	}
	return h + ":" + strconv.Itoa(int(t.port))
}

// isName reports whether resolving t means asking the resolver: t is a
// name the administrator did not pin.
func (t *target) isName() bool {
	return !t.ip.IsValid() && t.static == ""
}

// refusal is why a destination is refused, in two forms: for the client,
// which named the destination and sees it in full, and for the logs and
// Stats, where a name the client chose appears only in its log form (see
// Proxy.logDest) because the client may have put a secret in it.
type refusal struct {
	client string
	log    string
}

// errNoLookup guards against sending a name to the resolver that the
// policy did not clear for it; it indicates a bug.
var errNoLookup = errors.New("egress: name not cleared for resolution")

// errResolve is a failed resolution. Its text is what the client sees:
// the name and nothing of the resolver (not its address, nor its answer).
// The wrapped error, for the logs, has the details.
type errResolve struct {
	host string
	err  error
}

func (e *errResolve) Error() string { return "cannot resolve " + e.host }
func (e *errResolve) Unwrap() error { return e.err }

// resolve fills t.addrs once: the literal, the pinned IP (a pinned name has
// no addresses: it is not resolved), or the resolver's answer. A name is
// only sent to the resolver once decide has set t.lookup.
func (p *Proxy) resolve(ctx context.Context, t *target) ([]netip.Addr, error) {
	if t.resolved {
		return t.addrs, nil
	}
	switch {
	case t.ip.IsValid():
		t.addrs = []netip.Addr{t.ip.Unmap()}
	case t.static != "":
		host, _, _ := net.SplitHostPort(t.static) // validated by New
		if ip, err := netip.ParseAddr(host); err == nil {
			t.addrs = []netip.Addr{ip.Unmap()}
		}
	case !t.lookup:
		return nil, errNoLookup
	default:
		ctx, cancel := context.WithTimeout(ctx, p.dialTimeout)
		defer cancel()
		addrs, err := p.resolver.LookupNetIP(ctx, "ip", t.host)
		if err != nil {
			return nil, &errResolve{host: t.host, err: err}
		}
		if len(addrs) == 0 {
			return nil, &errResolve{host: t.host, err: errors.New("no addresses")}
		}
		t.addrs = make([]netip.Addr, len(addrs))
		for i, a := range addrs {
			t.addrs[i] = a.Unmap()
		}
	}
	t.resolved = true
	return t.addrs, nil
}

// decide applies the policy to t. It returns nil when t is allowed, else
// the refusal. err is a resolution failure.
//
// A name the client asked for goes to the resolver only when the policy
// could allow it by name: the first name rule that matches it (port
// included) allows it, or no name rule matches it and the default is
// allow. Otherwise the name is refused unresolved, so a request under a
// deny policy leaks nothing through DNS (http://<secret>.attacker.example/
// would otherwise hand the secret to the attacker's name server). The
// price: an address (Prefix) rule never allows a name by itself; under a
// policy whose only allow rules are addresses, the client must use an IP
// literal, or the policy must name the host. Once a name is cleared, the
// rules apply in order as written, Prefix rules to the resolved addresses.
// Pinned names (Config.StaticHosts) and IP literals involve no resolver
// and go straight to the rules.
func (p *Proxy) decide(ctx context.Context, t *target) (*refusal, error) {
	if t.isName() {
		if r := p.gate(t); r != nil {
			return r, nil
		}
		t.lookup = true
	}
	for i, r := range p.policy.Rules {
		if r.Port != 0 && r.Port != uint32(t.port) {
			continue
		}
		if r.Host != "" {
			if !hostMatches(r.Host, t.host) {
				continue
			}
		} else {
			addrs, err := p.resolve(ctx, t)
			if err != nil {
				return nil, err
			}
			if !allIn(r.Prefix, addrs) {
				continue
			}
		}
		if r.Allow {
			return nil, nil
		}
		return p.refuse(t, fmt.Sprintf("is denied by rule %d (%s)", i+1, r)), nil
	}
	if p.policy.DefaultAllow {
		return nil, nil
	}
	return p.refuse(t, "is not allowed by the egress policy (no rule matches; default deny)"), nil
}

// gate returns nil when the policy could allow the name t by name, which
// clears it for resolution, else the refusal (see decide).
func (p *Proxy) gate(t *target) *refusal {
	byAddress := false
	for i, r := range p.policy.Rules {
		if r.Port != 0 && r.Port != uint32(t.port) {
			continue
		}
		if r.Host == "" {
			byAddress = byAddress || r.Allow
			continue
		}
		if !hostMatches(r.Host, t.host) {
			continue
		}
		if r.Allow {
			return nil
		}
		return p.refuse(t, fmt.Sprintf("is denied by rule %d (%s)", i+1, r))
	}
	switch {
	case p.policy.DefaultAllow:
		return nil
	case byAddress:
		return p.refuse(t, "is not allowed by the egress policy (no name rule allows it, and names are not resolved "+
			"to be matched against address rules: use an IP literal, or allow the name)")
	}
	return p.refuse(t, "is not allowed by the egress policy (no rule matches; default deny)")
}

// refuse builds the refusal "<destination> <why>".
func (p *Proxy) refuse(t *target, why string) *refusal {
	return &refusal{client: t.String() + " " + why, log: p.logDest(t) + " " + why}
}

// allIn reports whether addrs is non-empty and entirely inside prefix.
func allIn(prefix netip.Prefix, addrs []netip.Addr) bool {
	for _, a := range addrs {
		if !prefix.Contains(a) {
			return false
		}
	}
	return len(addrs) > 0
}

// check applies the address checks to every address of t. It returns nil
// when all may be dialled, else the refusal. Pinned hosts are not checked.
// The client is told which kind of address a name resolves to, never the
// address itself; the log has it.
func (p *Proxy) check(ctx context.Context, t *target) (*refusal, error) {
	if t.static != "" {
		return nil, nil
	}
	addrs, err := p.resolve(ctx, t)
	if err != nil {
		return nil, err
	}
	host, err := p.hosts.get()
	if err != nil {
		p.log.Warn("egress cannot list the host's addresses; refusing", "err", err.Error())
		why := "is refused: the egress proxy cannot list this host's own addresses to exclude them"
		return p.refuse(t, why), nil
	}
	for _, a := range addrs {
		what := addrWhat(a, p.allowPrivate, host)
		if what == "" {
			continue
		}
		return p.addrRefusal(t, a, what), nil
	}
	t.checked = true
	return nil, nil
}

// addrRefusal is the refusal of t because its address a is a what. The
// client hears the address only when it gave it as a literal.
func (p *Proxy) addrRefusal(t *target, a netip.Addr, what string) *refusal {
	if t.ip.IsValid() {
		why := fmt.Sprintf("%s is a %s", a, what)
		return &refusal{client: why, log: why}
	}
	return &refusal{
		client: fmt.Sprintf("%s resolves to a %s", t.host, what),
		log:    fmt.Sprintf("%s: %s is a %s", p.logDest(t), a, what),
	}
}
