package remote

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
)

const storeBoundary = middlewarev1.Boundary_BOUNDARY_STORE

// storePrefix is the method prefix of StateService.
var storePrefix = "/" + statev1.StateService_ServiceDesc.ServiceName + "/"

// StoreServerInterceptor intercepts StateService calls on the state
// server: Read, Write, Delete, List and Search are sent as the store
// operations READ, WRITE, DELETE, LIST and SEARCH with their scope and key
// (the prefix for List, the query for Search); the value goes with a
// Write before and a Read after. A HALT fails the call with
// PERMISSION_DENIED (before: the handler is not called; after: its result
// is withheld, though a write is then already applied). A MODIFY replaces
// the value written (before a Write) or returned (after a Read); a MODIFY
// anywhere else cannot be applied and is a middleware failure. Other
// methods (health, reflection) pass through.
func (m *Middleware) StoreServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, storePrefix) || !m.wantsAny(storeBoundary) {
			return handler(ctx, req)
		}
		c, ok := storeCallOf(req)
		if !ok {
			return handler(ctx, req)
		}
		if m.wants(storeBoundary, before) {
			v, err := m.storeBefore(ctx, c)
			if err != nil {
				return nil, err
			}
			if v != c.value {
				c.value = v
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

// storeCall is what the middleware is told about a State call.
type storeCall struct {
	op    middlewarev1.StoreOperation
	scope *typesv1.Scope
	key   string          // key, prefix (LIST) or query (SEARCH)
	value *structpb.Value // the value written (WRITE)
}

func storeCallOf(req any) (storeCall, bool) {
	switch r := req.(type) {
	case *statev1.ReadRequest:
		return storeCall{middlewarev1.StoreOperation_STORE_OPERATION_READ, r.GetScope(), r.GetKey(), nil}, true
	case *statev1.WriteRequest:
		return storeCall{middlewarev1.StoreOperation_STORE_OPERATION_WRITE, r.GetScope(), r.GetKey(), r.GetValue()}, true
	case *statev1.DeleteRequest:
		return storeCall{middlewarev1.StoreOperation_STORE_OPERATION_DELETE, r.GetScope(), r.GetKey(), nil}, true
	case *statev1.ListRequest:
		return storeCall{middlewarev1.StoreOperation_STORE_OPERATION_LIST, r.GetScope(), r.GetPrefix(), nil}, true
	case *statev1.SearchRequest:
		return storeCall{middlewarev1.StoreOperation_STORE_OPERATION_SEARCH, r.GetScope(), r.GetQuery(), nil}, true
	}
	return storeCall{}, false
}

// opName is "read", "write", ... for messages.
func (c storeCall) opName() string {
	return strings.ToLower(strings.TrimPrefix(c.op.String(), "STORE_OPERATION_"))
}

// String names the call for the caller: `write of key "k"`; the query of
// a search is left out.
func (c storeCall) String() string {
	switch c.op {
	case middlewarev1.StoreOperation_STORE_OPERATION_LIST:
		return fmt.Sprintf("list of prefix %q", c.key)
	case middlewarev1.StoreOperation_STORE_OPERATION_SEARCH:
		return "search"
	}
	return fmt.Sprintf("%s of key %q", c.opName(), c.key)
}

// storeBefore returns the value to write: c.value, or the middleware's
// replacement.
func (m *Middleware) storeBefore(ctx context.Context, c storeCall) (*structpb.Value, error) {
	at := point{storeBoundary, before}
	resp, out, err := consult(ctx, m, at, func(ctx context.Context) (*middlewarev1.InterceptStoreResponse, error) {
		return m.client.InterceptStore(ctx, &middlewarev1.InterceptStoreRequest{
			Phase: before, Operation: c.op, Scope: c.scope, Key: c.key, Value: c.value,
		})
	})
	switch {
	case err != nil:
		return nil, err
	case out == halt:
		return nil, fmt.Errorf("%s refused by middleware %q: %s: %w", c, m.name, orNone(resp.GetVerdict().GetReason()), errs.PermissionDenied)
	case out == modify && c.op != middlewarev1.StoreOperation_STORE_OPERATION_WRITE:
		return c.value, m.failed(ctx, at, "MODIFY of a "+c.opName()+", which has no value to replace", nil)
	case out == modify && resp.GetValue() == nil:
		return c.value, m.failed(ctx, at, "MODIFY without a replacement value", nil)
	case out == modify:
		m.modified(ctx, at, resp)
		return resp.GetValue(), nil
	}
	return c.value, nil
}

// storeAfter consults the middleware on a successful call's result and
// applies its verdict to resp.
func (m *Middleware) storeAfter(ctx context.Context, c storeCall, resp any) error {
	at := point{storeBoundary, after}
	read, _ := resp.(*statev1.ReadResponse)
	ireq := &middlewarev1.InterceptStoreRequest{Phase: after, Operation: c.op, Scope: c.scope, Key: c.key}
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
		return m.failed(ctx, at, "MODIFY after a "+c.opName()+", which returns no value to replace", nil)
	case out == modify && ans.GetValue() == nil:
		return m.failed(ctx, at, "MODIFY without a replacement value", nil)
	case out == modify:
		m.modified(ctx, at, ans)
		read.Value = ans.GetValue()
	}
	return nil
}
