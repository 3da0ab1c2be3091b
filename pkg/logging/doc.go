// Package logging builds the structured slog logger every neuron binary
// uses, with secret redaction: attributes whose key names a secret, and
// values that look like credentials, are replaced by "[REDACTED]" before
// they reach any output. Numbers and booleans are counts, sizes and
// flags, never secrets, and print as they are whatever their key
// (tokens_in, credential_count). A line logged with a context holding an
// OpenTelemetry span carries its trace_id and span_id (WithTrace). RedactWith is the same step with another
// redaction (the environment service passes its scrubber of injected
// credentials).
package logging
