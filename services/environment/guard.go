package environment

import (
	"fmt"
	"math"
	"strings"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// The guards of this file refuse credentials placed where they would
// change how the programs of an invocation behave, whichever backend runs
// it: the server applies them to every spec (FAILED_PRECONDITION), and
// the container backends use them for their own checks too.

// RuntimeDirs are owned by the kernel and the container runtime: no
// credential file goes below them.
var RuntimeDirs = []string{"/proc", "/sys", "/dev"}

// systemDirs are directories of a container's system that a credential
// file may not cover (it may go below most of them).
var systemDirs = map[string]bool{
	"/": true, "/bin": true, "/boot": true, "/dev": true, "/etc": true, "/home": true,
	"/lib": true, "/lib32": true, "/lib64": true, "/libx32": true, "/media": true, "/mnt": true,
	"/opt": true, "/proc": true, "/root": true, "/run": true, "/sbin": true, "/srv": true,
	"/sys": true, "/usr": true, "/var": true,
	"/usr/bin": true, "/usr/sbin": true, "/usr/lib": true, "/usr/lib64": true, "/usr/libexec": true,
	"/usr/local": true, "/usr/local/bin": true, "/usr/local/lib": true, "/usr/share": true,
	"/var/lib": true, "/var/run": true, "/var/tmp": true, "/var/log": true,
}

// IsSystemDir reports whether p (clean and absolute) is a system
// directory that a credential file may not cover.
func IsSystemDir(p string) bool { return systemDirs[p] }

// refusedFiles are files a credential may not replace, and why.
var refusedFiles = map[string]string{
	"/etc/hosts":         "is managed by the container runtime",
	"/etc/hostname":      "is managed by the container runtime",
	"/etc/resolv.conf":   "is managed by the container runtime",
	"/etc/ld.so.preload": "changes how the dynamic loader behaves",
	"/etc/ld.so.conf":    "changes how the dynamic loader behaves",
	"/etc/ld.so.cache":   "changes how the dynamic loader behaves",
	"/etc/passwd":        "defines the container's users",
	"/etc/group":         "defines the container's users",
	"/etc/shadow":        "defines the container's users",
	"/etc/gshadow":       "defines the container's users",
	"/etc/sudoers":       "defines the container's privileges",
}

// refusedFileDirs are directories below which a credential may not go,
// and why.
var refusedFileDirs = map[string]string{
	"/etc/ld.so.conf.d":          "changes how the dynamic loader behaves",
	"/etc/sudoers.d":             "defines the container's privileges",
	"/etc/ssl":                   "holds the certificates TLS clients trust",
	"/etc/pki":                   "holds the certificates TLS clients trust",
	"/usr/share/ca-certificates": "holds the certificates TLS clients trust",
}

// RefusedFile says why a credential file may not be placed at p (clean
// and absolute), or "": it would cover a system directory, lie under
// /proc, /sys or /dev, or replace a file that decides users, privileges,
// name resolution, the dynamic loader or trusted certificates.
func RefusedFile(p string) string {
	if IsSystemDir(p) {
		return "would cover a system directory"
	}
	for _, dir := range RuntimeDirs {
		if strings.HasPrefix(p, dir+"/") {
			return "is under " + dir + ", which the kernel and the runtime own"
		}
	}
	if why, ok := refusedFiles[p]; ok {
		return why
	}
	for dir, why := range refusedFileDirs {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			return why
		}
	}
	return ""
}

// refusedEnvNames are variables a credential may not set, and why; names
// compare in upper case (several programs read both cases).
var refusedEnvNames = map[string]string{
	"PATH": "decides which programs run", "IFS": "changes how a shell splits words",
	"ENV": "makes a shell run a file at start", "BASH_ENV": "makes a shell run a file at start",
	"SHELLOPTS": "changes how a shell behaves", "BASHOPTS": "changes how a shell behaves",
	"PS4": "runs in a shell's trace", "PROMPT_COMMAND": "runs in a shell", "CDPATH": "changes how a shell resolves paths",
	"GLOBIGNORE": "changes how a shell expands paths", "SHELL": "decides which shell programs run",
	"HOME": "decides where programs read their configuration", "TMPDIR": "decides where programs write temporary files",
	"GCONV_PATH": "makes the C library load code", "GETCONF_DIR": "changes how the C library behaves",
	"LOCPATH": "changes how the C library loads locales", "NLSPATH": "changes how the C library loads messages",
	"HOSTALIASES": "changes how names resolve", "LOCALDOMAIN": "changes how names resolve", "RES_OPTIONS": "changes how names resolve",
	"GLIBC_TUNABLES": "changes how the C library behaves", "GODEBUG": "changes how Go programs behave",
	"SSL_CERT_FILE": "changes which certificates TLS clients trust", "SSL_CERT_DIR": "changes which certificates TLS clients trust",
	"HTTP_PROXY": "changes where clients connect", "HTTPS_PROXY": "changes where clients connect",
	"ALL_PROXY": "changes where clients connect", "NO_PROXY": "changes where clients connect",
	"DOCKER_HOST": "points clients at a container engine", "DOCKER_CONTEXT": "points clients at a container engine",
	"DOCKER_CONFIG": "points clients at a container engine", "DOCKER_CERT_PATH": "points clients at a container engine",
	"DOCKER_TLS_VERIFY": "points clients at a container engine", "CONTAINER_HOST": "points clients at a container engine",
	"KUBECONFIG": "points clients at a cluster",
}

// refusedEnvPrefixes are prefixes of variables a credential may not set,
// and why.
var refusedEnvPrefixes = map[string]string{
	"LD_":         "changes how the dynamic loader behaves",
	"MALLOC_":     "changes how the C library behaves",
	"BASH_FUNC_":  "defines shell functions",
	"KUBERNETES_": "points clients at a cluster",
	"NEURON_":     "is reserved for the environment service and the operator's own settings",
}

// RefusedEnv says why a credential may not be injected as the
// environment variable name, or "".
func RefusedEnv(name string) string {
	u := strings.ToUpper(name)
	if why, ok := refusedEnvNames[u]; ok {
		return why
	}
	for p, why := range refusedEnvPrefixes {
		if strings.HasPrefix(u, p) {
			return why
		}
	}
	return ""
}

// CheckQuantities refuses, with INVALID_ARGUMENT, a quantity r sets that
// did not survive conversion to an integer in l: too large for an int64
// (it saturates, wraps negative or reads as zero, which would mean no
// limit at all). ParseLimits refuses these first; backends that convert
// quantities themselves check again.
func CheckQuantities(r *environmentv1.ResourceLimits, l Limits) error {
	for _, q := range []struct {
		field string
		set   *string
		v     int64
	}{{"cpu", r.Cpu, l.CPUMillis}, {"memory", r.Memory, l.MemoryBytes}, {"disk", r.Disk, l.DiskBytes}} {
		if q.set != nil && (q.v <= 0 || q.v == math.MaxInt64) {
			return fmt.Errorf("resources.%s %q is too large to be a limit: %w", q.field, *q.set, errs.InvalidArgument)
		}
	}
	return nil
}
