// Package report is what the docker attack tests' probe (the command in
// the parent directory) sends back, shared with the tests that decode it
// so the two cannot drift apart.
package report

// Report is what the probe saw from inside the container. Fields hold
// either a value or, for an attempt, the error it got ("" when it
// succeeded).
type Report struct {
	UID, GID, EUID int
	Groups         []int
	PID            int
	// Status holds the capability, no_new_privs and seccomp lines of
	// /proc/self/status.
	Status map[string]string
	// Namespaces maps each /proc/self/ns entry to its link.
	Namespaces map[string]string
	// Interfaces are the network interfaces' names.
	Interfaces []string
	// MountInfo is /proc/self/mountinfo.
	MountInfo string
	// Devices are the entries of /dev (not recursive), with their mode.
	Devices map[string]string
	// Sockets are the Unix sockets found anywhere outside /proc and /sys.
	Sockets []string
	// Env is the environment.
	Env []string
	// Writes maps each path the probe tried to create or open for
	// writing to the error it got.
	Writes map[string]string
	// Dials maps each socket the probe tried to reach to the error.
	Dials map[string]string
	// Syscalls maps each privileged call tried to the error it got.
	Syscalls map[string]string
	// Sizes maps each writable mount to its size in bytes (statfs).
	Sizes map[string]uint64
	// Filled is how many bytes fit in the workspace before a write
	// failed, and FillErr that failure.
	Filled  int64
	FillErr string
	// Cgroup maps cgroup limit files to their content.
	Cgroup map[string]string
	// Files maps each file the probe was asked to read to its content
	// or error.
	Files map[string]string
	// Dirs maps each directory the probe was asked to list to its
	// entries.
	Dirs map[string][]string
	// Input is the size of what arrived on stdin.
	Input int
}
