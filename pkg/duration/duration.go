package duration

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/secbear/neuron/pkg/errs"
)

// Parse returns d as a time.Duration, or INVALID_ARGUMENT naming field
// when d is not a valid Duration (see CheckValid) or does not fit a
// time.Duration (about ±292 years). A nil d is zero.
func Parse(field string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, fmt.Errorf("%s (seconds %d, nanos %d) is not a valid duration: nanos must be within ±999999999 and have the sign of seconds: %w",
			field, d.GetSeconds(), d.GetNanos(), errs.InvalidArgument)
	}
	if s := d.GetSeconds(); s > math.MaxInt64/int64(time.Second)-1 || s < math.MinInt64/int64(time.Second)+1 {
		return 0, fmt.Errorf("%s (%d seconds) is out of range: %w", field, s, errs.InvalidArgument)
	}
	return d.AsDuration(), nil
}
