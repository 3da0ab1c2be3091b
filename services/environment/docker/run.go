package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// Sizes of the container's fixed tmpfs mounts, in bytes; the workspace's
// is the invocation's disk limit. All count against the memory limit.
const (
	tmpSize = 64 << 20
	shmSize = 32 << 20
)

// maxOutputBytes bounds the operator's stdout held in memory whatever
// the limits say (the process backend's bound too).
const maxOutputBytes = 1 << 30

// maxLogBytes bounds the stderr kept as Result.Logs (its end is kept).
const maxLogBytes = 1 << 20

// Bounds of the engine calls made after the run, whatever ctx says.
const (
	killTimeout    = 10 * time.Second
	inspectTimeout = 10 * time.Second
	// oomEventWait bounds how long a SIGKILL exit under a memory limit
	// waits for the engine to record the OOM kill.
	oomEventWait  = 2 * time.Second
	removeTimeout = 30 * time.Second
)

// limitMemory names the memory limit in ResourceUsage.limits_hit.
const limitMemory = "memory"

// exitSIGKILL is the exit status of a process killed by SIGKILL.
const exitSIGKILL = 128 + 9

// Run runs inv's operator in a new container and returns its output. See
// environment.Backend for the errors; in short: FAILED_PRECONDITION for a
// spec it cannot enforce or an image the engine does not have,
// RESOURCE_EXHAUSTED for the memory, CPU time and output limits,
// DEADLINE_EXCEEDED for inv.Timeout, CANCELED when ctx ends, UNAVAILABLE
// (Retryable) when the engine fails, and the operator's own status. The
// container, its per-invocation directory and the egress proxy are gone
// when Run returns.
func (b *Backend) Run(ctx context.Context, inv *environment.Invocation) (*environment.Result, error) {
	if err := b.Check(inv.Spec); err != nil {
		return nil, err
	}
	// The service's defaults may set what the spec did not, and the
	// backend's own fill in what neither set.
	lim := b.limits(inv.Limits)
	if err := checkLimits(lim); err != nil {
		return nil, err
	}
	if err := b.checkCredentials(inv.Credentials); err != nil {
		return nil, err
	}
	withLimits := *inv
	withLimits.Limits = lim
	inv = &withLimits
	log := inv.Log
	if log == nil {
		log = b.log.With("invocation", inv.ID)
	}

	dir, err := os.MkdirTemp(b.workDir, invDirPattern)
	if err != nil {
		return nil, fmt.Errorf("creating the invocation's directory: %v: %w", err, errs.Retryable)
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("could not remove the invocation's directory", "dir", dir, "error", err)
		}
	}()

	args := slices.Clone(b.operatorArgs)
	var mounts []mount.Mount
	if inv.Egress != nil {
		m, stop, err := startSocket(dir, "egress", EgressSocket, "the egress proxy", inv.Egress)
		if err != nil {
			return nil, err
		}
		defer stop()
		mounts = append(mounts, m)
		args = append(args, "--egress-proxy", "unix://"+EgressSocket)
	}
	if inv.State != nil {
		m, stop, err := startSocket(dir, "state", StateSocket, "the state bridge", inv.State)
		if err != nil {
			return nil, err
		}
		defer stop()
		mounts = append(mounts, m)
		// Plaintext over a socket only this invocation's container sees.
		args = append(args, "--state-addr", "unix://"+StateSocket, "--plaintext")
	}
	env := environment.CredentialEnv(inv.Credentials)
	if inv.Progress != nil {
		// RunStream: the operator writes its progress events to a
		// socket of their own (environment.ProgressEnv).
		m, stop, err := startSocket(dir, "progress", ProgressSocket, "the progress socket", inv.Progress.Serve)
		if err != nil {
			return nil, err
		}
		defer stop()
		mounts = append(mounts, m)
		env = append(env, environment.ProgressEnv+"="+ProgressSocket)
	}
	args = append(args, "--workspace", Workspace)
	args = append(args, environment.OneShotArgs()...)
	fm, err := writeFileCredentials(dir, inv.Credentials)
	if err != nil {
		return nil, err
	}
	mounts = append(mounts, fm...)
	// A workspace that lasts is a named volume at the workspace, in
	// place of the tmpfs.
	tmpfs := map[string]string{
		Workspace: workspaceOptions(inv.Limits.DiskBytes),
		"/tmp":    tmpfsOptions(tmpSize),
	}
	var vol string
	image := b.image(inv.Spec)
	if inv.Workspace != nil {
		if vol, err = b.ensureVolume(ctx, inv.Workspace.Name, image); err != nil {
			return nil, err
		}
		defer b.touch(vol)
		delete(tmpfs, Workspace)
		mounts = append(mounts, workspaceMount(vol, inv.Workspace.Name, false))
	}

	created, err := b.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: "neuron-" + inv.ID,
		Config: &container.Config{
			Image:        image,
			Entrypoint:   []string{b.operatorPath},
			Cmd:          args,
			Env:          env,
			User:         ContainerUser,
			WorkingDir:   Workspace,
			AttachStdin:  true,
			AttachStdout: true,
			AttachStderr: true,
			OpenStdin:    true,
			StdinOnce:    true,
			Labels:       map[string]string{LabelInvocation: inv.ID},
			// An image's HEALTHCHECK would run commands in the
			// container that the backend never asked for.
			Healthcheck: &container.HealthConfig{Test: []string{"NONE"}},
		},
		HostConfig: b.hostConfig(inv, tmpfs, mounts),
	})
	if err != nil {
		if ctx.Err() == nil && cerrdefs.IsNotFound(err) {
			return nil, fmt.Errorf("image %q: no such image on the docker engine; build it with make images: %w", image, errs.FailedPrecondition)
		}
		return nil, b.engineErr(ctx, "creating the container", err)
	}
	defer b.remove(ctx, created.ID, log)
	for _, w := range created.Warnings {
		// E.g. a kernel without swap accounting, where the swap limit
		// is not enforced.
		log.Warn("the docker engine warned about the container", "warning", w)
	}
	if err := b.verify(ctx, created.ID, image, mounts, vol); err != nil {
		return nil, err
	}
	if vol != "" {
		// A workspace left past its cap runs no more.
		capBytes := inv.Workspace.Cap()
		if size, err := b.usage(ctx, created.ID, capBytes); err != nil {
			return nil, err
		} else if size > capBytes {
			return nil, overCap(inv.Workspace.Name, size, capBytes, "before the run")
		}
	}
	if b.afterCreate != nil {
		b.afterCreate(ctx, created.ID)
	}
	res, err := b.run(ctx, inv, created.ID, log)
	if err == nil && vol != "" {
		// The volume is bounded only by the host's disk during the run;
		// a run that leaves it past the cap fails, and the workspace
		// runs no more until it is deleted.
		capBytes := inv.Workspace.Cap()
		if size, err := b.usage(context.WithoutCancel(ctx), created.ID, capBytes); err != nil {
			return nil, err
		} else if size > capBytes {
			return nil, overCap(inv.Workspace.Name, size, capBytes, "after the run; its output was discarded")
		}
	}
	return res, err
}

// run attaches to the created container, starts it, feeds it the input
// and collects its output until it exits or a limit ends it.
func (b *Backend) run(ctx context.Context, inv *environment.Invocation, id string, log *slog.Logger) (*environment.Result, error) {
	att, err := b.cli.ContainerAttach(ctx, id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return nil, b.engineErr(ctx, "attaching to the container", err)
	}
	defer att.Close()

	// The wait is registered before the start, so the exit cannot be
	// missed; it ends when Run returns, not when ctx does (Run kills the
	// container first).
	waitCtx, cancelWait := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWait()
	wait := b.cli.ContainerWait(waitCtx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNextExit})

	if _, err := b.cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		return nil, b.engineErr(ctx, "starting the container", err)
	}

	// A container that exits without reading its input fails the write;
	// its exit status says why, so the write error is only logged.
	go func() {
		if _, err := att.Conn.Write(inv.InputJSON); err != nil {
			log.Debug("writing the operator input", "error", err)
			return
		}
		if err := att.CloseWrite(); err != nil {
			log.Debug("closing the operator's stdin", "error", err)
		}
	}()

	stdout := &cappedBuffer{max: inv.Limits.MaxOutputBytes}
	stderr := &tailBuffer{max: maxLogBytes}
	copied := make(chan error, 1)
	go func() {
		_, err := stdcopy.StdCopy(stdout, stderr, att.Reader)
		copied <- err
	}()

	timer := time.NewTimer(inv.Timeout)
	defer timer.Stop()
	var exit *container.WaitResponse
	waitResult, waitErr := wait.Result, wait.Error
	for exit == nil || copied != nil {
		select {
		case <-ctx.Done():
			b.kill(ctx, id, log)
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("the request's deadline passed before the operator finished; its container was killed: %w", errs.DeadlineExceeded)
			}
			return nil, fmt.Errorf("the invocation was cancelled; its container was killed: %w", errs.Canceled)
		case <-timer.C:
			b.kill(ctx, id, log)
			return nil, fmt.Errorf("the invocation ran past its timeout of %v; its container was killed: %w", inv.Timeout, errs.DeadlineExceeded)
		case err := <-copied:
			copied = nil
			if errors.Is(err, errOutputLimit) {
				b.kill(ctx, id, log)
				return nil, fmt.Errorf("the operator wrote more than max_output_bytes (%d bytes) on stdout; its container was killed: %w", inv.Limits.MaxOutputBytes, errs.ResourceExhausted)
			}
			if err != nil {
				// The exit status still decides; a torn stream shows as
				// an undecodable output.
				log.Warn("reading the container's output", "error", err)
			}
		case r := <-waitResult:
			exit = &r
			waitResult, waitErr = nil, nil
		case err := <-waitErr:
			return nil, b.engineErr(ctx, "waiting for the container", err)
		}
	}
	if exit.Error != nil && exit.Error.Message != "" {
		return nil, fmt.Errorf("waiting for the container: the docker engine at %s reported %q: %w", b.host, exit.Error.Message, errs.Retryable)
	}
	code := int(exit.StatusCode)
	logs := stderr.Bytes()
	usage := &environmentv1.ResourceUsage{}
	// Only the kernel sends SIGKILL to a container's init from inside;
	// the engine records an OOM kill from a separate event, which can
	// land after the exit, so a SIGKILL exit under a memory limit waits
	// a moment for it.
	oom := b.oomKilled(ctx, id, code == exitSIGKILL && inv.Limits.MemoryBytes > 0, log)
	if oom {
		usage.LimitsHit = append(usage.LimitsHit, limitMemory)
	}
	out, err := environment.DecodeOutput(stdout.Bytes(), logs, code)
	if err != nil {
		switch {
		case oom:
			return nil, fmt.Errorf("memory limit reached: the operator was killed at its limit of %d bytes; raise resources.memory: %w", inv.Limits.MemoryBytes, errs.ResourceExhausted)
		case code == exitSIGKILL && inv.Limits.CPUTime > 0:
			return nil, fmt.Errorf("CPU time limit reached: the operator was killed (SIGKILL) with a CPU time limit of %v per process; raise resources.cpu_time: %w", inv.Limits.CPUTime, errs.ResourceExhausted)
		case code == exitSIGKILL && inv.Limits.MemoryBytes > 0:
			// Nothing else inside the container can SIGKILL its init.
			return nil, fmt.Errorf("memory limit reached: the operator was killed (SIGKILL) under its limit of %d bytes, which the engine did not confirm as an OOM kill; raise resources.memory: %w", inv.Limits.MemoryBytes, errs.ResourceExhausted)
		}
		return nil, err
	}
	return &environment.Result{Output: out, Usage: usage, Logs: logs}, nil
}

// hostConfig is the isolation of every container that runs the
// invocation's code (a run's, a sandbox session's): no network, a
// read-only root, no privilege or capability, namespaces of its own,
// the invocation's limits, and only tmpfs and mounts writable.
func (b *Backend) hostConfig(inv *environment.Invocation, tmpfs map[string]string, mounts []mount.Mount) *container.HostConfig {
	return &container.HostConfig{
		NetworkMode:    "none",
		ReadonlyRootfs: true,
		// The only writable places, each of a fixed size: the
		// workspace holds at most the disk limit (a workspace
		// volume: its cap, checked before and after the run).
		Tmpfs:       tmpfs,
		ShmSize:     shmSize,
		Mounts:      mounts,
		Privileged:  false,
		CapDrop:     []string{"ALL"},
		SecurityOpt: []string{"no-new-privileges"},
		// Namespaces of its own, whatever the engine's defaults.
		IpcMode:      container.IPCModePrivate,
		CgroupnsMode: container.CgroupnsModePrivate,
		// Output travels over the attach stream only; the engine
		// keeps no copy of it.
		LogConfig: container.LogConfig{Type: "none"},
		Runtime:   b.runtimeFor(inv.Spec),
		Resources: resources(inv.Limits),
	}
}

// limits returns l with the backend's defaults in each zero (or, from an
// overflowing quantity, negative) CPU, memory, process, disk and output
// limit, and the output limit at most maxOutputBytes.
func (b *Backend) limits(l environment.Limits) environment.Limits {
	if l.CPUMillis <= 0 {
		l.CPUMillis = b.defaults.CPUMillis
	}
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = b.defaults.MemoryBytes
	}
	if l.DiskBytes <= 0 {
		l.DiskBytes = b.defaults.DiskBytes
	}
	if l.MaxProcesses == 0 {
		l.MaxProcesses = b.defaults.MaxProcesses
	}
	if l.MaxOutputBytes == 0 {
		l.MaxOutputBytes = b.defaults.MaxOutputBytes
	}
	l.MaxOutputBytes = min(l.MaxOutputBytes, maxOutputBytes)
	return l
}

// tmpfsOptions are the options of a tmpfs of size bytes anyone may
// write to.
func tmpfsOptions(size int64) string {
	return "rw,nosuid,nodev,size=" + strconv.FormatInt(size, 10) + ",mode=1777"
}

// workspaceOptions are the options of the workspace's tmpfs of size
// bytes, owned by the container's user: the engine creates the working
// directory beneath it as root, mode 0755, and the runtime gives the
// tmpfs that mode, so a mode option alone would leave the operator a
// workspace it cannot write.
func workspaceOptions(size int64) string {
	return "rw,nosuid,nodev,size=" + strconv.FormatInt(size, 10) + ",uid=" + strconv.Itoa(containerUID) + ",gid=" + strconv.Itoa(containerGID) + ",mode=0755"
}

// verify inspects the created container and refuses to start it, with
// FAILED_PRECONDITION, when the engine gave it more than the backend
// asked for: a volume (an image's VOLUME is a writable directory on the
// host's disk, beside the read-only root and outside the disk limit), a
// mount the backend did not make or made read-only, or a host
// namespace, privileges or capabilities from the engine's defaults. vol,
// when not empty, is the workspace volume the backend mounted itself.
func (b *Backend) verify(ctx context.Context, id, image string, want []mount.Mount, vol string) error {
	ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	res, err := b.cli.ContainerInspect(ictx, id, client.ContainerInspectOptions{})
	if err != nil {
		return b.engineErr(ctx, "inspecting the created container", err)
	}
	c := res.Container
	ours := map[string]bool{}
	for _, m := range want {
		ours[m.Target] = true
	}
	for _, m := range c.Mounts {
		switch {
		case vol != "" && m.Type == mount.TypeVolume && m.Name == vol && m.Destination == Workspace:
			// The workspace's own volume.
		case m.Type == mount.TypeVolume:
			return fmt.Errorf("image %q declares a volume at %s (VOLUME), which the docker engine would create as a writable directory on the host's disk, outside the read-only root and the disk limit; build the image without VOLUME: %w", image, m.Destination, errs.FailedPrecondition)
		case m.Type != mount.TypeBind || !ours[m.Destination] || m.RW:
			return fmt.Errorf("the docker engine gave the container a %s mount at %s (writable %v) the backend did not ask for: %w", m.Type, m.Destination, m.RW, errs.FailedPrecondition)
		}
	}
	hc := c.HostConfig
	if hc == nil {
		return fmt.Errorf("the docker engine reported no host configuration for the container: %w", errs.FailedPrecondition)
	}
	var extra []string
	if hc.Privileged {
		extra = append(extra, "privileged")
	}
	if len(hc.CapAdd) > 0 {
		extra = append(extra, "capabilities "+strings.Join(hc.CapAdd, ","))
	}
	if string(hc.NetworkMode) != "none" {
		extra = append(extra, "network "+string(hc.NetworkMode))
	}
	if !hc.ReadonlyRootfs {
		extra = append(extra, "a writable root")
	}
	if hc.PidMode.IsHost() || hc.IpcMode.IsHost() || hc.UTSMode.IsHost() || hc.UsernsMode.IsHost() || hc.CgroupnsMode.IsHost() {
		extra = append(extra, "a host namespace")
	}
	if len(hc.Devices) > 0 || len(hc.DeviceRequests) > 0 || len(hc.DeviceCgroupRules) > 0 {
		extra = append(extra, "devices")
	}
	for _, o := range hc.SecurityOpt {
		if strings.HasSuffix(o, "unconfined") {
			extra = append(extra, o)
		}
	}
	if len(extra) > 0 {
		return fmt.Errorf("the docker engine created the container with %s, which the backend did not ask for; check the engine's defaults (daemon.json): %w", strings.Join(extra, ", "), errs.FailedPrecondition)
	}
	return nil
}

// resources maps the invocation's limits to the container's cgroup and
// rlimit settings. Swap is never allowed beyond the memory limit.
func resources(l environment.Limits) container.Resources {
	var r container.Resources
	if l.MemoryBytes > 0 {
		r.Memory = l.MemoryBytes
		r.MemorySwap = l.MemoryBytes
	}
	if l.CPUMillis > 0 {
		r.NanoCPUs = l.CPUMillis * 1_000_000
	}
	if l.MaxProcesses > 0 {
		n := int64(l.MaxProcesses)
		r.PidsLimit = &n
	}
	if l.CPUTime > 0 {
		// RLIMIT_CPU is in whole seconds. Soft and hard are equal: Go
		// ignores SIGXCPU, so the hard limit's SIGKILL is what stops it.
		s := int64(math.Ceil(l.CPUTime.Seconds()))
		r.Ulimits = []*container.Ulimit{{Name: "cpu", Soft: s, Hard: s}}
	}
	return r
}

// startSocket starts a per-invocation server (what: the egress proxy or
// the state bridge) on a socket in <dir>/<sub>, connectable by the
// container's user, and returns the read-only bind mount of that socket
// file at target in the container.
func startSocket(dir, sub, target, what string, start func(path string) (func(), error)) (mount.Mount, func(), error) {
	hostDir := filepath.Join(dir, sub)
	if err := os.Mkdir(hostDir, 0o755); err != nil {
		return mount.Mount{}, nil, fmt.Errorf("creating the directory of %s's socket: %v: %w", what, err, errs.Retryable)
	}
	// Mkdir's mode is filtered by the umask.
	if err := os.Chmod(hostDir, 0o755); err != nil {
		return mount.Mount{}, nil, fmt.Errorf("creating the directory of %s's socket: %v: %w", what, err, errs.Retryable)
	}
	sock := filepath.Join(hostDir, filepath.Base(target))
	stop, err := start(sock)
	if err != nil {
		var k *errs.Kind
		if errors.As(err, &k) {
			return mount.Mount{}, nil, fmt.Errorf("starting %s: %w", what, err)
		}
		return mount.Mount{}, nil, fmt.Errorf("starting %s: %v: %w", what, err, errs.Retryable)
	}
	// Connecting to a Unix socket needs write permission on it. Only the
	// container's user can reach it: the invocation's directory is
	// private to the service on the host.
	if err := os.Chmod(sock, 0o666); err != nil {
		stop()
		return mount.Mount{}, nil, fmt.Errorf("making %s's socket usable by the operator: %v: %w", what, err, errs.Retryable)
	}
	// The socket alone, read-only (connecting needs no writable mount):
	// nothing else of the host directory reaches the container.
	return mount.Mount{Type: mount.TypeBind, Source: sock, Target: target, ReadOnly: true}, stop, nil
}

// writeFileCredentials writes each file credential to a file under
// <dir>/credentials, mode 0400 and owned by the container's user, and
// returns the read-only bind mounts putting them at their paths. When the
// service may not chown (it does not run as root), the files are 0444
// instead; the directory holding them stays private to the service.
func writeFileCredentials(dir string, creds []environment.Credential) ([]mount.Mount, error) {
	var mounts []mount.Mount
	cd := filepath.Join(dir, "credentials")
	for i, c := range creds {
		f := c.Injection.GetFile()
		if f == nil {
			continue
		}
		if len(mounts) == 0 {
			if err := os.Mkdir(cd, 0o700); err != nil {
				return nil, fmt.Errorf("creating the credentials directory: %v: %w", err, errs.Retryable)
			}
		}
		host := filepath.Join(cd, strconv.Itoa(i))
		if err := os.WriteFile(host, []byte(c.Value), 0o400); err != nil {
			return nil, fmt.Errorf("writing credential %s: %v: %w", c.Name, err, errs.Retryable)
		}
		if err := os.Chown(host, containerUID, containerGID); err != nil {
			if err := os.Chmod(host, 0o444); err != nil {
				return nil, fmt.Errorf("writing credential %s: %v: %w", c.Name, err, errs.Retryable)
			}
		}
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: host, Target: f.GetPath(), ReadOnly: true})
	}
	return mounts, nil
}

// oomKilled reports whether the engine saw the container's memory limit
// kill a process of it; false when it cannot tell. With await, it asks
// again for up to oomEventWait: the engine learns of the OOM kill from
// an event of its own that may arrive after the exit.
func (b *Backend) oomKilled(ctx context.Context, id string, await bool, log *slog.Logger) bool {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), inspectTimeout)
	defer cancel()
	deadline := time.Now().Add(oomEventWait)
	for {
		res, err := b.cli.ContainerInspect(ictx, id, client.ContainerInspectOptions{})
		if err != nil {
			log.Warn("inspecting the exited container", "container", id, "error", err)
			return false
		}
		if res.Container.State != nil && res.Container.State.OOMKilled {
			return true
		}
		if !await || time.Now().After(deadline) {
			return false
		}
		select {
		case <-ictx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL to the container, with a fresh bounded context.
func (b *Backend) kill(ctx context.Context, id string, log *slog.Logger) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	defer cancel()
	if _, err := b.cli.ContainerKill(kctx, id, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		// It may have exited already; the removal that follows kills it
		// anyway.
		log.Debug("killing the container", "container", id, "error", err)
	}
}

// remove force-removes the container, with a fresh bounded context.
func (b *Backend) remove(ctx context.Context, id string, log *slog.Logger) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	if _, err := b.cli.ContainerRemove(rctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
		log.Error("could not remove the container; remove it by hand", "container", id, "error", err)
	}
}

// engineErr classifies an engine call's failure: CANCELED or
// DEADLINE_EXCEEDED when ctx ended, FAILED_PRECONDITION when the engine
// refused the request (a bad runtime, a limit out of its range), else
// UNAVAILABLE (Retryable): the engine is down or failed.
func (b *Backend) engineErr(ctx context.Context, what string, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("%s: the request's deadline passed: %w", what, errs.DeadlineExceeded)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", what, errs.Canceled)
	case cerrdefs.IsInvalidArgument(err) || cerrdefs.IsConflict(err):
		return fmt.Errorf("%s: the docker engine refused it: %v: %w", what, err, errs.FailedPrecondition)
	case client.IsErrConnectionFailed(err):
		return fmt.Errorf("%s: the docker engine at %s is unreachable: %v: %w", what, b.host, err, errs.Retryable)
	default:
		return fmt.Errorf("%s: the docker engine at %s failed: %v: %w", what, b.host, err, errs.Retryable)
	}
}
