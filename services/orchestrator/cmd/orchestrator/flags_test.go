package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// A negative retention flag is refused naming the flag, before anything
// starts (0 turns a bound off; the rest of the range is serve.Run's
// check, tested there).
func TestRetentionFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--retention", "-1h"}, "--retention -1h0m0s: want 0 (keep finished workflows for any age) or at least 1m0s"},
		{[]string{"--retention-max-workflows", "-5"}, "--retention-max-workflows -5: want 0 (keep any number of finished workflows) or more"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"--agents", "none.yaml", "--state-addr", "127.0.0.1:1"}, tc.args...)
			err := run(context.Background(), args, io.Discard)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("run %v = %v; want %q", tc.args, err, tc.want)
			}
		})
	}
}
