package environment

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/services/environment/scrub"
	"github.com/secbear/neuron/services/environment/workspace"
)

// Backend runs invocations in one kind of isolation. The server picks a
// backend for each request, asks it to Check the spec before anything is
// provisioned, and then Runs the invocation.
type Backend interface {
	// Name is the backend's name in RunResponse.backend, logs and errors:
	// "local", "process", "docker", "kubernetes".
	Name() string
	// Check returns nil when the backend can enforce every part of spec,
	// else an error wrapping errs.FailedPrecondition that names what it
	// cannot enforce. It must not provision anything.
	Check(spec *environmentv1.EnvironmentSpec) error
	// Run runs the invocation to its end and returns the operator's
	// output, or an error wrapping an errs kind: ResourceExhausted for a
	// limit hit (memory, processes, output), DeadlineExceeded for the
	// invocation's timeout, Retryable when the sandbox could not be
	// provisioned, Canceled when ctx was cancelled, or the status the
	// operator itself reported. It cleans up everything it provisioned,
	// whatever the outcome.
	Run(ctx context.Context, inv *Invocation) (*Result, error)
}

// ByReference is implemented by backends that hand credentials to their
// platform by name (a Kubernetes Secret) rather than by value: the server
// then does not resolve Credential.Value for them.
type ByReference interface {
	SecretsByReference() bool
}

// Invocation is one Run request, validated and resolved by the server.
type Invocation struct {
	// ID is unique per invocation and safe in file and object names
	// (lower-case letters, digits and '-', at most 40 characters).
	ID string
	// Input is the operator input; InputJSON is its protojson encoding,
	// what the one-shot operator reads.
	Input     *operatorv1.OperatorInput
	InputJSON []byte
	// Spec is the request's spec.
	Spec *environmentv1.EnvironmentSpec
	// Limits are the spec's resource limits with the service's defaults.
	Limits Limits
	// Timeout is the wall-clock limit of the whole run (always > 0).
	Timeout time.Duration
	// Network is the effective network policy (spec.network and every
	// network_policy boundary).
	Network NetworkPolicy
	// Credentials are the spec's credentials, resolved. Value is empty
	// for backends that implement ByReference.
	Credentials []Credential
	// Egress starts the invocation's egress proxy listening on a Unix
	// socket at path: it allows what Network allows and adds the sidecar
	// credentials. Nil when the invocation needs no egress at all
	// (everything denied and no sidecar credential). Call stop when the
	// run ends.
	Egress func(path string) (stop func(), err error)
	// EgressListener starts the same proxy on l, a TCP listener the
	// backend made for a sandbox on another host (a pod), requiring
	// token (egress.Config.Token) of every request. Nil when Egress is,
	// or when the service starts no proxies on TCP.
	EgressListener func(l net.Listener, token string) (stop func(), err error)
	// State serves, on a Unix socket at path, a StateService that
	// forwards Read, List and Search of the invocation's own scopes (its
	// input's session, its dispatch's workflow and agent) to the state
	// service, refuses every other scope and every write, and caps its
	// connections and streams. Nil when the service has no state service
	// configured. Call stop when the run ends.
	State func(path string) (stop func(), err error)
	// Progress, when the caller streams (RunStream), takes the
	// operator's progress events: a backend whose operator runs
	// sandboxed serves it on a socket (Progress.Serve) and gives the
	// operator its path in ProgressEnv; one that gets the events in
	// process passes them to Progress.Send. Nil for Run. A backend
	// that can do neither ignores it, and the stream carries only the
	// result.
	Progress *Progress
	// Workspace, when the spec asks for a workspace that lasts (a
	// session's or a workflow's), fills the invocation's fresh workspace
	// before the run (Load) and stores what the run left after it
	// (Save). Nil: the workspace lives and dies with the invocation.
	// Only backends that implement Persistent get one.
	Workspace *Workspace
	// Log is a logger carrying the invocation id; it scrubs the
	// invocation's injected values from every record.
	Log *slog.Logger

	scrubber *scrub.Scrubber
}

// Persistent is implemented by backends that keep workspaces across
// invocations (Invocation.Workspace); the server refuses a spec asking
// for one on any other backend.
type Persistent interface {
	PersistentWorkspaces() bool
}

// Executor is implemented by backends that run the commands of sandbox
// sessions (CreateSandbox, Exec): Exec runs argv with stdin under the
// isolation Run gives an invocation, in inv.Workspace (the session's,
// loaded before and stored after). A command that ran is a result, how
// ever it ended; an error means it could not run.
type Executor interface {
	Exec(ctx context.Context, inv *Invocation, argv []string, stdin []byte) (*ExecResult, error)
}

// ExecResult is how a sandbox command ended and what it wrote (each
// stream capped at the invocation's MaxOutputBytes).
type ExecResult struct {
	Stdout, Stderr []byte
	// Code is the exit code, -1 when a signal ended it.
	Code int
	// Signal is the signal that ended it, e.g. "SIGKILL".
	Signal string
	// TimedOut: it ran past the invocation's timeout.
	TimedOut bool
	// LimitsHit are the limits it ran into.
	LimitsHit []string
}

// WorkspaceHost is implemented by backends that keep the workspaces that
// last on their own platform (a Docker volume, a Kubernetes
// PersistentVolumeClaim) rather than in the service's store: their Run
// mounts inv.Workspace's there instead of calling Load and Save, and the
// file RPCs reach such a workspace through these methods. The server
// holds the store's Lock of the workspace around each call, as around a
// run. Names are the store's (workspace.Name); paths are checked with
// workspace.Clean by the host.
type WorkspaceHost interface {
	// HasWorkspace reports whether workspace name exists on the platform.
	HasWorkspace(ctx context.Context, name string) (bool, error)
	// ListWorkspace lists the entries under dir, as workspace.Store.List.
	ListWorkspace(ctx context.Context, name, dir string) (files []*environmentv1.WorkspaceFile, truncated bool, total uint64, err error)
	// ReadWorkspace writes regular file p of the workspace to w.
	ReadWorkspace(ctx context.Context, name, p string, w io.Writer) error
	// WriteWorkspace writes file p (creating the workspace and p's
	// directories) from r, keeping the workspace within capBytes.
	WriteWorkspace(ctx context.Context, name, p string, mode os.FileMode, r io.Reader, capBytes int64) (int64, error)
	// DeleteWorkspace removes the workspace; existed says whether there
	// was one.
	DeleteWorkspace(ctx context.Context, name string) (existed bool, err error)
}

// Workspace is the workspace that lasts of one invocation.
type Workspace struct {
	// Name is the workspace's name, e.g. "workflow-demo-1".
	Name  string
	store *workspace.Store
}

// Load copies the stored workspace into dir, the invocation's fresh
// workspace, owned by uid and gid.
func (w *Workspace) Load(dir string, uid, gid int) error {
	return w.store.CopyIn(w.Name, dir, &workspace.IDs{UID: uid, GID: gid})
}

// NewWorkspace returns workspace name of store, for a backend's tests;
// the server makes an invocation's own.
func NewWorkspace(name string, store *workspace.Store) *Workspace {
	return &Workspace{Name: name, store: store}
}

// Cap is the size cap of the workspace, in bytes.
func (w *Workspace) Cap() int64 { return w.store.Cap() }

// Save stores what the invocation left in dir, replacing the stored
// workspace whole. A workspace past its cap is not stored:
// RESOURCE_EXHAUSTED.
func (w *Workspace) Save(dir string) error {
	_, err := w.store.Commit(w.Name, dir)
	return err
}

// Credential is one resolved credential.
type Credential struct {
	// Name is the secret's name.
	Name string
	// Value is the secret; empty for ByReference backends.
	Value string
	// Injection says how it reaches the operator.
	Injection *environmentv1.CredentialInjection
}

// Limits are resource limits; zero means none (the service's defaults
// have already been applied).
type Limits struct {
	// CPUMillis is the CPU share in thousandths of a core ("500m" = 500).
	CPUMillis int64
	// MemoryBytes bounds the memory of the whole invocation.
	MemoryBytes int64
	// DiskBytes bounds the workspace's size.
	DiskBytes int64
	// GPUs is the number of GPUs asked for.
	GPUs int64
	// MaxProcesses bounds the number of live processes (or tasks).
	MaxProcesses uint32
	// MaxOutputBytes bounds the operator's output that is read back.
	MaxOutputBytes uint64
	// CPUTime bounds the CPU time of each process.
	CPUTime time.Duration
}

// Result is what a backend returns for a run that produced an output.
type Result struct {
	// Output is the operator's output.
	Output *operatorv1.OperatorOutput
	// Usage is what the run consumed, as far as the backend measures it.
	Usage *environmentv1.ResourceUsage
	// Logs is the operator's diagnostic output (stderr), possibly
	// truncated. The server scrubs it before logging it.
	Logs []byte
}
