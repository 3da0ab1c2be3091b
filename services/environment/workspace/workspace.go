// Package workspace keeps the environment service's workspaces that last
// across invocations: one per session or per workflow (WorkspaceSpec of
// layer0.environment.v1), stored on the service's disk under
// --data-dir/workspaces, one directory each.
//
// A backend does not run an invocation in that directory: it gives the
// invocation its usual size-capped workspace, copies the stored one into
// it before the run (CopyIn) and stores what the run left after it
// (Commit), so the cap holds during the run and the stored copy is
// replaced whole (an atomic exchange of directories), never half
// written. Runs and writes of one workspace take turns (Lock).
//
// Nothing the sandbox left is trusted: every path is resolved through
// os.Root (no "..", no absolute path, no symbolic link leaving the
// workspace, checked by the kernel at each open, so a link swapped in
// during a read is refused too); symbolic links are copied as links and
// never followed; only directories, regular files and links are kept
// (a FIFO, socket or device is dropped); permission bits lose setuid,
// setgid and sticky; sizes and entry counts are capped.
package workspace

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Limits of one workspace.
const (
	// MaxEntries is the most files, directories and links a workspace
	// may hold; a run that leaves more is not stored.
	MaxEntries = 100_000
	// MaxList is the most entries ListWorkspaceFiles answers.
	MaxList = 10_000
	// ChunkSize is the largest chunk ReadWorkspaceFile sends.
	ChunkSize = 64 << 10
)

// Store holds the workspaces of one environment service.
type Store struct {
	dir       string
	capBytes  int64
	retention time.Duration
	log       *slog.Logger

	mu    sync.Mutex
	locks map[string]chan struct{}
}

// Open returns the store in dir (created 0700 when missing), with
// capBytes the size cap of each workspace and retention how long a
// workspace nobody used is kept (zero: for ever). It removes what an
// interrupted Commit left there.
func Open(dir string, capBytes int64, retention time.Duration, log *slog.Logger) (*Store, error) {
	if capBytes <= 0 {
		return nil, fmt.Errorf("workspace store: size cap %d: want a positive number of bytes", capBytes)
	}
	if retention < 0 {
		return nil, fmt.Errorf("workspace store: negative retention %v", retention)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("workspace store: %w", err)
	}
	s := &Store{dir: dir, capBytes: capBytes, retention: retention, log: log, locks: map[string]chan struct{}{}}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return s, nil
}

// Cap is the size cap of each workspace, in bytes.
func (s *Store) Cap() int64 { return s.capBytes }

// safeID is an id used as it is in a workspace's name; others are hashed.
var safeID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// name is the directory name of the workspace of kind ("session",
// "workflow") and id: kind-id when id is short and plain, else kind~ and
// a hash of id. It never starts with "." and never holds "/".
func name(kind, id string) string {
	if safeID.MatchString(id) {
		return kind + "-" + id
	}
	sum := sha256.Sum256([]byte(id))
	return kind + "~" + hex.EncodeToString(sum[:16])
}

// Name is the name of the workspace ref names.
func Name(ref *environmentv1.WorkspaceRef) (string, error) {
	switch k := ref.GetKind().(type) {
	case *environmentv1.WorkspaceRef_SessionId:
		if k.SessionId != "" {
			return name("session", k.SessionId), nil
		}
	case *environmentv1.WorkspaceRef_WorkflowId:
		if k.WorkflowId != "" {
			return name("workflow", k.WorkflowId), nil
		}
	case *environmentv1.WorkspaceRef_SandboxId:
		if k.SandboxId != "" {
			return name("sandbox", k.SandboxId), nil
		}
	}
	return "", fmt.Errorf("workspace: name a session_id or a workflow_id: %w", errs.InvalidArgument)
}

// SessionName and WorkflowName are the names of a session's and a
// workflow's workspaces.
func SessionName(id string) string  { return name("session", id) }
func WorkflowName(id string) string { return name("workflow", id) }

// SandboxName is the name of a sandbox session's workspace.
func SandboxName(id string) string { return name("sandbox", id) }

// Path is the directory of workspace n.
func (s *Store) Path(n string) string { return filepath.Join(s.dir, n) }

// Lock waits for workspace n to be free (or ctx to end) and holds it
// until unlock is called: runs and writes of one workspace take turns.
// unlock marks the workspace as used now, for the retention policy.
func (s *Store) Lock(ctx context.Context, n string) (unlock func(), err error) {
	s.mu.Lock()
	ch, ok := s.locks[n]
	if !ok {
		ch = make(chan struct{}, 1)
		s.locks[n] = ch
	}
	s.mu.Unlock()
	select {
	case ch <- struct{}{}:
	default:
		select {
		case ch <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for workspace %s, in use by another run or write: %w", n, ctx.Err())
		}
	}
	return func() {
		now := time.Now()
		_ = os.Chtimes(s.Path(n), now, now)
		<-ch
	}, nil
}

// Exists reports whether workspace n exists.
func (s *Store) Exists(n string) bool {
	fi, err := os.Lstat(s.Path(n))
	return err == nil && fi.IsDir()
}

// IDs are the owner given to what CopyIn copies.
type IDs struct{ UID, GID int }

// CopyIn copies workspace n, when it exists, into dst (an empty
// directory: the invocation's workspace), owned by ids. It copies at
// most the store's cap.
func (s *Store) CopyIn(n, dst string, ids *IDs) error {
	if !s.Exists(n) {
		return nil
	}
	_, err := copyTree(s.Path(n), dst, ids, s.capBytes)
	return err
}

// Commit replaces workspace n with a copy of src (what the run left in
// its workspace), atomically: readers see the old content or the new,
// never a mix. It returns the bytes stored. Call it holding Lock.
func (s *Store) Commit(n, src string) (int64, error) {
	tmp, err := os.MkdirTemp(s.dir, ".commit-")
	if err != nil {
		return 0, fmt.Errorf("storing workspace %s: %v: %w", n, err, errs.Internal)
	}
	defer os.RemoveAll(tmp)
	size, err := copyTree(src, tmp, nil, s.capBytes)
	if err != nil {
		return 0, err
	}
	return size, s.replace(n, tmp)
}

// replace puts directory tmp in the place of workspace n.
func (s *Store) replace(n, tmp string) error {
	if err := os.Chmod(tmp, 0o700); err != nil {
		return err
	}
	dst := s.Path(n)
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.ENOENT) {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		return fmt.Errorf("storing workspace %s: %v: %w", n, err, errs.Internal)
	}
	return nil // tmp now holds the old content; the caller removes it
}

// Delete removes workspace n; existed says whether there was one.
func (s *Store) Delete(ctx context.Context, n string) (existed bool, err error) {
	unlock, err := s.Lock(ctx, n)
	if err != nil {
		return false, err
	}
	defer unlock()
	if !s.Exists(n) {
		return false, nil
	}
	old := filepath.Join(s.dir, ".delete-"+randHex())
	if err := os.Rename(s.Path(n), old); err != nil {
		return true, fmt.Errorf("removing workspace %s: %v: %w", n, err, errs.Internal)
	}
	return true, os.RemoveAll(old)
}

// Sweep removes the workspaces not used for the retention period (none
// when it is zero) and says how many; a workspace in use is skipped.
func (s *Store) Sweep(now time.Time) int {
	if s.retention <= 0 {
		return 0
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0
	}
	removed := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !e.IsDir() {
			continue
		}
		fi, err := e.Info()
		if err != nil || now.Sub(fi.ModTime()) < s.retention {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // never wait for a workspace in use
		if existed, err := s.Delete(ctx, e.Name()); err == nil && existed {
			removed++
			s.log.Info("workspace removed by the retention policy", "workspace", e.Name(), "unused_since", fi.ModTime().UTC().Format(time.RFC3339), "retention", s.retention.String())
		}
	}
	return removed
}

// RunRetention sweeps every interval until ctx ends.
func (s *Store) RunRetention(ctx context.Context, interval time.Duration) {
	RunRetention(ctx, s.retention, interval, func(now time.Time) { s.Sweep(now) })
}

// RunRetention calls sweep with the time now, and again every interval,
// until ctx ends; with retention <= 0 (workspaces kept until deleted) it
// returns at once. The process backend's store and the docker and
// kubernetes backends' volumes and claims sweep through it.
func RunRetention(ctx context.Context, retention, interval time.Duration, sweep func(now time.Time)) {
	if retention <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		sweep(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Clean checks a path a caller gave inside a workspace and returns it
// cleaned, with "/" separators: relative, no "..", no NUL. Empty (and
// ".") is the workspace itself when root is allowed.
func Clean(p string, root bool) (string, error) {
	if p == "" || p == "." {
		if root {
			return ".", nil
		}
		return "", fmt.Errorf("path: name a file of the workspace: %w", errs.InvalidArgument)
	}
	if strings.ContainsRune(p, 0) || strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q: want a path relative to the workspace, such as notes.md or src/main.go: %w", p, errs.InvalidArgument)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("path %q: \"..\" is not allowed; name the file relative to the workspace: %w", p, errs.InvalidArgument)
		}
	}
	c := path.Clean(p)
	if !filepath.IsLocal(c) {
		return "", fmt.Errorf("path %q does not name a file inside the workspace: %w", p, errs.InvalidArgument)
	}
	return c, nil
}

// rootErr maps an error of an os.Root operation on path p to an errs kind.
func rootErr(p string, err error) error {
	switch {
	case err == nil:
		return nil
	case strings.Contains(err.Error(), "path escapes from parent"):
		return fmt.Errorf("path %q leaves the workspace through a symbolic link: %w", p, errs.InvalidArgument)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("path %q does not exist in the workspace: %w", p, errs.NotFound)
	case errors.Is(err, syscall.ELOOP):
		return fmt.Errorf("path %q is a symbolic link; name its target: %w", p, errs.FailedPrecondition)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("path %q: a part of it is not a directory: %w", p, errs.FailedPrecondition)
	}
	return fmt.Errorf("path %q: %v: %w", p, err, errs.Internal)
}

// open opens workspace n as a root.
func (s *Store) open(n string) (*os.Root, error) {
	r, err := os.OpenRoot(s.Path(n))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("workspace %s does not exist (no run has used it yet, or the retention policy removed it): %w", n, errs.NotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("workspace %s: %v: %w", n, err, errs.Internal)
	}
	return r, nil
}

// List lists the entries of workspace n under directory dir
// (recursively, in path order, at most MaxList).
func (s *Store) List(n, dir string) (files []*environmentv1.WorkspaceFile, truncated bool, total uint64, err error) {
	dir, err = Clean(dir, true)
	if err != nil {
		return nil, false, 0, err
	}
	r, err := s.open(n)
	if err != nil {
		return nil, false, 0, err
	}
	defer r.Close()
	if dir != "." {
		fi, err := r.Stat(dir)
		if err != nil {
			return nil, false, 0, rootErr(dir, err)
		}
		if !fi.IsDir() {
			return nil, false, 0, fmt.Errorf("path %q is not a directory: %w", dir, errs.FailedPrecondition)
		}
	}
	werr := fs.WalkDir(r.FS(), dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir && d.IsDir() {
			return nil
		}
		if len(files) == MaxList {
			truncated = true
			return fs.SkipAll
		}
		fi, err := d.Info()
		if err != nil {
			return nil // gone meanwhile
		}
		f := &environmentv1.WorkspaceFile{Path: p, Mode: uint32(fi.Mode().Perm()), Modified: timestamppb.New(fi.ModTime())}
		switch {
		case d.IsDir():
			f.Directory = true
		case d.Type()&fs.ModeSymlink != 0:
			f.Symlink = true
			f.Target, _ = r.Readlink(p)
		case d.Type().IsRegular():
			f.Size = uint64(fi.Size())
			total += f.Size
		default:
			return nil
		}
		files = append(files, f)
		return nil
	})
	if werr != nil {
		return nil, false, 0, rootErr(dir, werr)
	}
	return files, truncated, total, nil
}

// Open opens regular file p of workspace n for reading. A symbolic link
// is followed only inside the workspace, checked at the open itself.
func (s *Store) Open(n, p string) (*os.File, error) {
	p, err := Clean(p, false)
	if err != nil {
		return nil, err
	}
	r, err := s.open(n)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, rootErr(p, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("path %q is not a regular file: %w", p, errs.FailedPrecondition)
	}
	return f, nil
}

// Write writes file p of workspace n (creating the workspace and p's
// directories) from r, replacing it whole: the file appears complete or
// not at all. The workspace must stay within the cap. It waits for the
// workspace (Lock).
func (s *Store) Write(ctx context.Context, n, p string, mode os.FileMode, src io.Reader) (int64, error) {
	p, err := Clean(p, false)
	if err != nil {
		return 0, err
	}
	if mode == 0 {
		mode = 0o644
	}
	unlock, err := s.Lock(ctx, n)
	if err != nil {
		return 0, err
	}
	defer unlock()
	if err := os.Mkdir(s.Path(n), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return 0, fmt.Errorf("creating workspace %s: %v: %w", n, err, errs.Internal)
	}
	r, err := s.open(n)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	used, _, err := usage(r)
	if err != nil {
		return 0, err
	}
	if d := path.Dir(p); d != "." {
		if err := r.MkdirAll(d, 0o755); err != nil {
			return 0, rootErr(d, err)
		}
	}
	// The replaced file's bytes are freed when the new one lands.
	if fi, err := r.Lstat(p); err == nil && fi.Mode().IsRegular() {
		used -= fi.Size()
	}
	tmp := path.Join(path.Dir(p), ".upload-"+randHex())
	f, err := r.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
	if err != nil {
		return 0, rootErr(p, err)
	}
	room := s.capBytes - used
	written, err := io.Copy(f, io.LimitReader(src, max(room, 0)+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && written > room {
		err = fmt.Errorf("writing %s would take workspace %s past its size cap of %d bytes (%d in use): %w", p, n, s.capBytes, used, errs.ResourceExhausted)
	}
	if err == nil {
		err = r.Chmod(tmp, mode.Perm())
	}
	if err == nil {
		if err = r.Rename(tmp, p); err != nil {
			err = rootErr(p, err)
		}
	}
	if err != nil {
		_ = r.Remove(tmp)
		if errs.Code(err) == codes.Unknown { // codes.Unknown: a plain error
			err = fmt.Errorf("writing %s: %v: %w", p, err, errs.Internal)
		}
		return 0, err
	}
	return written, nil
}

// usage sums the sizes of the regular files of r and counts its entries.
func usage(r *os.Root) (int64, int, error) {
	var (
		size  int64
		count int
	)
	err := fs.WalkDir(r.FS(), ".", func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		count++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("measuring the workspace: %v: %w", err, errs.Internal)
	}
	return size, count, nil
}

// copyTree copies the directories, regular files and symbolic links of
// src into dst (an existing, empty directory), at most capBytes of file
// content and MaxEntries entries, without following any link; with ids,
// what it creates is owned by them. It returns the bytes copied.
func copyTree(src, dst string, ids *IDs, capBytes int64) (int64, error) {
	sr, err := os.OpenRoot(src)
	if err != nil {
		return 0, fmt.Errorf("copying the workspace: %v: %w", err, errs.Internal)
	}
	defer sr.Close()
	dr, err := os.OpenRoot(dst)
	if err != nil {
		return 0, fmt.Errorf("copying the workspace: %v: %w", err, errs.Internal)
	}
	defer dr.Close()
	var (
		size    int64
		entries int
		dirs    []string
	)
	own := func(p string) error {
		if ids == nil {
			return nil
		}
		return dr.Lchown(p, ids.UID, ids.GID)
	}
	err = fs.WalkDir(sr.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		if entries++; entries > MaxEntries {
			return fmt.Errorf("the workspace holds more than %d files, directories and links: %w", MaxEntries, errs.ResourceExhausted)
		}
		switch t := d.Type(); {
		case t.IsDir():
			if err := dr.Mkdir(p, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, p)
			return own(p)
		case t&fs.ModeSymlink != 0:
			target, err := sr.Readlink(p)
			if err != nil {
				return err
			}
			if err := dr.Symlink(target, p); err != nil {
				return err
			}
			return own(p)
		case t.IsRegular():
			n, err := copyFile(sr, dr, p, capBytes-size, capBytes)
			size += n
			if err != nil {
				return err
			}
			return own(p)
		}
		return nil // a FIFO, socket or device: not kept
	})
	if err != nil {
		if errs.Code(err) == codes.Unknown {
			err = fmt.Errorf("copying the workspace: %v: %w", err, errs.Internal)
		}
		return size, err
	}
	// Directory modes last, deepest first: a read-only directory must
	// not stop what goes into it.
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	for _, p := range dirs {
		if fi, err := sr.Lstat(p); err == nil {
			_ = dr.Chmod(p, fi.Mode().Perm()|0o700)
		}
	}
	return size, nil
}

// copyFile copies regular file p from sr to dr, refusing more than room
// bytes; the source is opened without following a link and checked to
// be a regular file (a FIFO would block).
func copyFile(sr, dr *os.Root, p string, room, capBytes int64) (int64, error) {
	in, err := sr.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, nil
	}
	out, err := dr.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, io.LimitReader(in, max(room, 0)+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > room {
		return n, fmt.Errorf("the workspace holds more than its size cap of %d bytes; it was not stored (ask for less, or raise --workspace-max-size): %w", capBytes, errs.ResourceExhausted)
	}
	if err == nil {
		err = dr.Chmod(p, fi.Mode().Perm())
	}
	return n, err
}

func randHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
