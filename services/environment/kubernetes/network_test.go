package kubernetes

import (
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

func TestEgressRules(t *testing.T) {
	allow := func(p string, port uint32) environment.NetworkRule {
		return environment.NetworkRule{Prefix: prefix(p), Port: port, Allow: true}
	}
	deny := func(p string, port uint32) environment.NetworkRule {
		return environment.NetworkRule{Prefix: prefix(p), Port: port}
	}
	rule := func(p string, port uint32, except ...string) egressRule {
		r := egressRule{prefix: prefix(p), port: port}
		for _, e := range except {
			r.except = append(r.except, prefix(e))
		}
		return r
	}
	// The metadata addresses every allow of everything excepts.
	meta4, meta6 := []string{"169.254.169.254/32", "100.100.100.200/32"}, "fd00:ec2::254/128"
	tests := []struct {
		name     string
		policy   environment.NetworkPolicy
		want     []egressRule
		contains string // a refusal's message
	}{
		{name: "deny everything", policy: environment.NetworkPolicy{}, want: nil},
		{name: "allow everything but the metadata service", policy: environment.NetworkPolicy{DefaultAllow: true},
			want: []egressRule{rule("0.0.0.0/0", 0, meta4...), rule("::/0", 0, meta6)}},
		{name: "default allow except metadata", policy: environment.NetworkPolicy{DefaultAllow: true, Rules: []environment.NetworkRule{deny("169.254.169.254/32", 0)}},
			want: []egressRule{rule("0.0.0.0/0", 0, meta4...), rule("::/0", 0, meta6)}},
		{name: "link-local allow keeps metadata out", policy: environment.NetworkPolicy{Rules: []environment.NetworkRule{allow("169.254.0.0/16", 53)}},
			want: []egressRule{rule("169.254.0.0/16", 53, "169.254.169.254/32")}},
		{name: "metadata address allowed", policy: environment.NetworkPolicy{Rules: []environment.NetworkRule{allow("169.254.169.254/32", 80)}},
			contains: "rule 0 (allow 169.254.169.254/32 port 80) allows the cloud metadata address 169.254.169.254"},
		{name: "IPv6 metadata address allowed", policy: environment.NetworkPolicy{Rules: []environment.NetworkRule{allow("fd00:ec2::254/128", 0)}},
			contains: "fd00:ec2::254"},
		{name: "allow inside an earlier deny is dropped", policy: environment.NetworkPolicy{Rules: []environment.NetworkRule{deny("10.0.0.0/8", 0), allow("10.1.0.0/16", 443)}},
			want: nil},
		{name: "allow before a deny wins", policy: environment.NetworkPolicy{DefaultAllow: true, Rules: []environment.NetworkRule{allow("10.1.0.0/16", 0), deny("10.0.0.0/8", 0)}},
			want: []egressRule{rule("10.1.0.0/16", 0), rule("0.0.0.0/0", 0, append([]string{"10.0.0.0/8"}, meta4...)...), rule("::/0", 0, meta6)}},
		{name: "same-port deny is excepted, other port not", policy: environment.NetworkPolicy{Rules: []environment.NetworkRule{
			deny("10.1.0.0/16", 443), allow("10.0.0.0/8", 443), allow("10.0.0.0/8", 80)}},
			want: []egressRule{rule("10.0.0.0/8", 443, "10.1.0.0/16"), rule("10.0.0.0/8", 80)}},
		{name: "nested denies keep the outer", policy: environment.NetworkPolicy{Rules: []environment.NetworkRule{
			deny("10.1.2.0/24", 0), deny("10.1.0.0/16", 0), deny("10.1.3.0/24", 0), allow("10.0.0.0/8", 0)}},
			want: []egressRule{rule("10.0.0.0/8", 0, "10.1.0.0/16")}},
		{name: "deny of all IPv4 leaves IPv6", policy: environment.NetworkPolicy{DefaultAllow: true, Rules: []environment.NetworkRule{deny("0.0.0.0/0", 0)}},
			want: []egressRule{rule("::/0", 0, meta6)}},
		{name: "families never overlap", policy: environment.NetworkPolicy{Rules: []environment.NetworkRule{deny("::/0", 0), allow("10.0.0.0/8", 0)}},
			want: []egressRule{rule("10.0.0.0/8", 0)}},
		{name: "a port deny cannot be cut out of every port", policy: environment.NetworkPolicy{DefaultAllow: true, Rules: []environment.NetworkRule{deny("0.0.0.0/0", 25)}},
			contains: "rule 0 (deny 0.0.0.0/0 port 25) denies only port 25 inside the default allow (0.0.0.0/0)"},
		{name: "domains", policy: environment.NetworkPolicy{Rules: []environment.NetworkRule{{Host: "*.example.com", Allow: true}}},
			contains: "*.example.com"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := egressRules(tt.policy)
			if tt.contains != "" {
				if errs.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tt.contains) {
					t.Fatalf("err = %v (%v), want FAILED_PRECONDITION mentioning %q", err, errs.Code(err), tt.contains)
				}
				return
			}
			if err != nil {
				t.Fatalf("egressRules: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("egressRules =\n%v\nwant\n%v", got, tt.want)
			}
		})
	}
}
