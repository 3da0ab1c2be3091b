// Package errs holds the error kinds every neuron service returns and the
// single table that maps each kind to a gRPC status code.
//
// Stores and handlers wrap a kind with context:
//
//	return fmt.Errorf("key %q: %w", key, errs.NotFound)
//
// and the server's error interceptor turns the error into a status once,
// with ToStatus. Messages of wrapped kinds are shown to callers, so they
// must say what to do and never hold secrets or internals. Errors that
// wrap no kind become INTERNAL with the message "internal error"; their
// text stays in the server's logs.
package errs
