// Package calllog writes one structured line per finished gRPC call:
// method, code, duration, peer and principal, never payloads. Successful
// calls log at debug, client mistakes at info, server-side failures at
// warn or error.
//
// It replaces go-grpc-middleware's logging interceptor on the server
// because that one builds its fields on every call even when the line is
// not logged, which cost a tenth of a small Read's CPU; this one asks the
// logger first.
package calllog
