package environment

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Isolation kinds, as named in errors and in Check.
const (
	KindProcess       = "process"
	KindContainer     = "container"
	KindGvisor        = "gvisor"
	KindMicroVM       = "microvm"
	KindWasm          = "wasm"
	KindNetworkPolicy = "network_policy"
	KindCustom        = "custom"
)

// Kinds lists the isolation kinds of spec, outermost first; a custom
// boundary is named "custom:<boundary_type>".
func Kinds(spec *environmentv1.EnvironmentSpec) []string {
	var out []string
	for _, b := range spec.GetIsolation() {
		switch k := b.GetKind().(type) {
		case *environmentv1.IsolationBoundary_Process:
			out = append(out, KindProcess)
		case *environmentv1.IsolationBoundary_Container:
			out = append(out, KindContainer)
		case *environmentv1.IsolationBoundary_Gvisor:
			out = append(out, KindGvisor)
		case *environmentv1.IsolationBoundary_Microvm:
			out = append(out, KindMicroVM)
		case *environmentv1.IsolationBoundary_Wasm:
			out = append(out, KindWasm)
		case *environmentv1.IsolationBoundary_NetworkPolicy:
			out = append(out, KindNetworkPolicy)
		case *environmentv1.IsolationBoundary_Custom:
			out = append(out, KindCustom+":"+k.Custom.GetBoundaryType())
		}
	}
	return out
}

// Unsupported returns a FAILED_PRECONDITION error naming every isolation
// kind of spec that is not in supported, or nil when there is none.
func Unsupported(backend string, spec *environmentv1.EnvironmentSpec, supported ...string) error {
	var missing []string
	for _, k := range Kinds(spec) {
		ok := false
		for _, s := range supported {
			if k == s {
				ok = true
			}
		}
		if !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("the %s backend cannot enforce isolation %s (it enforces %s): %w",
		backend, strings.Join(missing, ", "), strings.Join(supported, ", "), errs.FailedPrecondition)
}

// ContainerImage returns the image named by the spec's container
// boundary ("" for the service's default) and whether there is one.
func ContainerImage(spec *environmentv1.EnvironmentSpec) (string, bool) {
	for _, b := range spec.GetIsolation() {
		if c := b.GetContainer(); c != nil {
			return c.GetImage(), true
		}
	}
	return "", false
}

// Defaults are the service's limits for fields a spec leaves unset, and
// the ceilings a spec may not exceed.
type Defaults struct {
	// Timeout is the wall-clock limit when the spec sets none.
	Timeout time.Duration
	// MaxTimeout is the largest timeout a spec may ask for.
	MaxTimeout time.Duration
	// Limits fills in each zero field of the spec's limits.
	Limits Limits
}

// DefaultDefaults are conservative defaults for a shared host.
func DefaultDefaults() Defaults {
	return Defaults{
		Timeout:    10 * time.Minute,
		MaxTimeout: time.Hour,
		Limits: Limits{
			MemoryBytes:    2 << 30,
			MaxProcesses:   256,
			MaxOutputBytes: 16 << 20,
		},
	}
}

// ParseLimits reads spec.resources (Kubernetes quantity syntax) and fills
// in unset fields from d. A malformed quantity is INVALID_ARGUMENT.
func ParseLimits(r *environmentv1.ResourceLimits, d Limits) (Limits, error) {
	l := d
	if r == nil {
		return l, nil
	}
	quantity := func(field string, v *string, set func(resource.Quantity) error) error {
		if v == nil {
			return nil
		}
		q, err := resource.ParseQuantity(*v)
		if err != nil {
			return fmt.Errorf("resources.%s %q is not a quantity such as \"512Mi\" or \"500m\": %w", field, *v, errs.InvalidArgument)
		}
		if q.Sign() <= 0 {
			return fmt.Errorf("resources.%s %q must be positive: %w", field, *v, errs.InvalidArgument)
		}
		return set(q)
	}
	if err := quantity("cpu", r.Cpu, func(q resource.Quantity) error { l.CPUMillis = q.MilliValue(); return nil }); err != nil {
		return l, err
	}
	if err := quantity("memory", r.Memory, func(q resource.Quantity) error { l.MemoryBytes = q.Value(); return nil }); err != nil {
		return l, err
	}
	if err := quantity("disk", r.Disk, func(q resource.Quantity) error { l.DiskBytes = q.Value(); return nil }); err != nil {
		return l, err
	}
	if err := quantity("gpu", r.Gpu, func(q resource.Quantity) error {
		if q.MilliValue()%1000 != 0 {
			return fmt.Errorf("resources.gpu %q must be a whole number: %w", q.String(), errs.InvalidArgument)
		}
		l.GPUs = q.Value()
		return nil
	}); err != nil {
		return l, err
	}
	if r.MaxProcesses != nil {
		if *r.MaxProcesses == 0 {
			return l, fmt.Errorf("resources.max_processes must be at least 1: %w", errs.InvalidArgument)
		}
		l.MaxProcesses = *r.MaxProcesses
	}
	if r.MaxOutputBytes != nil {
		if *r.MaxOutputBytes == 0 {
			return l, fmt.Errorf("resources.max_output_bytes must be at least 1: %w", errs.InvalidArgument)
		}
		l.MaxOutputBytes = *r.MaxOutputBytes
	}
	if r.CpuTime != nil {
		t := r.CpuTime.AsDuration()
		if t < time.Second {
			return l, fmt.Errorf("resources.cpu_time %v must be at least 1s: %w", t, errs.InvalidArgument)
		}
		l.CPUTime = t
	}
	return l, nil
}

// NetworkRule is one rule of a NetworkPolicy.
type NetworkRule struct {
	// Host is a domain name, lower case, matched exactly or, written
	// "*.example.com", as any subdomain; empty when Prefix is set.
	Host string
	// Prefix is a CIDR; invalid when Host is set.
	Prefix netip.Prefix
	// Port is the port; 0 matches every port.
	Port uint32
	// Allow allows, else denies.
	Allow bool
}

// NetworkPolicy is the effective network policy of an invocation: rules
// in order, first match wins, DefaultAllow for the rest.
type NetworkPolicy struct {
	Rules        []NetworkRule
	DefaultAllow bool
}

// AllowsNothing reports whether p denies every destination.
func (p NetworkPolicy) AllowsNothing() bool {
	if p.DefaultAllow {
		return false
	}
	for _, r := range p.Rules {
		if r.Allow {
			return false
		}
	}
	return true
}

// HasHostRules reports whether any rule names a domain (which a
// packet-level enforcer, such as a Kubernetes NetworkPolicy, cannot
// apply).
func (p NetworkPolicy) HasHostRules() bool {
	for _, r := range p.Rules {
		if r.Host != "" {
			return true
		}
	}
	return false
}

// ParseNetwork returns the effective network policy of spec: the rules of
// spec.network, then those of every network_policy boundary, in order.
// Unmatched traffic follows spec.network.default_action, except that a
// network_policy boundary makes it deny (its rules are an allow list).
// With neither, everything is denied. A malformed destination is
// INVALID_ARGUMENT.
func ParseNetwork(spec *environmentv1.EnvironmentSpec) (NetworkPolicy, error) {
	var p NetworkPolicy
	add := func(where string, rules []*environmentv1.NetworkRule) error {
		for i, r := range rules {
			nr, err := parseRule(r)
			if err != nil {
				return fmt.Errorf("%s.rules[%d]: %w", where, i, err)
			}
			p.Rules = append(p.Rules, nr)
		}
		return nil
	}
	if n := spec.GetNetwork(); n != nil {
		p.DefaultAllow = n.GetDefaultAction() == environmentv1.NetworkAction_NETWORK_ACTION_ALLOW
		if err := add("network", n.GetRules()); err != nil {
			return p, err
		}
	}
	for i, b := range spec.GetIsolation() {
		if np := b.GetNetworkPolicy(); np != nil {
			p.DefaultAllow = false
			if err := add(fmt.Sprintf("isolation[%d].network_policy", i), np.GetRules()); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

func parseRule(r *environmentv1.NetworkRule) (NetworkRule, error) {
	nr := NetworkRule{Port: r.GetPort(), Allow: r.GetAction() == environmentv1.NetworkAction_NETWORK_ACTION_ALLOW}
	d := strings.TrimSpace(r.GetDestination())
	if strings.Contains(d, "/") {
		pfx, err := netip.ParsePrefix(d)
		if err != nil {
			return nr, fmt.Errorf("destination %q is not a CIDR such as 10.0.0.0/8: %w", d, errs.InvalidArgument)
		}
		nr.Prefix = pfx.Masked()
		return nr, nil
	}
	if a, err := netip.ParseAddr(d); err == nil {
		nr.Prefix = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		return nr, nil
	}
	host := strings.ToLower(strings.TrimSuffix(d, "."))
	name := strings.TrimPrefix(host, "*.")
	if !validHostname(name) {
		return nr, fmt.Errorf("destination %q is neither a domain name, a \"*.\" wildcard domain, an IP address nor a CIDR: %w", d, errs.InvalidArgument)
	}
	nr.Host = host
	return nr, nil
}

// validHostname reports whether s is a DNS name of letters, digits and
// hyphens in dot-separated labels.
func validHostname(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
