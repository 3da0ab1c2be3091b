package kubernetes

import (
	"fmt"
	"math"
	"net/netip"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// The guards of this file refuse what a spec could use to change the pod
// from inside its own limits: credentials placed where they change how
// programs behave, Secrets that are not credentials, quantities that do
// not survive conversion, and egress to the cloud's metadata service.
// The lists of variables and files are
// services/environment/guard.go, shared with every backend.

// metadataPrefixes are the cloud instance-metadata endpoints (as the
// egress proxy lists them): no egress rule reaches them, since they hand
// out the node's credentials.
var metadataPrefixes = []netip.Prefix{
	netip.MustParsePrefix("169.254.169.254/32"), // AWS, GCP, Azure, OpenStack, ...
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS IPv6
}

// checkQuantities refuses, with INVALID_ARGUMENT, a quantity r sets that
// did not survive conversion to an integer in l: too large for an int64
// (it saturates, wraps negative or reads as zero, which would mean no
// limit at all).
func checkQuantities(r *environmentv1.ResourceLimits, l environment.Limits) error {
	for _, q := range []struct {
		field string
		set   *string
		v     int64
	}{{"cpu", r.Cpu, l.CPUMillis}, {"memory", r.Memory, l.MemoryBytes}, {"disk", r.Disk, l.DiskBytes}} {
		if q.set != nil && (q.v <= 0 || q.v == math.MaxInt64) {
			return fmt.Errorf("resources.%s %q is too large to be a limit: %w", q.field, *q.set, errs.InvalidArgument)
		}
	}
	return nil
}
