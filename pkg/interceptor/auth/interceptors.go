package auth

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"sync/atomic"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/secbear/neuron/pkg/errs"
)

type principalKey struct{}

type slotKey struct{}

// slot lets interceptors outside auth (the call logger) learn the
// principal that auth found further in.
type slot struct{ p atomic.Pointer[Principal] }

// PrincipalFrom returns the caller authenticated by the interceptors, or
// nil (dev mode, or a method that needs no credentials).
func PrincipalFrom(ctx context.Context) *Principal {
	if p, _ := ctx.Value(principalKey{}).(*Principal); p != nil {
		return p
	}
	if s, _ := ctx.Value(slotKey{}).(*slot); s != nil {
		return s.p.Load()
	}
	return nil
}

// UnarySlotInterceptor goes outside the call logger so that the logger's
// context learns the principal that auth finds later in the chain.
func UnarySlotInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(context.WithValue(ctx, slotKey{}, &slot{}), req)
	}
}

// StreamSlotInterceptor is UnarySlotInterceptor for streams.
func StreamSlotInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		w := middleware.WrapServerStream(ss)
		w.WrappedContext = context.WithValue(ss.Context(), slotKey{}, &slot{})
		return handler(srv, w)
	}
}

// WithPrincipal returns ctx carrying p, for tests and in-process callers.
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// UnaryServerInterceptor authenticates and authorizes unary calls.
func UnaryServerInterceptor(p *Policy, opts ...Option) grpc.UnaryServerInterceptor {
	return grpcauth.UnaryServerInterceptor(p.authFunc(evaluate(opts)))
}

// StreamServerInterceptor authenticates and authorizes streaming calls.
func StreamServerInterceptor(p *Policy, opts ...Option) grpc.StreamServerInterceptor {
	return grpcauth.StreamServerInterceptor(p.authFunc(evaluate(opts)))
}

func (p *Policy) authFunc(o *options) grpcauth.AuthFunc {
	return func(ctx context.Context) (context.Context, error) {
		method, _ := grpc.Method(ctx)
		for _, s := range o.skipped {
			if strings.HasPrefix(method, s) {
				return ctx, nil
			}
		}
		pr, err := p.authenticate(ctx)
		if err != nil {
			return nil, err
		}
		if !pr.Allowed(method) {
			return nil, fmt.Errorf("principal %q may not call %s: %w", pr.Name, method, errs.PermissionDenied)
		}
		if s, _ := ctx.Value(slotKey{}).(*slot); s != nil {
			s.p.Store(pr)
		}
		return WithPrincipal(ctx, pr), nil
	}
}

func (p *Policy) authenticate(ctx context.Context) (*Principal, error) {
	if vals := metadata.ValueFromIncomingContext(ctx, "authorization"); len(vals) > 0 {
		scheme, token, ok := strings.Cut(vals[0], " ")
		if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
			return nil, fmt.Errorf("authorization header must be \"Bearer <token>\": %w", errs.Unauthenticated)
		}
		if pr := p.byBearer(token); pr != nil {
			return pr, nil
		}
		return nil, fmt.Errorf("bearer token not recognised: %w", errs.Unauthenticated)
	}
	if cert := verifiedClientCert(ctx); cert != nil {
		for _, name := range append([]string{cert.Subject.CommonName}, cert.DNSNames...) {
			if pr := p.byName[name]; pr != nil && name != "" {
				return pr, nil
			}
		}
		return nil, fmt.Errorf("client certificate %q names no known principal: %w", cert.Subject.CommonName, errs.PermissionDenied)
	}
	return nil, fmt.Errorf("no credentials: send \"authorization: Bearer <token>\" or a client certificate: %w", errs.Unauthenticated)
}

// verifiedClientCert is the leaf of a client chain the TLS stack verified.
func verifiedClientCert(ctx context.Context) *x509.Certificate {
	pe, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := pe.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0][0]
}
