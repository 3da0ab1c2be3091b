package k8s_test

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// invocationPodLabels are the labels the environment service's kubernetes
// backend puts on the pod of an invocation's Job
// (services/environment/kubernetes).
var invocationPodLabels = map[string]string{
	"neuron.dev/invocation":        "inv-1",
	"app.kubernetes.io/managed-by": "neuron-environment",
}

// endpoint is one end of a connection: a pod (namespace set) or an
// address outside the cluster (namespace empty).
type endpoint struct {
	name      string
	namespace string
	labels    map[string]string
	ip        netip.Addr
	// ports are the pod's named container ports, for named policy ports.
	ports map[string]int32
}

// netModel evaluates the NetworkPolicies of one namespace the way the
// NetworkPolicy API defines them: a pod selected by no policy of a type
// is open in that direction; a selected pod admits exactly the union of
// the rules of the policies that select it; a connection needs the
// source's egress and the destination's ingress.
type netModel struct {
	namespace string
	policies  []*networkingv1.NetworkPolicy
	// nsLabels are the labels of every namespace the tests use.
	nsLabels map[string]map[string]string
}

func (n *netModel) selects(p *networkingv1.NetworkPolicy, ep endpoint) bool {
	if ep.namespace != p.Namespace {
		return false
	}
	return matchSelector(&p.Spec.PodSelector, ep.labels)
}

func matchSelector(s *metav1.LabelSelector, l map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		panic(fmt.Sprintf("selector %v: %v", s, err))
	}
	return sel.Matches(labels.Set(l))
}

// hasType reports whether p applies in direction t (Ingress or Egress),
// with the API's defaults when policyTypes is empty.
func hasType(p *networkingv1.NetworkPolicy, t networkingv1.PolicyType) bool {
	if len(p.Spec.PolicyTypes) == 0 {
		return t == networkingv1.PolicyTypeIngress || len(p.Spec.Egress) > 0
	}
	for _, pt := range p.Spec.PolicyTypes {
		if pt == t {
			return true
		}
	}
	return false
}

func (n *netModel) peerMatches(p *networkingv1.NetworkPolicy, peer networkingv1.NetworkPolicyPeer, ep endpoint) bool {
	if peer.IPBlock != nil {
		cidr := netip.MustParsePrefix(peer.IPBlock.CIDR)
		if !ep.ip.IsValid() || !cidr.Contains(ep.ip) {
			return false
		}
		for _, ex := range peer.IPBlock.Except {
			if netip.MustParsePrefix(ex).Contains(ep.ip) {
				return false
			}
		}
		return true
	}
	if ep.namespace == "" {
		return false // only ipBlocks match addresses outside the cluster
	}
	if peer.NamespaceSelector != nil {
		if !matchSelector(peer.NamespaceSelector, n.nsLabels[ep.namespace]) {
			return false
		}
	} else if ep.namespace != p.Namespace {
		return false
	}
	if peer.PodSelector != nil {
		return matchSelector(peer.PodSelector, ep.labels)
	}
	return true
}

func portMatches(ports []networkingv1.NetworkPolicyPort, proto corev1.Protocol, port int32, dst endpoint) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		pp := corev1.ProtocolTCP
		if p.Protocol != nil {
			pp = *p.Protocol
		}
		if pp != proto {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String:
			if named, ok := dst.ports[p.Port.StrVal]; ok && named == port {
				return true
			}
		case p.EndPort != nil:
			if port >= p.Port.IntVal && port <= *p.EndPort {
				return true
			}
		case p.Port.IntVal == port:
			return true
		}
	}
	return false
}

// egressAllowed: may src send to dst:port under the policies selecting src?
func (n *netModel) egressAllowed(src, dst endpoint, proto corev1.Protocol, port int32) bool {
	isolated := false
	for _, p := range n.policies {
		if !n.selects(p, src) || !hasType(p, networkingv1.PolicyTypeEgress) {
			continue
		}
		isolated = true
		for _, rule := range p.Spec.Egress {
			if !portMatches(rule.Ports, proto, port, dst) {
				continue
			}
			if len(rule.To) == 0 {
				return true
			}
			for _, peer := range rule.To {
				if n.peerMatches(p, peer, dst) {
					return true
				}
			}
		}
	}
	return !isolated
}

// ingressAllowed: may dst receive from src on port?
func (n *netModel) ingressAllowed(src, dst endpoint, proto corev1.Protocol, port int32) bool {
	isolated := false
	for _, p := range n.policies {
		if !n.selects(p, dst) || !hasType(p, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, rule := range p.Spec.Ingress {
			if !portMatches(rule.Ports, proto, port, dst) {
				continue
			}
			if len(rule.From) == 0 {
				return true
			}
			for _, peer := range rule.From {
				if n.peerMatches(p, peer, src) {
					return true
				}
			}
		}
	}
	return !isolated
}

// allowed: a connection needs the egress side in this namespace and the
// ingress side in this namespace (other namespaces' policies are not
// ours, and count as open).
func (n *netModel) allowed(src, dst endpoint, proto corev1.Protocol, port int32) bool {
	if src.namespace == n.namespace && !n.egressAllowed(src, dst, proto, port) {
		return false
	}
	if dst.namespace == n.namespace && !n.ingressAllowed(src, dst, proto, port) {
		return false
	}
	return true
}

// The evaluator itself, on policies small enough to reason about by hand.
func TestNetModel(t *testing.T) {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(80)
	named := intstr.FromString("grpc")
	pol := func(name string, sel map[string]string, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule, out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
			Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: types, Ingress: in, Egress: out},
		}
	}
	a := endpoint{name: "a", namespace: "ns", labels: map[string]string{"app": "a"}, ip: netip.MustParseAddr("10.0.0.1")}
	b := endpoint{name: "b", namespace: "ns", labels: map[string]string{"app": "b"}, ip: netip.MustParseAddr("10.0.0.2"), ports: map[string]int32{"grpc": 90}}
	far := endpoint{name: "far", namespace: "other", labels: map[string]string{"app": "a"}, ip: netip.MustParseAddr("10.1.0.1")}
	web := endpoint{name: "web", ip: netip.MustParseAddr("203.0.113.1")}
	both := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	deny := pol("deny", nil, both, nil, nil)
	bFromA := pol("b-from-a", map[string]string{"app": "b"}, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		[]networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}, {Port: &named}},
		}}, nil)
	aToAll := pol("a-out", map[string]string{"app": "a"}, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}, nil,
		[]networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
			{PodSelector: &metav1.LabelSelector{}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"203.0.113.0/24"}}},
		}}})
	tests := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		src, dst endpoint
		port     int32
		want     bool
	}{
		{"no policies: open", nil, a, b, 80, true},
		{"default deny", []*networkingv1.NetworkPolicy{deny}, a, b, 80, false},
		{"ingress alone is not enough under default deny", []*networkingv1.NetworkPolicy{deny, bFromA}, a, b, 80, false},
		{"ingress and egress", []*networkingv1.NetworkPolicy{deny, bFromA, aToAll}, a, b, 80, true},
		{"named port", []*networkingv1.NetworkPolicy{deny, bFromA, aToAll}, a, b, 90, true},
		{"other port", []*networkingv1.NetworkPolicy{deny, bFromA, aToAll}, a, b, 81, false},
		{"podSelector peer is same-namespace only", []*networkingv1.NetworkPolicy{bFromA}, far, b, 80, false},
		{"ipBlock except", []*networkingv1.NetworkPolicy{aToAll}, a, web, 443, false},
		{"ipBlock", []*networkingv1.NetworkPolicy{aToAll}, a, endpoint{name: "x", ip: netip.MustParseAddr("198.51.100.1")}, 443, true},
		{"unselected pod is open", []*networkingv1.NetworkPolicy{bFromA}, b, a, 80, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := &netModel{namespace: "ns", policies: tc.policies, nsLabels: map[string]map[string]string{"ns": {}, "other": {}}}
			if got := n.allowed(tc.src, tc.dst, tcp, tc.port); got != tc.want {
				t.Errorf("allowed = %v, want %v", got, tc.want)
			}
		})
	}
}

// The rendered NetworkPolicies, evaluated: default deny, and exactly the
// calls the architecture makes between the services, their clients, DNS,
// the model APIs and the Kubernetes API.
func TestNetworkPolicies(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name(), func(t *testing.T) {
			r := render(t, tg)
			checkDefaultDeny(t, r)
			ns := tg.namespace
			n := &netModel{namespace: ns, policies: r.policies, nsLabels: map[string]map[string]string{
				ns:            {"kubernetes.io/metadata.name": ns},
				"kube-system": {"kubernetes.io/metadata.name": "kube-system"},
				// A namespace whose labelled client pods may call the
				// orchestrator (README.md).
				"apps": {"kubernetes.io/metadata.name": "apps", "neuron.dev/client-namespace": "true"},
				// A namespace nobody labelled.
				"other": {"kubernetes.io/metadata.name": "other"},
				// Where overlays/scale's dependencies may run.
				"temporal": {"kubernetes.io/metadata.name": "temporal"},
				"db":       {"kubernetes.io/metadata.name": "db"},
			}}

			pods := map[string]endpoint{}
			for i, s := range services {
				w := r.workload(t, s)
				c := w.container(t, s)
				ports := map[string]int32{}
				for _, p := range c.Ports {
					ports[p.Name] = p.ContainerPort
				}
				ep := endpoint{name: s.name, namespace: ns, labels: w.pod.Labels, ip: netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)}), ports: ports}
				pods[s.name] = ep
				selected := false
				for _, p := range r.policies {
					if len(p.Spec.PodSelector.MatchLabels)+len(p.Spec.PodSelector.MatchExpressions) > 0 && n.selects(p, ep) {
						selected = true
					}
				}
				if !selected {
					t.Errorf("no NetworkPolicy of its own selects the %s pods", s.name)
				}
			}
			clientLabels := map[string]string{"neuron.dev/client": "true"}
			pods["client"] = endpoint{name: "client", namespace: ns, labels: clientLabels, ip: netip.MustParseAddr("10.244.0.30")}
			pods["invocation"] = endpoint{name: "invocation", namespace: ns, labels: invocationPodLabels, ip: netip.MustParseAddr("10.244.0.31")}
			pods["stranger"] = endpoint{name: "stranger", namespace: ns, labels: map[string]string{"app": "other"}, ip: netip.MustParseAddr("10.244.0.32")}
			pods["remote-client"] = endpoint{name: "remote-client", namespace: "apps", labels: clientLabels, ip: netip.MustParseAddr("10.244.1.1")}
			pods["remote-unlabelled"] = endpoint{name: "remote-unlabelled", namespace: "apps", labels: map[string]string{"app": "web"}, ip: netip.MustParseAddr("10.244.1.2")}
			pods["other-ns-client"] = endpoint{name: "other-ns-client", namespace: "other", labels: clientLabels, ip: netip.MustParseAddr("10.244.2.1")}
			// The neuron pods posing as clients must not pass either.
			for _, s := range services {
				if pods[s.name].labels["neuron.dev/client"] != "" {
					t.Errorf("the %s pods carry the client label", s.name)
				}
			}

			// Calls to the four services' ports: exactly these succeed.
			want := map[string]bool{
				"client->orchestrator":        true,
				"remote-client->orchestrator": true,
				"orchestrator->operator":      true,
				"orchestrator->state":         true,
				"orchestrator->environment":   true,
				"operator->state":             true,
				"environment->operator":       true, // --backend local forwards to the operator service
			}
			if tg.lifecycle() {
				want["operator->orchestrator"] = true // LifecycleService.Publish
			}
			for srcName, src := range pods {
				for _, s := range services {
					dst := pods[s.name]
					key := srcName + "->" + s.name
					if got := n.allowed(src, dst, corev1.ProtocolTCP, s.port); got != want[key] {
						t.Errorf("%s on %d: allowed %v, want %v", key, s.port, got, want[key])
					}
					// No other port of a neuron pod is reachable.
					if n.allowed(src, dst, corev1.ProtocolTCP, 8080) || n.allowed(src, dst, corev1.ProtocolUDP, s.port) {
						t.Errorf("%s: a port other than TCP %d is open", key, s.port)
					}
				}
			}

			// DNS: every pod of the namespace but the invocation pods.
			dns := endpoint{name: "kube-dns", namespace: "kube-system", labels: map[string]string{"k8s-app": "kube-dns"}, ip: netip.MustParseAddr("10.244.9.2")}
			for name, src := range pods {
				if src.namespace != ns {
					continue
				}
				want := name != "invocation"
				for _, proto := range []corev1.Protocol{corev1.ProtocolUDP, corev1.ProtocolTCP} {
					if got := n.allowed(src, dns, proto, 53); got != want {
						t.Errorf("%s -> kube-dns %s/53: allowed %v, want %v", name, proto, got, want)
					}
				}
				impostor := endpoint{name: "impostor", namespace: "other", labels: dns.labels, ip: netip.MustParseAddr("10.244.9.3")}
				if n.allowed(src, impostor, corev1.ProtocolUDP, 53) {
					t.Errorf("%s -> a kube-dns-labelled pod outside kube-system: allowed", name)
				}
			}

			// Outside the cluster.
			addr := func(s string) endpoint { return endpoint{name: s, ip: netip.MustParseAddr(s)} }
			type call struct {
				src  string
				dst  endpoint
				port int32
				want bool
			}
			calls := []call{
				// The operator reaches the model APIs over HTTPS, and
				// nothing private.
				{"operator", addr("203.0.113.10"), 443, true},
				{"operator", addr("2001:db8::10"), 443, true},
				{"operator", addr("203.0.113.10"), 80, false},
				{"operator", addr("10.1.2.3"), 443, false},
				{"operator", addr("172.20.0.1"), 443, false},
				{"operator", addr("192.168.1.1"), 443, false},
				{"operator", addr("100.64.0.1"), 443, false},
				{"operator", addr("169.254.169.254"), 443, false},
				{"operator", addr("169.254.169.254"), 80, false},
				{"operator", addr("fd00::1"), 443, false},
				// The environment service reaches the Kubernetes API.
				{"environment", addr("10.96.0.1"), 443, true},
				{"environment", addr("192.168.1.10"), 6443, true},
				{"environment", addr("203.0.113.10"), 80, false},
				{"environment", addr("169.254.169.254"), 80, false},
				// Nobody else leaves the cluster.
				{"orchestrator", addr("203.0.113.10"), 443, false},
				{"state", addr("203.0.113.10"), 443, false},
				{"client", addr("203.0.113.10"), 443, false},
				{"invocation", addr("203.0.113.10"), 443, false},
				{"stranger", addr("203.0.113.10"), 443, false},
			}
			for _, c := range calls {
				if got := n.allowed(pods[c.src], c.dst, corev1.ProtocolTCP, c.port); got != c.want {
					t.Errorf("%s -> %s:%d: allowed %v, want %v", c.src, c.dst.ip, c.port, got, c.want)
				}
			}

			// overlays/scale's dependencies: only state reaches PostgreSQL
			// (in the cluster or a managed one outside), only the
			// orchestrator the Temporal frontend, each on its one port,
			// and only in scale.
			deps := []struct {
				dst  endpoint
				port int32
				from string // the one pod allowed, in scale
			}{
				{endpoint{name: "postgres", namespace: "db", labels: map[string]string{"app": "postgres"}, ip: netip.MustParseAddr("10.244.3.1")}, 5432, "state"},
				{addr("10.20.0.5"), 5432, "state"},
				{endpoint{name: "temporal-frontend", namespace: "temporal", labels: map[string]string{"app.kubernetes.io/component": "frontend"}, ip: netip.MustParseAddr("10.244.4.1")}, 7233, "orchestrator"},
			}
			for _, d := range deps {
				for name, src := range pods {
					if src.namespace != ns {
						continue
					}
					want := tg.scale && name == d.from
					if got := n.allowed(src, d.dst, corev1.ProtocolTCP, d.port); got != want {
						t.Errorf("%s -> %s:%d: allowed %v, want %v", name, d.dst.name, d.port, got, want)
					}
					if n.allowed(src, d.dst, corev1.ProtocolTCP, d.port+1) {
						t.Errorf("%s -> %s:%d: allowed", name, d.dst.name, d.port+1)
					}
				}
			}
		})
	}
}

// checkDefaultDeny: one policy selects every pod, in both directions, and
// allows nothing.
func checkDefaultDeny(t *testing.T, r *rendering) {
	t.Helper()
	for _, p := range r.policies {
		s := p.Spec
		if len(s.PodSelector.MatchLabels) == 0 && len(s.PodSelector.MatchExpressions) == 0 &&
			hasType(p, networkingv1.PolicyTypeIngress) && hasType(p, networkingv1.PolicyTypeEgress) &&
			len(s.Ingress) == 0 && len(s.Egress) == 0 {
			return
		}
	}
	t.Errorf("no default-deny NetworkPolicy (empty podSelector, Ingress and Egress, no rules)")
}
