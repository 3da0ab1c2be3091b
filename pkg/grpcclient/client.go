package grpcclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/secbear/neuron/pkg/msgsize"
)

// Config says how to reach one service.
type Config struct {
	// Target is a gRPC target, e.g. "127.0.0.1:7072" or "dns:///state:7072".
	Target string
	// Dev dials without TLS (local development).
	Dev bool
	// Plaintext dials without TLS outside dev (behind a mesh); the token
	// is still sent.
	Plaintext bool
	// CAFile verifies the server; empty uses the system roots.
	CAFile string
	// CertFile and KeyFile are the client certificate for mTLS.
	CertFile, KeyFile string
	// ServerName overrides the name checked in the server certificate.
	ServerName string
	// TokenFile holds the bearer token (trailing whitespace trimmed).
	TokenFile string
	// Timeout is applied to unary calls whose context has no deadline.
	Timeout time.Duration
	// MaxRetries bounds retries of UNAVAILABLE unary calls (0: default 3,
	// negative: none).
	MaxRetries int
	// MaxMsgBytes bounds the messages sent and received (0: msgsize.Max,
	// the servers' default limits). Raise it with the servers'
	// --max-recv-msg-bytes and --max-send-msg-bytes.
	MaxMsgBytes int
	// WaitForReady makes a call to a service that is down or restarting
	// wait, within the call's deadline, until it is back, instead of
	// failing UNAVAILABLE at once: for calls between services, where a
	// peer's restart must not fail the work. Off, a call fails fast.
	WaitForReady bool
	// Telemetry installs otelgrpc's client stats handler: a span and
	// metrics per call, to the process's OpenTelemetry providers. Off,
	// calls still carry the trace context and baggage (the process's
	// propagator) to the server, without a span or metrics of their own.
	Telemetry bool
}

// Defaults.
const (
	DefaultTimeout    = 30 * time.Second
	DefaultMaxRetries = 3
)

// ReconnectBackoff is how a connection redials a service it lost: from
// 100 ms, growing 1.6 times per failed attempt to at most 2 s (gRPC's
// default grows to 2 minutes, so a peer back after a few seconds would be
// noticed only much later).
var ReconnectBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second}

// HTTP/2 flow-control windows, fixed (the same as grpcserver's): without
// them grpc-go's bandwidth-delay estimator pings the server after every
// response it receives, an extra write and wake-up on both sides of each
// small call.
const (
	streamWindowBytes = 1 << 20
	connWindowBytes   = 4 << 20
)

// BindFlags registers flags for a client named name (e.g. "state" gives
// --state-addr, --state-token-file, ...).
func (c *Config) BindFlags(fs *flag.FlagSet, name string) {
	fs.StringVar(&c.Target, name+"-addr", c.Target, name+" service address")
	fs.StringVar(&c.CAFile, name+"-ca", c.CAFile, "CA bundle that signed the "+name+" service's certificate")
	fs.StringVar(&c.CertFile, name+"-cert", c.CertFile, "client certificate for mTLS to the "+name+" service")
	fs.StringVar(&c.KeyFile, name+"-key", c.KeyFile, "client key for mTLS to the "+name+" service")
	fs.StringVar(&c.TokenFile, name+"-token-file", c.TokenFile, "file holding the bearer token for the "+name+" service")
	fs.DurationVar(&c.Timeout, name+"-timeout", c.Timeout, "deadline of calls to the "+name+" service that have none")
	fs.IntVar(&c.MaxMsgBytes, name+"-max-msg-bytes", c.MaxMsgBytes, "largest message sent to or received from the "+name+" service (0: the servers' default, 16 MiB)")
}

// Dial returns a connection to cfg.Target. It does not block; the first
// call waits for the connection (and fails UNAVAILABLE, then retried, if
// the service is down).
func Dial(cfg Config, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	if cfg.Target == "" {
		return nil, errors.New("no target address")
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	retries := cfg.MaxRetries
	if retries == 0 {
		retries = DefaultMaxRetries
	}
	size := cfg.MaxMsgBytes
	if size <= 0 {
		size = msgsize.Max
	}
	opts := []grpc.DialOption{
		grpc.WithSharedWriteBuffer(true), // as grpcserver's
		grpc.WithStaticStreamWindowSize(streamWindowBytes),
		grpc.WithStaticConnWindowSize(connWindowBytes),
		// The servers' limits, not grpc-go's 4 MiB receive default.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(size), grpc.MaxCallSendMsgSize(size), grpc.WaitForReady(cfg.WaitForReady)),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: ReconnectBackoff, MinConnectTimeout: 5 * time.Second}),
	}
	if cfg.Dev || cfg.Plaintext {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		tc, err := clientTLS(cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	}
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return nil, fmt.Errorf("token file %s is empty", cfg.TokenFile)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(Bearer{Token: tok, AllowPlaintext: cfg.Dev || cfg.Plaintext}))
	}
	var unary []grpc.UnaryClientInterceptor
	if cfg.Telemetry {
		opts = append(opts, grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
	} else {
		// Outermost, so that retries reuse the metadata.
		unary = append(unary, propagateUnary(globalPropagator))
		opts = append(opts, grpc.WithChainStreamInterceptor(propagateStream(globalPropagator)))
	}
	unary = append(unary, defaultDeadline(timeout))
	if retries > 0 {
		unary = append(unary, retry.UnaryClientInterceptor(
			retry.WithMax(uint(retries)+1), // WithMax counts attempts, not retries
			retry.WithCodes(codes.Unavailable),
			retry.WithBackoff(retry.BackoffExponentialWithJitter(100*time.Millisecond, 0.2)),
		))
	}
	opts = append(opts, grpc.WithChainUnaryInterceptor(unary...))
	opts = append(opts, extra...)
	conn, err := grpc.NewClient(cfg.Target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", cfg.Target, err)
	}
	return conn, nil
}

// defaultDeadline gives a call without a deadline one, so no call hangs.
func defaultDeadline(d time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// Bearer sends a static bearer token with every call.
type Bearer struct {
	Token string
	// AllowPlaintext permits sending the token without TLS.
	AllowPlaintext bool
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b Bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.Token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (b Bearer) RequireTransportSecurity() bool { return !b.AllowPlaintext }

func clientTLS(cfg Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.ServerName}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", cfg.CAFile)
		}
		tc.RootCAs = pool
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("client certificate and key go together: set both or neither")
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// TLSConfig is the client TLS configuration Dial uses for cfg, for
// clients that dial through another library (the Temporal SDK).
func TLSConfig(cfg Config) (*tls.Config, error) { return clientTLS(cfg) }
