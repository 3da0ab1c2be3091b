package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestUpJaegerRefusals: `neuron up --jaeger` with --otel-endpoint or
// --traces-url is a usage error (it sets both), and without a Jaeger
// binary it fails saying how to build one, before starting anything.
func TestUpJaegerRefusals(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"with --otel-endpoint", []string{"--otel-endpoint", "127.0.0.1:4317"}, 2, "--jaeger sets --otel-endpoint and --traces-url itself"},
		{"with --traces-url", []string{"--traces-url", "http://127.0.0.1:16686"}, 2, "--jaeger sets --otel-endpoint and --traces-url itself"},
		{"no binary", nil, 1, "scripts/jaeger.sh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, errOut := testCLI()
			c.getenv = func(k string) string {
				if k == "NEURON_JAEGER" {
					return filepath.Join(dir, "no-jaeger")
				}
				return ""
			}
			err := c.cmdUp(context.Background(), append([]string{"--jaeger", "--data-dir", dir}, tc.args...))
			if code := c.report(err); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("exit %d, %q; want %d and %q", code, errOut.String(), tc.code, tc.want)
			}
		})
	}
}
