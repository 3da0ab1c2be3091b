package duration

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/secbear/neuron/pkg/errs"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		d    *durationpb.Duration
		want time.Duration
		code codes.Code
	}{
		{"nil", nil, 0, codes.OK},
		{"zero", &durationpb.Duration{}, 0, codes.OK},
		{"seconds and nanos", &durationpb.Duration{Seconds: 1, Nanos: 500_000_000}, 1500 * time.Millisecond, codes.OK},
		{"negative", &durationpb.Duration{Seconds: -1, Nanos: -5}, -time.Second - 5, codes.OK},
		{"largest nanos", &durationpb.Duration{Nanos: 999_999_999}, 999_999_999, codes.OK},
		{"nanos of a whole second", &durationpb.Duration{Nanos: 1_000_000_000}, 0, codes.InvalidArgument},
		{"nanos of two seconds", &durationpb.Duration{Seconds: 3, Nanos: 2_000_000_000}, 0, codes.InvalidArgument},
		{"negative nanos too large", &durationpb.Duration{Nanos: -1_000_000_000}, 0, codes.InvalidArgument},
		{"positive seconds, negative nanos", &durationpb.Duration{Seconds: 1, Nanos: -5}, 0, codes.InvalidArgument},
		{"negative seconds, positive nanos", &durationpb.Duration{Seconds: -1, Nanos: 5}, 0, codes.InvalidArgument},
		{"beyond 10000 years", &durationpb.Duration{Seconds: 315_576_000_001}, 0, codes.InvalidArgument},
		{"beyond a time.Duration", &durationpb.Duration{Seconds: 10_000_000_000}, 0, codes.InvalidArgument},
		{"beyond a negative time.Duration", &durationpb.Duration{Seconds: -10_000_000_000}, 0, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("spec.timeout", tt.d)
			if c := errs.Code(err); c != tt.code {
				t.Fatalf("Parse = %v, %v; want code %v", got, err, tt.code)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "spec.timeout ") {
				t.Errorf("error %q does not name the field", err)
			}
			if err == nil && got != tt.want {
				t.Errorf("Parse = %v, want %v", got, tt.want)
			}
		})
	}
}
