package auth

// skipped are method prefixes served without credentials: health probes
// (kubelet, load balancers) and reflection (schema only, no data).
var defaultSkipped = []string{"/grpc.health.v1.Health/", "/grpc.reflection."}

type options struct {
	skipped []string
}

// Option configures the interceptors.
type Option func(*options)

// WithUnauthenticated replaces the method prefixes that need no
// credentials (default: health and reflection).
func WithUnauthenticated(prefixes ...string) Option {
	return func(o *options) { o.skipped = prefixes }
}

func evaluate(opts []Option) *options {
	o := &options{skipped: defaultSkipped}
	for _, opt := range opts {
		opt(o)
	}
	return o
}
