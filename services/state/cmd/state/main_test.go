package main

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/secbear/neuron/services/state"
)

// TestBadConfigFailsWithOneClearLine: the binary refuses bad config
// before it serves, naming what to fix.
func TestBadConfigFailsWithOneClearLine(t *testing.T) {
	dir := t.TempDir()
	held, err := state.OpenBolt(filepath.Join(dir, "held", "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := free.Addr().String() // nothing listens there once closed
	free.Close()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"security off without --dev", []string{"--data-dir", dir}, "--auth-policy"},
		{"no TLS", []string{"--data-dir", dir, "--auth-policy", filepath.Join(dir, "p.json")}, "--tls-cert"},
		{"unknown backend", []string{"--dev", "--backend", "pg"}, `--backend "pg"`},
		{"bad log level", []string{"--dev", "--log-level", "loud"}, "log level"},
		{"file locked by another process", []string{"--dev", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "held"), "--lock-timeout", "50ms"}, "another process holds the lock"},
		{"unknown flag", []string{"--colour"}, "flag provided but not defined"},
		{"middleware unreachable", []string{"--dev", "--backend", "memory", "--addr", "127.0.0.1:0", "--middleware-addr", nobody}, "middleware at " + nobody + ": Describe failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), tt.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}
