// Package kubernetes is the environment service's Kubernetes backend: it
// runs each invocation as one Job in a configured namespace, through
// client-go's REST client (Client: only the core, batch and networking
// API groups are linked in).
//
// For an invocation with id ID it creates, in this order:
//
//   - a NetworkPolicy neuron-inv-ID selecting the pod by the label
//     neuron.dev/invocation=ID: no ingress, and egress only to what the
//     invocation's network policy allows (see below);
//   - a Secret neuron-inv-ID holding input.json, the OperatorInput,
//     mounted read-only at /input;
//   - a Job neuron-inv-ID: one pod, never retried, with the invocation's
//     timeout as activeDeadlineSeconds, running the operator binary in
//     one-shot mode as user 65532 with a read-only root, no capabilities,
//     the RuntimeDefault seccomp profile, no service-account token, no
//     host namespace or hostPath, requests equal to limits (CPU, memory
//     and ephemeral storage, the invocation's disk limit), emptyDirs at
//     /workspace (sizeLimit: the disk limit) and /tmp, and HOME and
//     TMPDIR set to /tmp. CPU, memory, disk and output that neither the
//     spec nor the service's defaults bound take Config.DefaultLimits
//     (1 core, 2 GiB, 1 GiB, 16 MiB), so every pod has limits; the log
//     read back is bounded by 1 GiB whatever they say.
//
// The Secret and NetworkPolicy are then owned by the Job, so the garbage
// collector removes them if the backend dies, but the backend deletes all
// three itself when the run ends, whatever the outcome.
//
// It waits for the Job to finish (a watch, with polling as fallback),
// then reads the pod's log, in which Kubernetes merges the operator's
// stdout and stderr: the output is the last line that decodes strictly as
// an OperatorOutput (or, for a failure exit code, a google.rpc.Status);
// the operator's JSON log lines do not. resources.max_output_bytes bounds
// that whole log. A container that cannot start because its spec names
// something missing (a credential's Secret or key, an invalid image name)
// fails the run at once with FAILED_PRECONDITION instead of waiting for
// the timeout.
//
// Credentials are passed by reference (the backend implements
// environment.ByReference): a credential named "s" or "s/key" is key
// "key" (default Config.SecretKey) of the Secret "s" in the namespace.
// env_var credentials become secretKeyRef variables; file credentials a
// Secret volume item mounted with subPath at the requested path. The
// backend's own input Secrets (neuron-inv-...) are refused, and so is any
// Secret outside Config.CredentialSecrets when that is set (NOT_FOUND):
// without it a spec may name any Secret of the namespace. As in the docker
// backend, credentials placed where they would change how the container
// behaves are refused (guard.go): files over system directories, under
// /proc, /sys or /dev, over files the kubelet manages, the loader's
// configuration, the user database or the trusted certificates;
// variables read by the loader, a shell, proxy-aware, container or
// cluster clients, or the service (LD_*, PATH, HOME, HTTPS_PROXY,
// KUBERNETES_*, NEURON_*, ...). So are images that are not a single
// reference and quantities too large for an int64 (INVALID_ARGUMENT).
//
// # Network policy
//
// A NetworkPolicy matches IP blocks and ports only, and is a union of
// allow rules, while the invocation's policy is an ordered first-match
// list. Each allow rule becomes one egress rule whose ipBlock excepts the
// earlier deny rules inside its prefix; an allow rule inside an earlier
// deny (for the same ports) is dropped; a default allow is an allow of
// 0.0.0.0/0 and ::/0 after every rule. A port-specific deny that
// overlaps an earlier-unmatched all-ports allow cannot be expressed (an
// ipBlock cannot except one port) and is refused by Check, as are rules
// naming domains. The cloud metadata addresses (169.254.169.254,
// 100.100.100.200, fd00:ec2::254) are excepted from every allow rule, as
// the egress proxy refuses them, and a rule allowing only them is
// refused. Rules with a port allow that port over TCP and UDP.
// Nothing else, not even DNS, is allowed: allow the cluster's DNS
// service's address to resolve names.
//
// Not enforced here, so refused when a spec sets them explicitly:
// resources.max_processes (the kubelet's pod PID limit applies) and
// resources.cpu_time. Sidecar credentials are refused: there is no
// in-cluster egress proxy yet.
//
// A workspace that lasts (a session's or a workflow's) is a
// PersistentVolumeClaim (workspace.go) of the workspace's size cap and
// Config.WorkspaceStorageClass, mounted at the workspace of each run's
// pod instead of the emptyDir, and kept after the Job; the retention
// sweep deletes claims unused for the retention (annotation
// neuron.dev/last-used). Its files are not reachable through the file
// RPCs (FAILED_PRECONDITION).
//
// attack_test.go holds the attack tests: hostile specs refused before any
// API call, the hostile Job checked field by field, and, on a real API
// server, the pod admitted by the restricted Pod Security Standard.
package kubernetes
