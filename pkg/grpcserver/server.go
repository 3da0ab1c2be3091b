package grpcserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/secbear/neuron/pkg/interceptor/auth"
	"github.com/secbear/neuron/pkg/telemetry"
)

// Server is a gRPC server with the standard chain. Register services on it
// (it is a grpc.ServiceRegistrar), then call Serve.
type Server struct {
	cfg    Config
	log    *slog.Logger
	grpc   *grpc.Server
	health *health.Server
	tel    *telemetry.Telemetry
}

// Option adds to the standard server.
type Option func(*extra)

type extra struct {
	unary  []grpc.UnaryServerInterceptor
	stream []grpc.StreamServerInterceptor
	policy *auth.Policy
	opts   []grpc.ServerOption
}

// WithInterceptors appends service-specific interceptors, innermost in the
// chain: they see authenticated, validated requests.
func WithInterceptors(u []grpc.UnaryServerInterceptor, s []grpc.StreamServerInterceptor) Option {
	return func(e *extra) {
		e.unary = append(e.unary, u...)
		e.stream = append(e.stream, s...)
	}
}

// WithPolicy sets the auth policy directly instead of loading
// Config.AuthPolicy (for tests and embedded use).
func WithPolicy(p *auth.Policy) Option { return func(e *extra) { e.policy = p } }

// WithServerOptions passes raw grpc.ServerOptions (e.g. bufconn tests).
func WithServerOptions(o ...grpc.ServerOption) Option {
	return func(e *extra) { e.opts = append(e.opts, o...) }
}

// New builds the server. It fails with a message naming the flag to fix
// when the config is insecure or inconsistent.
func New(cfg Config, log *slog.Logger, opts ...Option) (*Server, error) {
	var e extra
	for _, o := range opts {
		o(&e)
	}
	c := cfg.withDefaults()
	if err := c.validate(e.policy != nil); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	policy := e.policy
	if !c.Dev && policy == nil {
		p, err := auth.LoadPolicy(c.AuthPolicy)
		if err != nil {
			return nil, err
		}
		policy = p
	}
	if c.Dev {
		policy = nil
		log.Warn("DEVELOPMENT MODE: TLS and authentication are off; never expose this port")
	}
	chain, err := newChain(log, policy, e.unary, e.stream)
	if err != nil {
		return nil, err
	}
	// The process's tracer and meter providers, when configured: every
	// binary gets them here, where its server is built.
	tel, err := telemetry.Setup(context.Background(), c.OTel, c.Name, log)
	if err != nil {
		return nil, err
	}
	c.Telemetry = c.Telemetry || c.OTel.Enabled()
	var sopts []grpc.ServerOption
	if c.Telemetry {
		// Spans and metrics go to the process's global OpenTelemetry
		// providers. Off by default: with no exporter it is pure cost
		// (about a tenth of a small call's CPU).
		sopts = append(sopts, grpc.StatsHandler(otelgrpc.NewServerHandler()))
	}
	sopts = append(sopts,
		grpc.ChainUnaryInterceptor(chain.unary...),
		grpc.ChainStreamInterceptor(chain.stream...),
		grpc.MaxRecvMsgSize(c.MaxRecvMsgBytes),
		grpc.MaxSendMsgSize(c.MaxSendMsgBytes),
		grpc.MaxConcurrentStreams(uint32(min(c.MaxConcurrentStreams, 1<<31))),
		// Calls run on a few long-lived goroutines (one per CPU) while
		// they are free, else on a new one each: a new goroutine starts
		// with a small stack that every call grows again (a copy per
		// doubling), which was a tenth of a small call's CPU.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		// A connection's write buffer goes back to a pool after each
		// flush instead of staying with the connection: idle clients
		// hold no buffer.
		grpc.SharedWriteBuffer(true),
		grpc.StaticStreamWindowSize(StreamWindowBytes),
		grpc.StaticConnWindowSize(ConnWindowBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             10 * time.Second, // refuse clients that ping more often
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: 15 * time.Minute,
			Time:              2 * time.Minute,
			Timeout:           20 * time.Second,
		}),
	)
	if c.TLSCert != "" && !c.Dev {
		tc, err := serverTLS(c)
		if err != nil {
			_ = tel.Shutdown(context.Background())
			return nil, err
		}
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(tc)))
	}
	sopts = append(sopts, e.opts...)
	gs := grpc.NewServer(sopts...)
	hs := health.NewServer()
	// NOT_SERVING until Serve starts; probes see the truth.
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return &Server{cfg: c, log: log, grpc: gs, health: hs, tel: tel}, nil
}

// RegisterService implements grpc.ServiceRegistrar.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.grpc.RegisterService(desc, impl)
	s.health.SetServingStatus(desc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
}

// Logger is the server's logger.
func (s *Server) Logger() *slog.Logger { return s.log }

// Listen opens Config.Addr.
func (s *Server) Listen() (net.Listener, error) {
	lis, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
	}
	return lis, nil
}

// Serve serves on lis until ctx is done, then stops gracefully: health
// turns NOT_SERVING first, in-flight calls get ShutdownTimeout to finish,
// and whatever remains is cut. It returns nil after a requested stop.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	defer s.flushTelemetry()
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(lis) }()
	s.setServing(healthpb.HealthCheckResponse_SERVING)
	s.log.Info("SERVING", "addr", lis.Addr().String(), "dev", s.cfg.Dev,
		"tls", s.cfg.TLSCert != "" && !s.cfg.Dev, "mtls", s.cfg.ClientCA != "" && !s.cfg.Dev)
	select {
	case err := <-errc:
		s.health.Shutdown()
		return fmt.Errorf("serve %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	s.log.Info("shutting down", "timeout", s.cfg.ShutdownTimeout.String())
	s.health.Shutdown() // every service NOT_SERVING before we stop accepting
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.ShutdownTimeout):
		s.log.Warn("graceful stop timed out; cutting in-flight calls")
		s.grpc.Stop()
		<-done
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	s.log.Info("stopped")
	return nil
}

// flushTelemetry exports what spans and metrics are queued, bounded by
// telemetry.DefaultShutdownTimeout.
func (s *Server) flushTelemetry() {
	if err := s.tel.Shutdown(context.Background()); err != nil {
		s.log.Warn("telemetry flush incomplete", "err", err)
	}
}

func (s *Server) setServing(st healthpb.HealthCheckResponse_ServingStatus) {
	s.health.SetServingStatus("", st)
	for name := range s.grpc.GetServiceInfo() {
		s.health.SetServingStatus(name, st)
	}
}

func serverTLS(c Config) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("load --tls-cert/--tls-key: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.ClientCA != "" {
		pool, err := loadPool(c.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}
