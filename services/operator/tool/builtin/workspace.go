package builtin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

// MaxFileBytes is the largest file read and edit handle.
const MaxFileBytes = 10 << 20

// Workspace is the directory the file tools work in. It is safe for
// concurrent use.
type Workspace struct {
	root *os.Root
	// dir is the workspace's absolute path as given; real is the same
	// with symbolic links resolved. Both are used only to map absolute
	// paths from the model to relative ones.
	dir, real string
	// escape is the error os.Root reports for a path that leaves the
	// root (os does not export it; OpenWorkspace learns it).
	escape error
}

// OpenWorkspace opens dir, which must be an existing directory, as a
// workspace. The error wraps errs.NotFound when dir does not exist, else
// errs.InvalidArgument.
func OpenWorkspace(dir string) (*Workspace, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("workspace %q: %v: %w", dir, err, errs.InvalidArgument)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		kind := errs.InvalidArgument
		if errors.Is(err, fs.ErrNotExist) {
			kind = errs.NotFound
		}
		return nil, fmt.Errorf("workspace %q: %v: %w", dir, err, kind)
	}
	root, err := os.OpenRoot(real)
	if err != nil {
		return nil, fmt.Errorf("workspace %q: %v: %w", dir, err, errs.InvalidArgument)
	}
	w := &Workspace{root: root, dir: abs, real: real}
	var pe *os.PathError
	if _, err := root.Lstat(".."); errors.As(err, &pe) {
		w.escape = pe.Err
	}
	return w, nil
}

// FileTools returns the read, write and edit tools of w.
func FileTools(w *Workspace) []tool.Tool {
	return []tool.Tool{NewRead(w), NewWrite(w), NewEdit(w)}
}

// Close releases the workspace; the tools using it fail afterwards.
func (w *Workspace) Close() error { return w.root.Close() }

// Dir is the workspace's absolute path, with symbolic links resolved.
func (w *Workspace) Dir() string { return w.real }

// rel maps a path from the model to a path relative to the root. Relative
// paths are passed through untouched: os.Root decides whether they stay
// inside.
func (w *Workspace) rel(p string) (string, error) {
	switch {
	case p == "":
		return "", tool.Errorf(errs.InvalidArgument, "path is empty; give a path relative to the workspace")
	case strings.IndexByte(p, 0) >= 0:
		return "", tool.Errorf(errs.InvalidArgument, "path %q contains a NUL byte", p)
	case !filepath.IsAbs(p):
		return p, nil
	}
	clean := filepath.Clean(p)
	for _, base := range []string{w.dir, w.real} {
		if clean == base {
			return ".", nil
		}
		prefix := base
		if !strings.HasSuffix(prefix, string(filepath.Separator)) {
			prefix += string(filepath.Separator)
		}
		if r, ok := strings.CutPrefix(clean, prefix); ok {
			return r, nil
		}
	}
	return "", tool.Errorf(errs.PermissionDenied, "path escapes the workspace: %q is outside %s; use a path relative to the workspace", p, w.real)
}

// pathError turns an error from os.Root about path p into one for the
// model.
func (w *Workspace) pathError(p string, err error) error {
	var pe *os.PathError
	inner := err
	if errors.As(err, &pe) {
		inner = pe.Err
	}
	switch {
	case w.escape != nil && errors.Is(err, w.escape):
		return tool.Errorf(errs.PermissionDenied, "path escapes the workspace: %q leads outside %s (through \"..\" or a symbolic link; absolute symbolic links are refused too)", p, w.real)
	case errors.Is(err, fs.ErrNotExist):
		return tool.Errorf(errs.NotFound, "%q does not exist in the workspace", p)
	case errors.Is(err, fs.ErrPermission):
		return tool.Errorf(errs.PermissionDenied, "permission denied: %q", p)
	case errors.Is(err, syscall.ENOTDIR):
		return tool.Errorf(errs.InvalidArgument, "%q: a parent of it is a file, not a directory", p)
	case errors.Is(err, syscall.EISDIR):
		return tool.Errorf(errs.InvalidArgument, "%q is a directory, not a file", p)
	case errors.Is(err, syscall.ELOOP):
		return tool.Errorf(errs.InvalidArgument, "%q: too many levels of symbolic links", p)
	case errors.Is(err, syscall.ENXIO), errors.Is(err, syscall.EAGAIN):
		return tool.Errorf(errs.InvalidArgument, "%q is not a regular file", p)
	}
	return tool.Errorf(errs.Internal, "cannot access %q: %v", p, inner)
}

// openRegular opens the file at p (already mapped by rel) with flag and
// checks, on the open file, that it is a regular file. O_NONBLOCK keeps a
// FIFO from blocking the open.
func (w *Workspace) openRegular(p, rel string, flag int, perm os.FileMode) (*os.File, os.FileInfo, error) {
	f, err := w.root.OpenFile(rel, flag|syscall.O_NONBLOCK, perm)
	if err != nil {
		return nil, nil, w.pathError(p, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, w.pathError(p, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		if fi.IsDir() {
			return nil, nil, tool.Errorf(errs.InvalidArgument, "%q is a directory, not a file; give the path of a file", p)
		}
		return nil, nil, tool.Errorf(errs.InvalidArgument, "%q is not a regular file (%s); only regular files can be used", p, fileType(fi.Mode()))
	}
	return f, fi, nil
}

func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.Type().String()
}

// readText reads the text file at p whole: at most MaxFileBytes, no NUL
// byte.
func (w *Workspace) readText(p, rel string) (string, error) {
	f, fi, err := w.openRegular(p, rel, os.O_RDONLY, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi.Size() > MaxFileBytes {
		return "", tool.Errorf(errs.InvalidArgument, "%q is %d bytes; the limit is %d bytes (10 MiB)", p, fi.Size(), MaxFileBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return "", w.pathError(p, err)
	}
	if len(data) > MaxFileBytes {
		return "", tool.Errorf(errs.InvalidArgument, "%q is over the limit of %d bytes (10 MiB)", p, MaxFileBytes)
	}
	if bytes.IndexByte(data, 0) >= 0 {
		return "", tool.Errorf(errs.InvalidArgument, "%q looks like a binary file (it contains NUL bytes); only text files can be read or edited", p)
	}
	return string(data), nil
}

// writeFile replaces the content of the regular file at p (mapped to rel),
// creating it when create is set, and reports whether it existed.
func (w *Workspace) writeFile(p, rel string, content string, create bool) (existed bool, err error) {
	flag := os.O_WRONLY
	if create {
		if _, err := w.root.Stat(rel); err == nil {
			existed = true
		}
		flag |= os.O_CREATE
	}
	f, _, err := w.openRegular(p, rel, flag, 0o644)
	if err != nil {
		return false, err
	}
	// Truncate only now that the file is known to be a regular file.
	if err := f.Truncate(0); err != nil {
		f.Close()
		return false, w.pathError(p, err)
	}
	if _, err := io.WriteString(f, content); err != nil {
		f.Close()
		return false, w.pathError(p, err)
	}
	if err := f.Close(); err != nil {
		return false, w.pathError(p, err)
	}
	return existed || !create, nil
}

// decodeArgs decodes a tool input, refusing unknown properties. Empty
// input is {}.
func decodeArgs(in json.RawMessage, args any) error {
	if len(bytes.TrimSpace(in)) == 0 {
		in = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(args); err != nil {
		return tool.Errorf(errs.InvalidArgument, "invalid arguments: %v", err)
	}
	return nil
}
