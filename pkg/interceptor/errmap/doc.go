// Package errmap maps the errors handlers return to gRPC statuses, once,
// with errs.ToStatus: error kinds become their documented code, and any
// error that wraps no kind becomes INTERNAL "internal error" while its text
// is logged on the server only.
package errmap
