// Package logging builds the structured slog logger every neuron binary
// uses, with secret redaction: attributes whose key names a secret, and
// values that look like credentials, are replaced by "[REDACTED]" before
// they reach any output. RedactWith is the same step with another
// redaction (the environment service passes its scrubber of injected
// credentials).
package logging
