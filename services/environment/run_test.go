package environment_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/environment"
)

// Run refuses a bad Config before it serves, with one line naming the
// setting by its flag, and closes the listener it was given.
func TestRunRefusesBadConfig(t *testing.T) {
	dev := grpcserver.Config{Name: "environment", Dev: true}
	for _, tc := range []struct {
		name string
		cfg  environment.Config
		want string
	}{
		{"security off without dev mode", environment.Config{Server: grpcserver.Config{Name: "environment"}}, "--auth-policy"},
		{"negative concurrency", environment.Config{Server: dev, MaxConcurrent: -1}, "--max-concurrent -1"},
		{"timeouts", environment.Config{Server: dev, Defaults: func() environment.Defaults {
			d := environment.DefaultDefaults()
			d.Timeout, d.MaxTimeout = 2*time.Hour, time.Hour
			return d
		}()}, "--default-timeout"},
		{"unknown backend", environment.Config{Server: dev, Backend: "vm"}, `unknown backend "vm": want process, local, docker or kubernetes`},
		{"unknown backend beside an extra one", environment.Config{Server: dev, Backend: "vm", ExtraBackends: []environment.Backend{loggingBackend{}}},
			`want process, local, docker, kubernetes or logging`},
		{"local as the container backend", environment.Config{Server: dev, ContainerBackend: "local"}, "--container-backend \"local\": want docker or kubernetes"},
		{"negative disk", environment.Config{Server: dev, DefaultDiskBytes: -1}, "--default-disk"},
		{"missing CA file", environment.Config{Server: dev, EgressCAFile: filepath.Join(t.TempDir(), "nope.pem")}, "--egress-ca-file"},
		{"empty static host", environment.Config{Server: dev, EgressStaticHosts: map[string]string{"api.example.com": ""}}, "--egress-static-hosts"},
		{"extra backend named like a built-in one", environment.Config{Server: dev, ExtraBackends: []environment.Backend{namedBackend("docker")}}, `extra backend "docker"`},
		{"local without an operator", environment.Config{Server: dev, Backend: "local"}, "--operator-addr"},
		{"missing operator binary", environment.Config{Server: dev, DataDir: t.TempDir(), OperatorBinary: filepath.Join(t.TempDir(), "nope")}, "not an executable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer lis.Close()
			tc.cfg.Listener = lis
			err = environment.Run(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			_ = lis.(*net.TCPListener).SetDeadline(time.Now()) // an open listener times out
			if _, err := lis.Accept(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("the listener is still open after a failed Run: Accept = %v", err)
			}
		})
	}
}

// namedBackend is a backend that only has a name.
type namedBackend string

func (b namedBackend) Name() string { return string(b) }

func (namedBackend) Check(*environmentv1.EnvironmentSpec) error { return nil }

func (namedBackend) Run(context.Context, *environment.Invocation) (*environment.Result, error) {
	return nil, errors.New("not in this test")
}
