// Package duration reads the google.protobuf.Duration fields of requests.
//
// A Duration on the wire can be invalid: nanos outside ±999,999,999,
// seconds and nanos of different signs, or beyond ±10,000 years.
// durationpb's AsDuration normalizes such a value into some
// time.Duration instead of refusing it, and protovalidate's duration
// rules (gt, lte, ...) compare that normalized value, so neither catches
// it. Every handler that takes a Duration from a request reads it with
// Parse.
package duration
