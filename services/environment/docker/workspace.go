package docker

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"google.golang.org/protobuf/types/known/timestamppb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/workspace"
)

// Labels of a workspace's volume.
const (
	// LabelWorkspace is the workspace's name (workspace.Name), e.g.
	// "workflow-demo-1".
	LabelWorkspace = "neuron.dev/workspace"
	// LabelOwner is what owns it: "session", "workflow" or "sandbox".
	LabelOwner = "neuron.dev/workspace-owner"
	// LabelCreated is when the backend created it (RFC 3339, UTC).
	LabelCreated = "neuron.dev/created"
	// LabelHelper marks the never-started containers the file RPCs read
	// and write a volume through.
	LabelHelper = "neuron.dev/workspace-helper"
)

// volumePrefix starts the name of every workspace volume.
const volumePrefix = "neuron-ws-"

// usedDir is the directory of WorkDir holding one empty file per volume,
// whose modification time is when a run or a write last used it (a
// volume's labels cannot change after it is created).
const usedDir = "volumes"

// VolumeName is the Docker volume of workspace n: "neuron-ws-" and n,
// with the "~" of a hashed name as "_" (a volume name allows only
// letters, digits, "_", "." and "-").
func VolumeName(n string) string {
	return volumePrefix + strings.ReplaceAll(n, "~", "_")
}

// owner is the kind of owner in workspace name n ("session", ...).
func owner(n string) string {
	if i := strings.IndexAny(n, "-~"); i > 0 {
		return n[:i]
	}
	return n
}

// PersistentWorkspaces reports true: a workspace that lasts is a Docker
// volume (see Run).
func (b *Backend) PersistentWorkspaces() bool { return true }

var (
	_ environment.Persistent    = (*Backend)(nil)
	_ environment.WorkspaceHost = (*Backend)(nil)
)

// volumeLabels are the labels of workspace n's volume.
func volumeLabels(n string) map[string]string {
	return map[string]string{LabelWorkspace: n, LabelOwner: owner(n), LabelCreated: time.Now().UTC().Format(time.RFC3339)}
}

// ensureVolume creates workspace n's volume when it is missing, its
// root owned by the container's user (through a container of image),
// and marks it used now.
func (b *Backend) ensureVolume(ctx context.Context, n, image string) (string, error) {
	vol := VolumeName(n)
	_, err := b.cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{})
	switch {
	case cerrdefs.IsNotFound(err):
		if _, err := b.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol, Driver: "local", Labels: volumeLabels(n)}); err != nil {
			return "", b.engineErr(ctx, "creating the workspace's volume "+vol, err)
		}
		if err := b.chownRoot(ctx, n, image); err != nil {
			// A volume the operator cannot write is of no use.
			if _, rerr := b.cli.VolumeRemove(context.WithoutCancel(ctx), vol, client.VolumeRemoveOptions{}); rerr != nil {
				b.log.Warn("removing a workspace volume that could not be prepared", "volume", vol, "error", rerr)
			}
			return "", err
		}
	case err != nil:
		return "", b.engineErr(ctx, "inspecting the workspace's volume "+vol, err)
	}
	b.touch(vol)
	return vol, nil
}

// touch records that volume vol was used now.
func (b *Backend) touch(vol string) {
	dir := filepath.Join(b.workDir, usedDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.log.Warn("recording a workspace volume's use", "volume", vol, "error", err)
		return
	}
	p := filepath.Join(dir, vol)
	now := time.Now()
	if err := os.Chtimes(p, now, now); errors.Is(err, fs.ErrNotExist) {
		err = os.WriteFile(p, nil, 0o600)
		if err != nil {
			b.log.Warn("recording a workspace volume's use", "volume", vol, "error", err)
		}
	}
}

// lastUsed is when volume v was last used: its use record, else its
// creation.
func (b *Backend) lastUsed(name, created string) time.Time {
	var t time.Time
	if fi, err := os.Stat(filepath.Join(b.workDir, usedDir, name)); err == nil {
		t = fi.ModTime()
	}
	for _, s := range []string{created} {
		if c, err := time.Parse(time.RFC3339, s); err == nil && c.After(t) {
			t = c
		}
	}
	return t
}

// workspaceMount is the read-write mount of volume vol at the workspace.
func workspaceMount(vol, n string, readOnly bool) mount.Mount {
	return mount.Mount{
		Type: mount.TypeVolume, Source: vol, Target: Workspace, ReadOnly: readOnly,
		// Nothing of the image is copied in; a volume the engine has to
		// create on the spot gets the labels too.
		VolumeOptions: &mount.VolumeOptions{NoCopy: true, Labels: volumeLabels(n)},
	}
}

// rootTar is a tar stream of the workspace directory alone, owned by the
// container's user: extracted at "/" of a container mounting a fresh
// volume (which the engine creates root-owned) at the workspace, it
// gives the volume's root to the operator. (The engine skips a "."
// entry, so the root of the volume itself cannot be the destination.)
func rootTar() io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(Workspace, "/") + "/", Mode: 0o755, Uid: containerUID, Gid: containerGID, ModTime: time.Now()})
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

// chownRoot gives workspace n's volume's root to the container's user,
// through a container of image that mounts it and is never started. Its
// root file system is writable, which the engine needs to extract at
// "/": no process ever runs in it, and it is removed at once.
func (b *Backend) chownRoot(ctx context.Context, n, image string) error {
	created, err := b.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:       image,
			Entrypoint:  []string{b.operatorPath},
			User:        ContainerUser,
			Labels:      map[string]string{LabelHelper: n},
			Healthcheck: &container.HealthConfig{Test: []string{"NONE"}},
		},
		HostConfig: &container.HostConfig{
			NetworkMode: "none",
			CapDrop:     []string{"ALL"},
			SecurityOpt: []string{"no-new-privileges"},
			LogConfig:   container.LogConfig{Type: "none"},
			Mounts:      []mount.Mount{workspaceMount(VolumeName(n), n, false)},
		},
	})
	if err != nil {
		if ctx.Err() == nil && cerrdefs.IsNotFound(err) {
			return fmt.Errorf("image %q: no such image on the docker engine; build it with make images: %w", image, errs.FailedPrecondition)
		}
		return b.engineErr(ctx, "creating the container preparing the workspace volume", err)
	}
	defer b.remove(ctx, created.ID, b.log)
	if _, err := b.cli.CopyToContainer(ctx, created.ID, client.CopyToContainerOptions{DestinationPath: "/", Content: rootTar()}); err != nil {
		return b.engineErr(ctx, "preparing the workspace volume", err)
	}
	return nil
}

// usage sums the sizes of the regular files under the workspace of
// container id, stopping once past capBytes.
func (b *Backend) usage(ctx context.Context, id string, capBytes int64) (int64, error) {
	res, err := b.cli.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: Workspace + "/."})
	if err != nil {
		return 0, b.engineErr(ctx, "measuring the workspace", err)
	}
	defer res.Content.Close()
	tr := tar.NewReader(res.Content)
	var size int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return size, nil
		}
		if err != nil {
			return 0, fmt.Errorf("measuring the workspace: %v: %w", err, errs.Retryable)
		}
		if h.Typeflag == tar.TypeReg {
			size += h.Size
			if size > capBytes {
				return size, nil
			}
		}
	}
}

// overCap is the error of a workspace holding more than capBytes.
func overCap(n string, size, capBytes int64, when string) error {
	return fmt.Errorf("workspace %s holds more than its size cap of %d bytes (at least %d) %s; download what you need (neuron files get) and delete it (DeleteWorkspace), or raise --workspace-max-size: %w", n, capBytes, size, when, errs.ResourceExhausted)
}

// helper creates a container that is never started, mounting workspace
// n's volume (read-only unless rw), for the archive API: the file RPCs
// read and write the volume through it, and no process of the image
// ever runs. The caller removes it.
func (b *Backend) helper(ctx context.Context, n string, rw bool) (string, error) {
	if b.defaultImage == "" {
		return "", fmt.Errorf("the docker backend reaches workspace files through a container of its default image, and it has none (--default-image): %w", errs.FailedPrecondition)
	}
	created, err := b.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:       b.defaultImage,
			Entrypoint:  []string{b.operatorPath},
			User:        ContainerUser,
			Labels:      map[string]string{LabelHelper: n},
			Healthcheck: &container.HealthConfig{Test: []string{"NONE"}},
		},
		HostConfig: &container.HostConfig{
			NetworkMode:    "none",
			ReadonlyRootfs: true,
			CapDrop:        []string{"ALL"},
			SecurityOpt:    []string{"no-new-privileges"},
			LogConfig:      container.LogConfig{Type: "none"},
			Mounts:         []mount.Mount{workspaceMount(VolumeName(n), n, !rw)},
		},
	})
	if err != nil {
		if ctx.Err() == nil && cerrdefs.IsNotFound(err) {
			return "", fmt.Errorf("image %q: no such image on the docker engine; build it with make images: %w", b.defaultImage, errs.FailedPrecondition)
		}
		return "", b.engineErr(ctx, "creating the workspace's helper container", err)
	}
	return created.ID, nil
}

// HasWorkspace reports whether workspace n's volume exists.
func (b *Backend) HasWorkspace(ctx context.Context, n string) (bool, error) {
	_, err := b.cli.VolumeInspect(ctx, VolumeName(n), client.VolumeInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, b.engineErr(ctx, "inspecting the workspace's volume", err)
	}
	return true, nil
}

// withHelper runs f with a helper container of workspace n, which must
// exist unless rw, and removes the helper afterwards.
func (b *Backend) withHelper(ctx context.Context, n string, rw bool, f func(id string) error) error {
	if !rw {
		ok, err := b.HasWorkspace(ctx, n)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("workspace %s does not exist (no run has used it yet, or the retention policy removed it): %w", n, errs.NotFound)
		}
	}
	id, err := b.helper(ctx, n, rw)
	if err != nil {
		return err
	}
	defer b.remove(ctx, id, b.log)
	return f(id)
}

// stat returns what is at path p of the workspace (cleaned, relative)
// through helper id, refusing a symbolic link anywhere along it: the
// archive API resolves links within the container's root, which is not
// the workspace. Missing: fs.ErrNotExist in the error (NOT_FOUND).
func (b *Backend) stat(ctx context.Context, id, p string) (container.PathStat, error) {
	var st container.PathStat
	if p == "." {
		return st, nil
	}
	parts := strings.Split(p, "/")
	for i := range parts {
		q := strings.Join(parts[:i+1], "/")
		res, err := b.cli.ContainerStatPath(ctx, id, client.ContainerStatPathOptions{Path: Workspace + "/" + q})
		if cerrdefs.IsNotFound(err) {
			return st, fmt.Errorf("path %q does not exist in the workspace: %w", p, errs.NotFound)
		}
		if err != nil {
			return st, b.engineErr(ctx, "looking up "+q+" in the workspace", err)
		}
		st = res.Stat
		if st.Mode&fs.ModeSymlink != 0 {
			return st, fmt.Errorf("path %q: %s is a symbolic link, which the docker backend does not follow in workspace files; name its target: %w", p, q, errs.FailedPrecondition)
		}
		if i < len(parts)-1 && !st.Mode.IsDir() {
			return st, fmt.Errorf("path %q: a part of it is not a directory: %w", p, errs.FailedPrecondition)
		}
	}
	return st, nil
}

// ListWorkspace lists the entries of workspace n under dir, recursively,
// at most workspace.MaxList.
func (b *Backend) ListWorkspace(ctx context.Context, n, dir string) (files []*environmentv1.WorkspaceFile, truncated bool, total uint64, err error) {
	dir, err = workspace.Clean(dir, true)
	if err != nil {
		return nil, false, 0, err
	}
	err = b.withHelper(ctx, n, false, func(id string) error {
		st, err := b.stat(ctx, id, dir)
		if err != nil {
			return err
		}
		if dir != "." && !st.Mode.IsDir() {
			return fmt.Errorf("path %q is not a directory: %w", dir, errs.FailedPrecondition)
		}
		res, err := b.cli.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: Workspace + "/" + dir + "/."})
		if err != nil {
			return b.engineErr(ctx, "reading the workspace", err)
		}
		defer res.Content.Close()
		tr := tar.NewReader(res.Content)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("reading the workspace: %v: %w", err, errs.Retryable)
			}
			// Entries are "<base of dir>/rest"; the first is dir itself.
			rel := strings.TrimSuffix(h.Name, "/")
			_, rest, ok := strings.Cut(rel, "/")
			if !ok || rest == "" || !filepath.IsLocal(rest) {
				continue
			}
			p := rest
			if dir != "." {
				p = path.Join(dir, rest)
			}
			f := &environmentv1.WorkspaceFile{Path: p, Mode: uint32(h.FileInfo().Mode().Perm()), Modified: timestamppb.New(h.ModTime)}
			switch h.Typeflag {
			case tar.TypeDir:
				f.Directory = true
			case tar.TypeSymlink:
				f.Symlink, f.Target = true, h.Linkname
			case tar.TypeReg:
				f.Size = uint64(h.Size)
				total += f.Size
			default:
				continue
			}
			if len(files) == workspace.MaxList {
				truncated = true
				return nil
			}
			files = append(files, f)
		}
	})
	if err != nil {
		return nil, false, 0, err
	}
	return files, truncated, total, nil
}

// ReadWorkspace writes regular file p of workspace n to w.
func (b *Backend) ReadWorkspace(ctx context.Context, n, p string, w io.Writer) error {
	p, err := workspace.Clean(p, false)
	if err != nil {
		return err
	}
	return b.withHelper(ctx, n, false, func(id string) error {
		st, err := b.stat(ctx, id, p)
		if err != nil {
			return err
		}
		if !st.Mode.IsRegular() {
			return fmt.Errorf("path %q is not a regular file: %w", p, errs.FailedPrecondition)
		}
		res, err := b.cli.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: Workspace + "/" + p})
		if err != nil {
			return b.engineErr(ctx, "reading "+p, err)
		}
		defer res.Content.Close()
		tr := tar.NewReader(res.Content)
		h, err := tr.Next()
		if err != nil || h.Typeflag != tar.TypeReg {
			return fmt.Errorf("reading %s: the docker engine returned no regular file: %w", p, errs.Retryable)
		}
		if _, err := io.Copy(w, tr); err != nil {
			return fmt.Errorf("reading %s: %w", p, err)
		}
		return nil
	})
}

// WriteWorkspace writes file p of workspace n (creating the volume and
// p's directories, owned by the container's user) from r. The upload is
// spooled to the work directory first, to learn its size for the tar
// header and to refuse one that would take the workspace past capBytes.
// The engine extracts it in place: unlike the process backend's, a file
// the write replaces can be seen half written by a reader.
func (b *Backend) WriteWorkspace(ctx context.Context, n, p string, mode os.FileMode, r io.Reader, capBytes int64) (int64, error) {
	p, err := workspace.Clean(p, false)
	if err != nil {
		return 0, err
	}
	if mode == 0 {
		mode = 0o644
	}
	if b.defaultImage == "" {
		return 0, fmt.Errorf("the docker backend reaches workspace files through a container of its default image, and it has none (--default-image): %w", errs.FailedPrecondition)
	}
	vol, err := b.ensureVolume(ctx, n, b.defaultImage)
	if err != nil {
		return 0, err
	}
	var written int64
	err = b.withHelper(ctx, n, true, func(id string) error {
		// Every existing part of p: a directory, no link; p itself a
		// regular file if it exists.
		var missing []string
		parts := strings.Split(p, "/")
		var old int64
		for i := range parts {
			q := strings.Join(parts[:i+1], "/")
			st, err := b.stat(ctx, id, q)
			if errors.Is(err, errs.NotFound) {
				missing = parts[i:]
				break
			}
			if err != nil {
				return err
			}
			if i == len(parts)-1 {
				if !st.Mode.IsRegular() {
					return fmt.Errorf("path %q exists and is not a regular file: %w", p, errs.FailedPrecondition)
				}
				old = st.Size
			}
		}
		used, err := b.usage(ctx, id, capBytes)
		if err != nil {
			return err
		}
		room := capBytes - (used - old)
		spool, err := os.CreateTemp(b.workDir, "upload")
		if err != nil {
			return fmt.Errorf("spooling the upload: %v: %w", err, errs.Internal)
		}
		defer os.Remove(spool.Name())
		defer spool.Close()
		written, err = io.Copy(spool, io.LimitReader(r, max(room, 0)+1))
		if err != nil {
			return err
		}
		if written > room {
			return fmt.Errorf("writing %s would take workspace %s past its size cap of %d bytes (%d in use): %w", p, n, capBytes, used, errs.ResourceExhausted)
		}
		if _, err := spool.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("spooling the upload: %v: %w", err, errs.Internal)
		}
		pr, pw := io.Pipe()
		go func() {
			tw := tar.NewWriter(pw)
			var err error
			// Missing directories first, then the file.
			for i := range len(missing) - 1 {
				d := strings.Join(parts[:len(parts)-len(missing)+i+1], "/")
				if err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, Uid: containerUID, Gid: containerGID, ModTime: time.Now()}); err != nil {
					break
				}
			}
			if err == nil {
				err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Size: written, Mode: int64(mode.Perm()), Uid: containerUID, Gid: containerGID, ModTime: time.Now()})
			}
			if err == nil {
				_, err = io.Copy(tw, spool)
			}
			if err == nil {
				err = tw.Close()
			}
			pw.CloseWithError(err)
		}()
		if _, err := b.cli.CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: Workspace, Content: pr}); err != nil {
			pr.CloseWithError(err)
			return b.engineErr(ctx, "writing "+p, err)
		}
		return nil
	})
	b.touch(vol)
	if err != nil {
		return 0, err
	}
	return written, nil
}

// DeleteWorkspace removes workspace n's volume; one in use by a run is
// refused with UNAVAILABLE.
func (b *Backend) DeleteWorkspace(ctx context.Context, n string) (bool, error) {
	vol := VolumeName(n)
	_, err := b.cli.VolumeRemove(ctx, vol, client.VolumeRemoveOptions{})
	switch {
	case cerrdefs.IsNotFound(err):
		return false, nil
	case cerrdefs.IsConflict(err):
		return true, fmt.Errorf("workspace %s's volume is in use by a container; retry once its run has ended: %w", n, errs.Unavailable)
	case err != nil:
		return false, b.engineErr(ctx, "removing the workspace's volume", err)
	}
	_ = os.Remove(filepath.Join(b.workDir, usedDir, vol))
	return true, nil
}

// SweepWorkspaces removes the workspace volumes not used for retention
// (none when it is zero) and says how many; a volume a container uses is
// skipped (the engine refuses to remove it).
func (b *Backend) SweepWorkspaces(ctx context.Context, now time.Time, retention time.Duration) int {
	if retention <= 0 {
		return 0
	}
	res, err := b.cli.VolumeList(ctx, client.VolumeListOptions{Filters: make(client.Filters).Add("label", LabelWorkspace)})
	if err != nil {
		b.log.Warn("listing workspace volumes for the retention policy", "error", err)
		return 0
	}
	removed := 0
	for _, v := range res.Items {
		if !strings.HasPrefix(v.Name, volumePrefix) {
			continue
		}
		last := b.lastUsed(v.Name, v.Labels[LabelCreated])
		if now.Sub(last) < retention {
			continue
		}
		if _, err := b.cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{}); err != nil {
			if !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
				b.log.Warn("removing a workspace volume for the retention policy", "volume", v.Name, "error", err)
			}
			continue
		}
		_ = os.Remove(filepath.Join(b.workDir, usedDir, v.Name))
		removed++
		b.log.Info("workspace volume removed by the retention policy", "volume", v.Name, "workspace", v.Labels[LabelWorkspace], "unused_since", last.UTC().Format(time.RFC3339), "retention", retention.String())
	}
	return removed
}

// RunRetention sweeps every interval until ctx ends.
func (b *Backend) RunRetention(ctx context.Context, retention, interval time.Duration) {
	workspace.RunRetention(ctx, retention, interval, func(now time.Time) { b.SweepWorkspaces(ctx, now, retention) })
}
