package store

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// methodPrefix is the method prefix of StateService.
var methodPrefix = "/" + statev1.StateService_ServiceDesc.ServiceName + "/"

// Call is a StateService call as the store boundary sees it: what an
// InterceptStoreRequest says about it.
type Call struct {
	// Op is READ, WRITE, DELETE, LIST or SEARCH.
	Op    middlewarev1.StoreOperation
	Scope *typesv1.Scope
	// Key is the key (READ, WRITE, DELETE), the prefix (LIST) or the
	// query (SEARCH).
	Key string
	// Value is the value written (WRITE); nil otherwise.
	Value *structpb.Value
}

// CallOf returns the store call of a StateService Read, Write, Delete,
// List or Search called as method. Any other call (health, reflection, a
// method of another service) is not one: false.
func CallOf(method string, req any) (Call, bool) {
	if !strings.HasPrefix(method, methodPrefix) {
		return Call{}, false
	}
	switch r := req.(type) {
	case *statev1.ReadRequest:
		return Call{middlewarev1.StoreOperation_STORE_OPERATION_READ, r.GetScope(), r.GetKey(), nil}, true
	case *statev1.WriteRequest:
		return Call{middlewarev1.StoreOperation_STORE_OPERATION_WRITE, r.GetScope(), r.GetKey(), r.GetValue()}, true
	case *statev1.DeleteRequest:
		return Call{middlewarev1.StoreOperation_STORE_OPERATION_DELETE, r.GetScope(), r.GetKey(), nil}, true
	case *statev1.ListRequest:
		return Call{middlewarev1.StoreOperation_STORE_OPERATION_LIST, r.GetScope(), r.GetPrefix(), nil}, true
	case *statev1.SearchRequest:
		return Call{middlewarev1.StoreOperation_STORE_OPERATION_SEARCH, r.GetScope(), r.GetQuery(), nil}, true
	}
	return Call{}, false
}

// OpName is "read", "write", ... for messages.
func (c Call) OpName() string {
	return strings.ToLower(strings.TrimPrefix(c.Op.String(), "STORE_OPERATION_"))
}

// String names the call for the caller: `write of key "k"`; the query of
// a search is left out.
func (c Call) String() string {
	switch c.Op {
	case middlewarev1.StoreOperation_STORE_OPERATION_LIST:
		return fmt.Sprintf("list of prefix %q", c.Key)
	case middlewarev1.StoreOperation_STORE_OPERATION_SEARCH:
		return "search"
	}
	return fmt.Sprintf("%s of key %q", c.OpName(), c.Key)
}
