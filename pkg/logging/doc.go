// Package logging builds the structured slog logger every neuron binary
// uses, with secret redaction: attributes whose key names a secret, and
// values that look like credentials, are replaced by "[REDACTED]" before
// they reach any output.
package logging
