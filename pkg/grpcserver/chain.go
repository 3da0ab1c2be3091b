package grpcserver

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"buf.build/go/protovalidate"
	pvmw "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/protovalidate"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/interceptor/auth"
	"github.com/secbear/neuron/pkg/interceptor/calllog"
	"github.com/secbear/neuron/pkg/interceptor/errmap"
)

type chain struct {
	unary  []grpc.UnaryServerInterceptor
	stream []grpc.StreamServerInterceptor
}

// newChain builds the standard interceptor chain, outermost first, from
// the general server interceptors of pkg/interceptor (calllog, errmap,
// auth) and go-grpc-middleware's recovery and protovalidate. The order
// matters: the call log sees the final code; errmap maps what recovery,
// auth and validation return; auth runs before validation so an
// unauthenticated caller learns nothing about the request's shape. The
// service's own interceptors (the Middleware protocol's boundaries,
// pkg/middleware) come last: they see authenticated, validated calls.
func newChain(log *slog.Logger, policy *auth.Policy, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) (chain, error) {
	// protovalidate's process-wide validator, built on the first call it
	// checks (not here: its CEL environment takes every message type
	// linked into the binary, megabytes and milliseconds a server that is
	// only starting does not need) and shared with the other validations
	// of the process.
	validator := valueTreesSkipped{protovalidate.GlobalValidator}
	principal := calllog.WithFields(func(ctx context.Context) []slog.Attr {
		if p := auth.PrincipalFrom(ctx); p != nil {
			return []slog.Attr{slog.String("principal", p.Name)}
		}
		return nil
	})
	recoverOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		method, _ := grpc.Method(ctx)
		log.ErrorContext(ctx, "panic in handler", "grpc.method", method,
			"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return errs.Internal // the client sees only "internal error"
	})
	em := errmap.WithLogger(log)

	var c chain
	// 0. a slot the call logger reads the principal from, once auth sets
	//    it (without auth, in dev, there is never a principal to log).
	if policy != nil {
		c.unary = append(c.unary, auth.UnarySlotInterceptor())
		c.stream = append(c.stream, auth.StreamSlotInterceptor())
	}
	// 1. calllog: one line per finished call, through the redacting logger.
	c.unary = append(c.unary, calllog.UnaryServerInterceptor(log, principal))
	c.stream = append(c.stream, calllog.StreamServerInterceptor(log, principal))
	// 2. errmap: the single place errors become statuses.
	c.unary = append(c.unary, errmap.UnaryServerInterceptor(em))
	c.stream = append(c.stream, errmap.StreamServerInterceptor(em))
	// 3. recovery: a panic is an INTERNAL error, never a crash or a leak.
	c.unary = append(c.unary, recovery.UnaryServerInterceptor(recoverOpt))
	c.stream = append(c.stream, recovery.StreamServerInterceptor(recoverOpt))
	// 4. auth: who is calling, and may they call this method (off in dev).
	if policy != nil {
		c.unary = append(c.unary, auth.UnaryServerInterceptor(policy))
		c.stream = append(c.stream, auth.StreamServerInterceptor(policy))
	}
	// 5. validation: the protovalidate rules written in the contracts.
	//    Health and reflection requests have none: skipping them keeps a
	//    probe from building the validator of a server no one calls yet.
	noRules := pvmw.WithIgnoreMessages(
		(&healthpb.HealthCheckRequest{}).ProtoReflect().Type(),
		(&healthpb.HealthListRequest{}).ProtoReflect().Type(),
		(&reflectionv1.ServerReflectionRequest{}).ProtoReflect().Type(),
		(&reflectionv1alpha.ServerReflectionRequest{}).ProtoReflect().Type(),
	)
	c.unary = append(c.unary, pvmw.UnaryServerInterceptor(validator, noRules))
	c.stream = append(c.stream, pvmw.StreamServerInterceptor(validator, noRules))
	// 6. the service's own interceptors (e.g. the store boundary of
	//    pkg/middleware on the state service).
	c.unary = append(c.unary, unary...)
	c.stream = append(c.stream, stream...)
	return c, nil
}

// valueTreesSkipped is a protovalidate.Validator that does not descend
// into google.protobuf.Struct, Value and ListValue (skipValueTrees).
type valueTreesSkipped struct{ protovalidate.Validator }

// skipValueTreesOpts is the options of every Validate call without its
// own: built once, so a call allocates nothing for them.
var skipValueTreesOpts = []protovalidate.ValidationOption{protovalidate.WithFilter(protovalidate.FilterFunc(skipValueTrees))}

func (v valueTreesSkipped) Validate(msg proto.Message, opts ...protovalidate.ValidationOption) error {
	if len(opts) == 0 {
		return v.Validator.Validate(msg, skipValueTreesOpts...)
	}
	return v.Validator.Validate(msg, append(append([]protovalidate.ValidationOption(nil), skipValueTreesOpts...), opts...)...)
}

// skipValueTrees is a protovalidate filter: false for the rules of
// google.protobuf.Struct, Value and ListValue and of their fields, true
// for everything else. Those well-known types carry no rules, and
// nothing nested in them can (only more Structs, Values and ListValues),
// but protovalidate cannot tell that of a recursive type and walks every
// entry of every map and list in them (kvPairs, listItems): about a fifth
// of the CPU of a State Write whose value is a conversation entry. A rule
// on a field that holds one (`required` on WriteRequest.value) belongs to
// the containing message and still applies.
func skipValueTrees(m protoreflect.Message, _ protoreflect.Descriptor) bool {
	switch m.Descriptor().FullName() {
	case "google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue":
		return false
	}
	return true
}
