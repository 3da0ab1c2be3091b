package kubernetes

import "net/netip"

// The kubernetes backend's own guard here is egress to the cloud's
// metadata service. The credential variables and files every backend
// refuses, and the quantity overflow check, are in
// services/environment/guard.go.

// metadataPrefixes are the cloud instance-metadata endpoints (as the
// egress proxy lists them): no egress rule reaches them, since they hand
// out the node's credentials.
var metadataPrefixes = []netip.Prefix{
	netip.MustParsePrefix("169.254.169.254/32"), // AWS, GCP, Azure, OpenStack, ...
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS IPv6
}
