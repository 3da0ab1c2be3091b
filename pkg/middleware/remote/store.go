package remote

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/middleware/store"
)

const storeBoundary = middlewarev1.Boundary_BOUNDARY_STORE

// StoreServerInterceptor intercepts StateService calls on the state
// server (the store boundary, pkg/middleware/store): Read, Write, Delete,
// List and Search are sent as the store operations READ, WRITE, DELETE,
// LIST and SEARCH with their scope and key (the prefix for List, the
// query for Search; store.CallOf); the value goes with a Write before and
// a Read after. A HALT fails the call with
// PERMISSION_DENIED (before: the handler is not called; after: its result
// is withheld, though a write is then already applied). A MODIFY replaces
// the value written (before a Write) or returned (after a Read); a MODIFY
// anywhere else cannot be applied and is a middleware failure. Other
// methods (health, reflection) pass through.
func (m *Middleware) StoreServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !m.wantsAny(storeBoundary) {
			return handler(ctx, req)
		}
		c, ok := store.CallOf(info.FullMethod, req)
		if !ok {
			return handler(ctx, req)
		}
		if m.wants(storeBoundary, before) {
			v, err := m.storeBefore(ctx, c)
			if err != nil {
				return nil, err
			}
			if v != c.Value {
				c.Value = v
				req = withMessage(req.(proto.Message), "value", v)
			}
		}
		resp, err := handler(ctx, req)
		if err != nil || !m.wants(storeBoundary, after) {
			return resp, err
		}
		if err := m.storeAfter(ctx, c, resp); err != nil {
			return nil, err
		}
		return resp, nil
	}
}

// storeBefore returns the value to write: c.Value, or the middleware's
// replacement.
func (m *Middleware) storeBefore(ctx context.Context, c store.Call) (*structpb.Value, error) {
	at := point{storeBoundary, before}
	resp, out, err := consult(ctx, m, at, func(ctx context.Context) (*middlewarev1.InterceptStoreResponse, error) {
		return m.client.InterceptStore(ctx, &middlewarev1.InterceptStoreRequest{
			Phase: before, Operation: c.Op, Scope: c.Scope, Key: c.Key, Value: c.Value,
		})
	})
	switch {
	case err != nil:
		return nil, err
	case out == halt:
		return nil, fmt.Errorf("%s refused by middleware %q: %s: %w", c, m.name, orNone(resp.GetVerdict().GetReason()), errs.PermissionDenied)
	case out == modify && c.Op != middlewarev1.StoreOperation_STORE_OPERATION_WRITE:
		return c.Value, m.failed(ctx, at, "MODIFY of a "+c.OpName()+", which has no value to replace", nil)
	case out == modify && resp.GetValue() == nil:
		return c.Value, m.failed(ctx, at, "MODIFY without a replacement value", nil)
	case out == modify:
		m.modified(ctx, at, resp)
		return resp.GetValue(), nil
	}
	return c.Value, nil
}

// storeAfter consults the middleware on a successful call's result and
// applies its verdict to resp.
func (m *Middleware) storeAfter(ctx context.Context, c store.Call, resp any) error {
	at := point{storeBoundary, after}
	read, _ := resp.(*statev1.ReadResponse)
	ireq := &middlewarev1.InterceptStoreRequest{Phase: after, Operation: c.Op, Scope: c.Scope, Key: c.Key}
	if read != nil {
		ireq.Value = read.GetValue()
	}
	ans, out, err := consult(ctx, m, at, func(ctx context.Context) (*middlewarev1.InterceptStoreResponse, error) {
		return m.client.InterceptStore(ctx, ireq)
	})
	switch {
	case err != nil:
		return err
	case out == halt:
		return fmt.Errorf("the result of %s was withheld by middleware %q: %s: %w", c, m.name, orNone(ans.GetVerdict().GetReason()), errs.PermissionDenied)
	case out == modify && read == nil:
		return m.failed(ctx, at, "MODIFY after a "+c.OpName()+", which returns no value to replace", nil)
	case out == modify && ans.GetValue() == nil:
		return m.failed(ctx, at, "MODIFY without a replacement value", nil)
	case out == modify:
		m.modified(ctx, at, ans)
		read.Value = ans.GetValue()
	}
	return nil
}
