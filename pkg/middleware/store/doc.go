// Package store is the Middleware protocol's store boundary
// (BOUNDARY_STORE of layer0.middleware.v1): every call to the
// StateService, on the state server.
//
// The state service (services/state.Run) installs, as its own server
// interceptors after the standard chain of pkg/grpcserver, outermost
// first:
//
//   - a remote MiddlewareService, when --middleware-addr is set:
//     remote.Middleware.StoreServerInterceptor (pkg/middleware/remote);
//   - AuditInterceptor: the audit log, one structured record per Write or
//     Delete naming who (the authenticated principal), the scope, the key,
//     the resulting revision and the outcome. Values are never logged.
//     Reads are not audited (they change nothing).
//
// Call and CallOf say which calls are store calls and what the protocol
// is told about each (InterceptStoreRequest's operation, scope, key and
// value).
//
// Its tests run the family's shared suite (pkg/middleware/internal/boundarytest)
// against a real state server (memory backend) behind the standard chain,
// and test the audit record with a fake handler.
package store
