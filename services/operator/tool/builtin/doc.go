// Package builtin provides the operator's built-in runnable tools. The
// file tools read, write and edit work inside a Workspace: a directory
// opened as an os.Root, so every path they touch is resolved by the
// kernel-level, symlink-aware os.Root API. A path that leaves the
// workspace, whether through "..", an absolute path elsewhere or a
// symbolic link pointing outside (or any absolute symbolic link, which
// os.Root refuses), is refused with "path escapes the workspace: ...".
//
// Paths are relative to the workspace root. An absolute path is accepted
// when it lies inside the workspace directory (as opened, or with its
// symbolic links resolved) and is mapped to the relative path; any other
// absolute path is refused. Resolution of the mapped path is still left
// to os.Root.
//
// read returns a text file's lines numbered like `cat -n` (the number
// right-aligned in six columns, a tab, then the line), from an optional
// 1-based offset for at most limit lines, with a notice telling how to
// continue when more lines follow; it refuses directories, non-regular
// files, binary files (any NUL byte) and files over MaxFileBytes. write
// creates or replaces a file, creating parent directories. edit replaces
// an exact string that must occur once, or every occurrence with
// replace_all.
//
// Every error is written for the model to act on, and wraps an errs kind.
package builtin
