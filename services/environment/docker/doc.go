// Package docker is the environment service's container backend: it runs
// each invocation's one-shot operator in a fresh container through the
// Docker engine API.
//
// Every container runs the operator image (the spec's container boundary
// names it, else Config.DefaultImage) as user 65532 whatever the image
// says, with a read-only root file system, every capability dropped,
// no-new-privileges, the engine's default seccomp profile, no network at
// all (network mode "none"), private IPC and cgroup namespaces, the
// image's HEALTHCHECK disabled, and only three writable places, each a
// tmpfs of a fixed size: /workspace (owned by the container's user) of
// the invocation's disk limit, /tmp of 64 MiB and /dev/shm of 32 MiB.
// tmpfs pages count against the memory limit, so the workspace is full at
// whichever limit comes first. Its environment is only the invocation's credential
// variables. The OperatorInput goes in on the attached stdin; the
// OperatorOutput comes back on stdout, bounded by max_output_bytes (and
// 1 GiB whatever that says); stderr becomes the run's logs. Memory
// (without swap), CPU, process count and per-process CPU time are
// enforced by the engine's cgroups and rlimits; CPU, memory, processes,
// disk and output that neither the spec nor the service's defaults bound
// take Config.DefaultLimits (1 core, 2 GiB, 256, 1 GiB, 16 MiB), so no
// container runs unbounded. Before starting it, the backend inspects the
// created container and refuses (FAILED_PRECONDITION) one the engine gave
// more than it asked for: an image's VOLUME (a writable directory on the
// host's disk), another mount, privileges, capabilities, devices, a host
// namespace or an unconfined profile from the engine's defaults.
//
// Model traffic, when the invocation has any, leaves through the egress
// proxy only: it listens on a Unix socket in a per-invocation host
// directory, and that socket alone is bind-mounted read-only at
// /run/neuron/egress.sock; the operator is started with --egress-proxy
// unix:///run/neuron/egress.sock. Session history is read the same way,
// through the environment service's read-only state bridge on a socket
// mounted at /run/neuron-state/state.sock. File credentials are host
// files (mode 0400, owned by 65532) bind-mounted read-only at their
// paths. The per-invocation directory, hence Config.WorkDir, must be on
// the engine's host.
//
// The gvisor boundary is enforced by running the container under an OCI
// runtime such as runsc (Config.Runtime) and refused without one. The
// process, microvm, wasm and custom boundaries and resources.gpu are
// refused with FAILED_PRECONDITION, as are credentials placed where they
// would change how the container behaves (guard.go): a file over a
// system directory, under /proc, /sys or /dev, over a file the engine
// manages, the loader's configuration, the user database or the trusted
// certificates; an environment variable read by the loader, a shell, a
// proxy-aware client, a container or cluster client, or the service
// itself (LD_*, PATH, BASH_ENV, HTTPS_PROXY, DOCKER_HOST, NEURON_*, ...).
// A quantity too large for an int64 is INVALID_ARGUMENT.
//
// attack_test.go runs hostile specs and a hostile image against a private
// dockerd; internal/probe is the binary that looks around from inside.
//
// A workspace that lasts (a session's or a workflow's,
// Invocation.Workspace) is a named volume instead of the workspace tmpfs
// (workspace.go): labelled with the workspace, its owner kind and its
// creation time, its root given to the container's user when it is
// created, mounted read-write at /workspace. Its size cap is checked
// before and after each run (a local volume has no size limit of its
// own); the retention sweep removes volumes unused for the retention.
// The file RPCs reach it through the archive API of a container that
// mounts it and is never started, refusing any symbolic link on a path.
//
// The container is force-removed when the run ends, whatever the
// outcome; it carries the label neuron.dev/invocation=<invocation id>.
package docker
