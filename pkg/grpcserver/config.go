package grpcserver

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/secbear/neuron/pkg/msgsize"
	"github.com/secbear/neuron/pkg/telemetry"
)

// Config is what every service's server needs. Zero values take the
// defaults below.
type Config struct {
	// Name is the service's name in logs, e.g. "state".
	Name string
	// Addr is the listen address, host:port.
	Addr string
	// Dev turns security off (no TLS, no auth) for local development.
	Dev bool
	// TLSCert and TLSKey are PEM files of the server's certificate.
	TLSCert, TLSKey string
	// ClientCA, when set, turns on mTLS: client certificates are required
	// and verified against this PEM bundle.
	ClientCA string
	// AuthPolicy is the JSON policy file of principals (pkg/interceptor/auth).
	AuthPolicy string
	// Plaintext allows serving without TLS outside dev mode, for a service
	// mesh that provides transport security. Tokens still apply.
	Plaintext bool
	// MaxRecvMsgBytes and MaxSendMsgBytes bound message sizes.
	MaxRecvMsgBytes, MaxSendMsgBytes int
	// MaxConcurrentStreams bounds concurrent calls per connection.
	MaxConcurrentStreams uint
	// ShutdownTimeout bounds the graceful stop before calls are cut.
	ShutdownTimeout time.Duration
	// Telemetry installs the otelgrpc stats handler: a span and metrics
	// per call, trace context taken from incoming metadata.
	Telemetry bool
	// OTel is where the process's traces and metrics go (pkg/telemetry):
	// New installs the providers when it is enabled (which turns
	// Telemetry on too) and Serve flushes them when it returns.
	OTel telemetry.Config
}

// Defaults. DefaultMaxMsgBytes is msgsize.Max, which grpcclient uses too.
const (
	DefaultMaxMsgBytes          = msgsize.Max
	DefaultMaxConcurrentStreams = 1024
	DefaultShutdownTimeout      = 10 * time.Second
)

// HTTP/2 flow-control windows, fixed rather than grown by grpc-go's
// bandwidth-delay estimator: the estimator pings the peer on received
// data, which for small unary calls costs extra writes and wake-ups on
// both sides (measured: about 8% of an Execute's CPU through the
// operator benchmark). 1 MiB per stream and 4 MiB per connection keep a
// full-size message moving at gigabytes a second at in-cluster
// round-trip times. grpcclient uses the same values.
const (
	StreamWindowBytes = 1 << 20
	ConnWindowBytes   = 4 << 20
)

// BindFlags registers the shared server flags on fs, with cfg's current
// values as defaults. Use with flagenv.Parse for env fallbacks.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	*c = c.withDefaults() // so --help shows the real defaults
	fs.StringVar(&c.Addr, "addr", c.Addr, "listen address (host:port)")
	fs.BoolVar(&c.Dev, "dev", c.Dev, "development mode: no TLS, no authentication (never in production)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "server certificate PEM file")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "server private key PEM file")
	fs.StringVar(&c.ClientCA, "tls-client-ca", c.ClientCA, "CA bundle PEM; when set, clients must present a certificate it signed (mTLS)")
	fs.StringVar(&c.AuthPolicy, "auth-policy", c.AuthPolicy, "JSON file of principals, tokens and allowed methods")
	fs.BoolVar(&c.Plaintext, "plaintext", c.Plaintext, "serve without TLS outside dev mode (only behind a mesh that encrypts)")
	fs.IntVar(&c.MaxRecvMsgBytes, "max-recv-msg-bytes", c.MaxRecvMsgBytes, "largest request message accepted")
	fs.IntVar(&c.MaxSendMsgBytes, "max-send-msg-bytes", c.MaxSendMsgBytes, "largest response message sent")
	fs.UintVar(&c.MaxConcurrentStreams, "max-concurrent-streams", c.MaxConcurrentStreams, "concurrent calls per connection")
	fs.BoolVar(&c.Telemetry, "otel", c.Telemetry, "OpenTelemetry spans and metrics for every call (to the process's OTel providers)")
	c.OTel.BindFlags(fs)
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "graceful stop limit before in-flight calls are cut")
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.MaxRecvMsgBytes == 0 {
		out.MaxRecvMsgBytes = DefaultMaxMsgBytes
	}
	if out.MaxSendMsgBytes == 0 {
		out.MaxSendMsgBytes = DefaultMaxMsgBytes
	}
	if out.MaxConcurrentStreams == 0 {
		out.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if out.ShutdownTimeout == 0 {
		out.ShutdownTimeout = DefaultShutdownTimeout
	}
	return out
}

// validate reports a config that would start an insecure or broken server.
// havePolicy says a policy was given in code (WithPolicy), not by file.
func (c *Config) validate(havePolicy bool) error {
	if c.MaxRecvMsgBytes < 0 || c.MaxSendMsgBytes < 0 || c.ShutdownTimeout < 0 {
		return errors.New("message sizes and shutdown timeout must not be negative")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together: set both or neither")
	}
	if c.ClientCA != "" && c.TLSCert == "" {
		return errors.New("--tls-client-ca (mTLS) needs --tls-cert and --tls-key")
	}
	if c.Dev {
		return nil
	}
	if c.AuthPolicy == "" && !havePolicy {
		return fmt.Errorf("security is on: set --auth-policy (a principals file), or --dev for local development")
	}
	if c.TLSCert == "" && !c.Plaintext {
		return fmt.Errorf("security is on: set --tls-cert and --tls-key, or --plaintext behind a mesh that encrypts, or --dev for local development")
	}
	return nil
}
