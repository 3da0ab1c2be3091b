package kubernetes

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// egressRule is one allow rule of the policy as a NetworkPolicy can hold
// it: a prefix minus the prefixes of earlier deny rules, on a port or all.
type egressRule struct {
	prefix netip.Prefix
	port   uint32
	except []netip.Prefix
}

// namedRule is a rule with a description for error messages.
type namedRule struct {
	environment.NetworkRule
	name string
}

// egressRules translates p, an ordered first-match list, into the union
// of allow rules a NetworkPolicy holds: each allow rule minus the earlier
// deny rules that overlap it. It returns an error wrapping
// errs.FailedPrecondition, naming the rule, when p names a domain or has
// a port-specific deny overlapping an all-ports allow.
func egressRules(p environment.NetworkPolicy) ([]egressRule, error) {
	var hosts []string
	rules := make([]namedRule, 0, len(p.Rules)+2)
	for i, r := range p.Rules {
		if r.Host != "" {
			hosts = append(hosts, r.Host)
		}
		rules = append(rules, namedRule{r, fmt.Sprintf("rule %d (%s %s)", i, action(r.Allow), describe(r))})
	}
	if len(hosts) > 0 {
		return nil, fmt.Errorf("the kubernetes backend enforces the network policy with a NetworkPolicy, which matches IP addresses only, not the domains %s; use CIDRs (e.g. 203.0.113.0/24) instead: %w",
			strings.Join(hosts, ", "), errs.FailedPrecondition)
	}
	if p.DefaultAllow {
		for _, all := range []string{"0.0.0.0/0", "::/0"} {
			r := environment.NetworkRule{Prefix: netip.MustParsePrefix(all), Allow: true}
			rules = append(rules, namedRule{r, "the default allow (" + all + ")"})
		}
	}

	var out []egressRule
	for i, r := range rules {
		if !r.Allow {
			continue
		}
		e := egressRule{prefix: r.Prefix, port: r.Port}
		shadowed := false
		for _, d := range rules[:i] {
			if d.Allow || !overlaps(d.Prefix, r.Prefix) {
				continue
			}
			if d.Port != 0 && r.Port != 0 && d.Port != r.Port {
				continue // different ports: they never match the same traffic
			}
			if d.Port != 0 && r.Port == 0 {
				return nil, fmt.Errorf("%s denies only port %d inside %s, which allows every port; a NetworkPolicy cannot take one port out of an address block, so split the allow into rules with ports, or deny every port: %w",
					d.name, d.Port, r.name, errs.FailedPrecondition)
			}
			if d.Prefix.Bits() <= r.Prefix.Bits() {
				shadowed = true // the deny covers the whole allow
				break
			}
			e.except = addExcept(e.except, d.Prefix)
		}
		if shadowed {
			continue
		}
		// The cloud's metadata service hands out the node's
		// credentials: taken out of every allow, as the egress proxy
		// refuses it whatever the rules say.
		for _, m := range metadataPrefixes {
			if !overlaps(m, r.Prefix) {
				continue
			}
			if r.Prefix.Bits() >= m.Bits() {
				return nil, fmt.Errorf("%s allows the cloud metadata address %s, which hands out the node's credentials; the kubernetes backend never opens it: %w", r.name, m.Addr(), errs.FailedPrecondition)
			}
			e.except = addExcept(e.except, m)
		}
		out = append(out, e)
	}
	return out, nil
}

// overlaps reports whether two prefixes of the same family share an
// address.
func overlaps(a, b netip.Prefix) bool {
	return a.Addr().Is4() == b.Addr().Is4() && a.Overlaps(b)
}

// addExcept adds p to except unless a prefix there already holds it, and
// drops the prefixes p holds.
func addExcept(except []netip.Prefix, p netip.Prefix) []netip.Prefix {
	out := except[:0:0]
	for _, e := range except {
		if e.Bits() <= p.Bits() && e.Contains(p.Addr()) {
			return except
		}
		if !(p.Bits() <= e.Bits() && p.Contains(e.Addr())) {
			out = append(out, e)
		}
	}
	return append(out, p)
}

func action(allow bool) string {
	if allow {
		return "allow"
	}
	return "deny"
}

func describe(r environment.NetworkRule) string {
	s := r.Host
	if s == "" {
		s = r.Prefix.String()
	}
	if r.Port != 0 {
		s += fmt.Sprintf(" port %d", r.Port)
	}
	return s
}

// networkPolicySpec is the NetworkPolicy spec for the pod labelled
// invocationLabel=id: no ingress, and egress as rules allow.
func networkPolicySpec(id string, rules []egressRule) networkingv1.NetworkPolicySpec {
	egress := []networkingv1.NetworkPolicyEgressRule{}
	for _, r := range rules {
		block := &networkingv1.IPBlock{CIDR: r.prefix.String()}
		for _, e := range r.except {
			block.Except = append(block.Except, e.String())
		}
		rule := networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{IPBlock: block}}}
		if r.port != 0 {
			port := intstr.FromInt32(int32(r.port))
			for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
				rule.Ports = append(rule.Ports, networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port})
			}
		}
		egress = append(egress, rule)
	}
	return networkingv1.NetworkPolicySpec{
		PodSelector: podSelector(id),
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{},
		Egress:      egress,
	}
}
