// Package remote holds what every conformance test shares to check a
// server at an address instead of the reference implementation in
// process: the -addr, -token-file, -tls, -ca and -server-name flags, and
// a dial that closes the connection when the test ends.
package remote

import (
	"flag"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/secbear/neuron/pkg/grpcclient"
)

// Flags are the connection flags of one conformance test binary.
type Flags struct {
	addr, tokenFile, caFile, serverName *string
	useTLS                              *bool
}

// Register defines the flags on the command line: service names what
// -addr points at (such as "OperatorService") and empty names what
// happens without it; allowed says what -token-file's token must be
// allowed to call.
func Register(service, empty, allowed string) *Flags {
	return &Flags{
		addr:       flag.String("addr", "", service+" to check (host:port); empty: "+empty),
		tokenFile:  flag.String("token-file", "", "file holding a bearer token allowed "+allowed),
		useTLS:     flag.Bool("tls", false, "connect with TLS (implied by -ca)"),
		caFile:     flag.String("ca", "", "CA bundle that signed the server's certificate"),
		serverName: flag.String("server-name", "", "server name to verify in the server's certificate"),
	}
}

// Addr is -addr: empty when the suite runs against the reference
// implementation.
func (f *Flags) Addr() string { return *f.addr }

// TokenFile is -token-file: empty when calls carry no credential.
func (f *Flags) TokenFile() string { return *f.tokenFile }

// Config is the client configuration for target with the flags' TLS
// settings and tokenFile's bearer token ("" for none). The server name
// check applies to -addr only.
func (f *Flags) Config(target, tokenFile string) grpcclient.Config {
	cfg := grpcclient.Config{Target: target, Plaintext: !*f.useTLS && *f.caFile == "", CAFile: *f.caFile, TokenFile: tokenFile}
	if target == *f.addr {
		cfg.ServerName = *f.serverName
	}
	return cfg
}

// Dial connects to -addr with -token-file's token.
func (f *Flags) Dial(t *testing.T) *grpc.ClientConn {
	t.Helper()
	return Dial(t, f.Config(*f.addr, *f.tokenFile))
}

// Dial connects with cfg without client retries, so that a suite sees
// every code as the server returned it, and closes the connection when
// the test ends.
func Dial(t *testing.T, cfg grpcclient.Config) *grpc.ClientConn {
	t.Helper()
	cfg.MaxRetries = -1
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Minute
	}
	conn, err := grpcclient.Dial(cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", cfg.Target, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
