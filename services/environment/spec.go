package environment

import (
	"fmt"
	"math"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/duration"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/msgsize"
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
// the floors and ceilings of what a spec may ask for.
type Defaults struct {
	// Timeout is the wall-clock limit when the spec sets none.
	Timeout time.Duration
	// MaxTimeout is the largest timeout a spec may ask for.
	MaxTimeout time.Duration
	// Limits fills in each zero field of the spec's limits.
	Limits Limits
	// Max holds the largest resources a spec may ask for, field by
	// field; a zero field has no ceiling but the kernel's.
	Max Limits
	// MinMemoryBytes is the least memory a spec may ask for: enough to
	// start the operator. Zero: no floor.
	MinMemoryBytes int64
}

// Kernel ranges, whatever the service's ceilings.
const (
	// MinCPUMillis is the smallest CPU share the kernel can enforce: CFS
	// refuses a quota under 1ms per period, and backends use a 100ms
	// period.
	MinCPUMillis = 10
	// maxCPUMillis keeps the CFS quota (millis × 100µs) in an int64.
	maxCPUMillis = math.MaxInt64 / 100
	// MaxPIDs is the kernel's PID_MAX_LIMIT on 64-bit systems: pids.max
	// refuses more.
	MaxPIDs = 4 << 20
	// MinCPUTime is the granularity of RLIMIT_CPU.
	MinCPUTime = time.Second
)

// DefaultDefaults are conservative defaults and ceilings for a shared
// host.
func DefaultDefaults() Defaults {
	return Defaults{
		Timeout:    10 * time.Minute,
		MaxTimeout: time.Hour,
		Limits: Limits{
			MemoryBytes:    2 << 30,
			MaxProcesses:   256,
			MaxOutputBytes: 16 << 20,
		},
		Max: Limits{
			// All of this host's CPUs.
			CPUMillis:    int64(runtime.NumCPU()) * 1000,
			MemoryBytes:  64 << 30,
			DiskBytes:    100 << 30,
			GPUs:         8,
			MaxProcesses: 1 << 16,
			// The output comes back in one gRPC message.
			MaxOutputBytes: msgsize.Max,
			CPUTime:        24 * time.Hour,
		},
		MinMemoryBytes: 16 << 20,
	}
}

// ParseTimeout returns the wall-clock limit of spec: its timeout, or
// d.Timeout when it sets none. An invalid Duration, one not positive or
// one above d.MaxTimeout is INVALID_ARGUMENT.
func (d Defaults) ParseTimeout(spec *environmentv1.EnvironmentSpec) (time.Duration, error) {
	if spec.GetTimeout() == nil {
		return d.Timeout, nil
	}
	t, err := duration.Parse("spec.timeout", spec.GetTimeout())
	if err != nil {
		return 0, err
	}
	if t <= 0 {
		return 0, fmt.Errorf("spec.timeout %v must be positive: %w", t, errs.InvalidArgument)
	}
	if d.MaxTimeout > 0 && t > d.MaxTimeout {
		return 0, fmt.Errorf("spec.timeout %v is longer than this service allows (%v): %w", t, d.MaxTimeout, errs.InvalidArgument)
	}
	return t, nil
}

// ParseLimits reads spec.resources as ParseLimits does, with d.Limits as
// the defaults, then refuses with INVALID_ARGUMENT, naming the field,
// its value and the bound, every quantity the spec sets outside d's
// floors and ceilings (d.MinMemoryBytes, d.Max).
func (d Defaults) ParseLimits(r *environmentv1.ResourceLimits) (Limits, error) {
	l, err := ParseLimits(r, d.Limits)
	if err != nil || r == nil {
		return l, err
	}
	above := func(field, value string, ceiling any) error {
		return fmt.Errorf("resources.%s %s is above this service's ceiling of %v: %w", field, value, ceiling, errs.InvalidArgument)
	}
	m := d.Max
	switch {
	case r.Cpu != nil && m.CPUMillis > 0 && l.CPUMillis > m.CPUMillis:
		return l, above("cpu", strconv.Quote(*r.Cpu), fmt.Sprintf("%dm", m.CPUMillis))
	case r.Memory != nil && l.MemoryBytes < d.MinMemoryBytes:
		return l, fmt.Errorf("resources.memory %q is below this service's floor of %s, the least the operator runs in: %w",
			*r.Memory, bytesString(d.MinMemoryBytes), errs.InvalidArgument)
	case r.Memory != nil && m.MemoryBytes > 0 && l.MemoryBytes > m.MemoryBytes:
		return l, above("memory", strconv.Quote(*r.Memory), bytesString(m.MemoryBytes))
	case r.Disk != nil && m.DiskBytes > 0 && l.DiskBytes > m.DiskBytes:
		return l, above("disk", strconv.Quote(*r.Disk), bytesString(m.DiskBytes))
	case r.Gpu != nil && m.GPUs > 0 && l.GPUs > m.GPUs:
		return l, above("gpu", strconv.Quote(*r.Gpu), m.GPUs)
	case r.MaxProcesses != nil && m.MaxProcesses > 0 && l.MaxProcesses > m.MaxProcesses:
		return l, above("max_processes", strconv.FormatUint(uint64(l.MaxProcesses), 10), m.MaxProcesses)
	case r.MaxOutputBytes != nil && m.MaxOutputBytes > 0 && l.MaxOutputBytes > m.MaxOutputBytes:
		return l, above("max_output_bytes", strconv.FormatUint(l.MaxOutputBytes, 10), bytesString(int64(m.MaxOutputBytes)))
	case r.CpuTime != nil && m.CPUTime > 0 && l.CPUTime > m.CPUTime:
		return l, above("cpu_time", l.CPUTime.String(), m.CPUTime)
	}
	return l, nil
}

// bytesString writes n in the largest binary unit that divides it.
func bytesString(n int64) string {
	q := resource.NewQuantity(n, resource.BinarySI)
	return fmt.Sprintf("%s (%d bytes)", q.String(), n)
}

// ParseLimits reads spec.resources (Kubernetes quantity syntax) and fills
// in unset fields from d. It refuses with INVALID_ARGUMENT, naming the
// field, the value and the allowed range, what no backend could enforce
// as asked: a malformed or non-positive quantity; a byte quantity that
// is not a whole number of bytes or too large for an int64 (it would
// saturate, wrap or read as zero, which means no limit); cpu below the
// kernel's CFS minimum (MinCPUMillis), not a whole number of millicores
// or too large; a fractional gpu count; max_processes above the kernel's
// PID_MAX_LIMIT (MaxPIDs); an invalid cpu_time Duration or one under 1s.
// The service's own floors and ceilings are Defaults.ParseLimits.
func ParseLimits(r *environmentv1.ResourceLimits, d Limits) (Limits, error) {
	l := d
	if r == nil {
		return l, nil
	}
	quantity := func(field string, v *string) (resource.Quantity, bool, error) {
		if v == nil {
			return resource.Quantity{}, false, nil
		}
		q, err := resource.ParseQuantity(*v)
		if err != nil {
			return q, false, fmt.Errorf("resources.%s %q is not a quantity such as \"512Mi\" or \"500m\": %w", field, *v, errs.InvalidArgument)
		}
		if q.Sign() <= 0 {
			return q, false, fmt.Errorf("resources.%s %q must be positive: %w", field, *v, errs.InvalidArgument)
		}
		return q, true, nil
	}
	// whole reads a quantity of whole units (bytes, devices), at most
	// math.MaxInt64 - 1 (the parser saturates at MaxInt64).
	whole := func(field, unit string, v *string, set *int64) error {
		q, ok, err := quantity(field, v)
		if !ok {
			return err
		}
		if q.Cmp(*resource.NewQuantity(math.MaxInt64-1, resource.DecimalSI)) > 0 {
			return fmt.Errorf("resources.%s %q is too large to be a limit (at most %d %s): %w", field, *v, int64(math.MaxInt64-1), unit, errs.InvalidArgument)
		}
		n := q.Value()
		if q.Cmp(*resource.NewQuantity(n, resource.DecimalSI)) != 0 {
			return fmt.Errorf("resources.%s %q is not a whole number of %s: %w", field, *v, unit, errs.InvalidArgument)
		}
		*set = n
		return nil
	}
	if q, ok, err := quantity("cpu", r.Cpu); err != nil {
		return l, err
	} else if ok {
		switch {
		case q.Cmp(*resource.NewMilliQuantity(MinCPUMillis, resource.DecimalSI)) < 0:
			return l, fmt.Errorf("resources.cpu %q is below the kernel's minimum CPU share of %dm (1ms of CPU per 100ms): %w", *r.Cpu, MinCPUMillis, errs.InvalidArgument)
		case q.Cmp(*resource.NewMilliQuantity(maxCPUMillis, resource.DecimalSI)) > 0:
			return l, fmt.Errorf("resources.cpu %q is too large to be a limit (at most %dm): %w", *r.Cpu, int64(maxCPUMillis), errs.InvalidArgument)
		}
		m := q.MilliValue()
		if q.Cmp(*resource.NewMilliQuantity(m, resource.DecimalSI)) != 0 {
			return l, fmt.Errorf("resources.cpu %q is not a whole number of millicores: %w", *r.Cpu, errs.InvalidArgument)
		}
		l.CPUMillis = m
	}
	if err := whole("memory", "bytes", r.Memory, &l.MemoryBytes); err != nil {
		return l, err
	}
	if err := whole("disk", "bytes", r.Disk, &l.DiskBytes); err != nil {
		return l, err
	}
	if err := whole("gpu", "GPUs", r.Gpu, &l.GPUs); err != nil {
		return l, err
	}
	if r.MaxProcesses != nil {
		switch n := *r.MaxProcesses; {
		case n == 0:
			return l, fmt.Errorf("resources.max_processes must be at least 1: %w", errs.InvalidArgument)
		case n > MaxPIDs:
			return l, fmt.Errorf("resources.max_processes %d is above the kernel's limit of %d tasks: %w", n, MaxPIDs, errs.InvalidArgument)
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
		t, err := duration.Parse("resources.cpu_time", r.CpuTime)
		if err != nil {
			return l, err
		}
		if t < MinCPUTime {
			return l, fmt.Errorf("resources.cpu_time %v must be at least %v: %w", t, MinCPUTime, errs.InvalidArgument)
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
