// Package docker is the environment service's container backend: it runs
// each invocation's one-shot operator in a fresh container through the
// Docker engine API.
//
// Every container runs the operator image (the spec's container boundary
// names it, else Config.DefaultImage) as user 65532 with a read-only root
// file system, every capability dropped, no-new-privileges, no network at
// all (network mode "none"), and tmpfs mounts for /workspace and /tmp. Its
// environment is only the invocation's credential variables. The
// OperatorInput goes in on the attached stdin; the OperatorOutput comes
// back on stdout, bounded by max_output_bytes; stderr becomes the run's
// logs. Memory (without swap), CPU, process count and per-process CPU
// time are enforced by the engine's cgroups and rlimits.
//
// Model traffic, when the invocation has any, leaves through the egress
// proxy only: it listens on a Unix socket in a per-invocation host
// directory that is bind-mounted at /run/neuron, and the operator is
// started with --egress-proxy unix:///run/neuron/egress.sock. Session
// history is read the same way, through the environment service's
// read-only state bridge on a socket mounted at /run/neuron-state. File
// credentials are host files (mode 0400, owned by 65532) bind-mounted
// read-only at their paths. The per-invocation directory, hence
// Config.WorkDir, must be on the engine's host.
//
// The gvisor boundary is enforced by running the container under an OCI
// runtime such as runsc (Config.Runtime) and refused without one. The
// process, microvm, wasm and custom boundaries, resources.gpu and
// resources.disk are refused with FAILED_PRECONDITION.
//
// The container is force-removed when the run ends, whatever the
// outcome; it carries the label neuron.dev/invocation=<invocation id>.
package docker
