package grpcclient

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Trace propagation without telemetry. otelgrpc's client handler, which
// Config.Telemetry installs, starts a span and records metrics for every
// call and, on the way, injects the trace context into the call's
// metadata. Without a tracer provider the span is the caller's own
// (non-recording) and the metrics go nowhere, so the injection is all it
// does, at about a sixth of a small call's allocations. These interceptors
// do only the injection: a call carries the same traceparent, tracestate
// and baggage headers (whatever the process's propagator writes) either
// way.

// propagateUnary injects the call's trace context into its metadata.
func propagateUnary(prop func() propagation.TextMapPropagator) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(inject(ctx, prop()), method, req, reply, cc, opts...)
	}
}

// propagateStream is propagateUnary for streams.
func propagateStream(prop func() propagation.TextMapPropagator) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(inject(ctx, prop()), desc, cc, method, opts...)
	}
}

// globalPropagator is the process's propagator, read per call as
// otelgrpc does (a binary may install it after dialling).
func globalPropagator() propagation.TextMapPropagator { return otel.GetTextMapPropagator() }

// inject returns ctx with what p writes added to its outgoing metadata,
// or ctx itself when p writes nothing (no trace, no baggage: the common
// case, which then costs no allocation).
func inject(ctx context.Context, p propagation.TextMapPropagator) context.Context {
	c := carrier{ctx: ctx}
	p.Inject(ctx, &c)
	if !c.set {
		return ctx
	}
	return metadata.NewOutgoingContext(ctx, c.md)
}

// carrier copies the outgoing metadata when it is first used.
type carrier struct {
	ctx context.Context
	md  metadata.MD
	set bool // a header was written
}

func (c *carrier) outgoing() metadata.MD {
	if c.md == nil {
		c.md, _ = metadata.FromOutgoingContext(c.ctx) // a copy
		if c.md == nil {
			c.md = metadata.MD{}
		}
	}
	return c.md
}

// Get implements propagation.TextMapCarrier.
func (c *carrier) Get(key string) string {
	if v := c.outgoing().Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set implements propagation.TextMapCarrier.
func (c *carrier) Set(key, value string) {
	c.outgoing().Set(key, value)
	c.set = true
}

// Keys implements propagation.TextMapCarrier.
func (c *carrier) Keys() []string {
	md := c.outgoing()
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	return keys
}
