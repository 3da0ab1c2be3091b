// Package flagenv gives every command-line flag an environment-variable
// fallback: a flag not set on the command line takes its value from
// PREFIX_NAME (the flag name upper-cased, dashes as underscores), e.g.
// --data-dir from NEURON_STATE_DATA_DIR. Flags beat env, env beats defaults.
package flagenv
