package builtin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/builtin"
)

// fixture is a workspace next to a directory outside it:
//
//	base/outside/secret.txt
//	base/ws/...            (the workspace)
type fixture struct {
	ws      *builtin.Workspace
	dir     string // the workspace directory
	outside string // a directory next to it
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{dir: filepath.Join(base, "ws"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{f.dir, f.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f.file(t, "../outside/secret.txt", "top secret\n")
	ws, err := builtin.OpenWorkspace(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	f.ws = ws
	return f
}

// file writes a file relative to the workspace directory, bypassing the
// tools.
func (f *fixture) file(t *testing.T, rel, content string) {
	t.Helper()
	p := filepath.Join(f.dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) symlink(t *testing.T, target, rel string) {
	t.Helper()
	if err := os.Symlink(target, filepath.Join(f.dir, rel)); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) content(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func call(t *testing.T, tl tool.Tool, args map[string]any) (string, error) {
	t.Helper()
	in, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	return tl.Call(context.Background(), in)
}

// check asserts the result of a call: output want, or, when kind is not
// nil, an error with message want wrapping kind.
func check(t *testing.T, out string, err error, want string, kind *errs.Kind) {
	t.Helper()
	if kind == nil {
		if err != nil {
			t.Fatalf("err = %v, want output %q", err, want)
		}
		if out != want {
			t.Errorf("output =\n%s\nwant\n%s", out, want)
		}
		return
	}
	if err == nil {
		t.Fatalf("output %q, want error %q", out, want)
	}
	if err.Error() != want || !errors.Is(err, kind) {
		t.Errorf("err =\n%v\nwant\n%s\nwrapping %v (errors.Is: %v)", err, want, kind, errors.Is(err, kind))
	}
}

func escapeMsg(f *fixture, p string) string {
	return fmt.Sprintf(`path escapes the workspace: %q leads outside %s (through ".." or a symbolic link; absolute symbolic links are refused too)`, p, f.dir)
}

func TestOpenWorkspace(t *testing.T) {
	dir := t.TempDir()
	if _, err := builtin.OpenWorkspace(filepath.Join(dir, "missing")); !errors.Is(err, errs.NotFound) {
		t.Errorf("missing dir: err = %v, want NotFound", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := builtin.OpenWorkspace(file); !errors.Is(err, errs.InvalidArgument) {
		t.Errorf("file: err = %v, want InvalidArgument", err)
	}
	// A workspace reached through a symbolic link: Dir is resolved, and
	// absolute paths under either spelling map inside.
	real, _ := filepath.EvalSymlinks(dir)
	if err := os.Mkdir(filepath.Join(real, "ws"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(real, "ws"), filepath.Join(real, "link")); err != nil {
		t.Fatal(err)
	}
	ws, err := builtin.OpenWorkspace(filepath.Join(real, "link"))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if ws.Dir() != filepath.Join(real, "ws") {
		t.Errorf("Dir() = %q", ws.Dir())
	}
	w := builtin.NewWrite(ws)
	for _, p := range []string{filepath.Join(real, "link", "a.txt"), filepath.Join(real, "ws", "b.txt")} {
		if _, err := call(t, w, map[string]any{"path": p, "content": "x"}); err != nil {
			t.Errorf("write %s: %v", p, err)
		}
	}
	if got := len(builtin.FileTools(ws)); got != 3 {
		t.Errorf("FileTools: %d tools", got)
	}
}

func TestSpecs(t *testing.T) {
	f := newFixture(t)
	r := tool.NewRegistry()
	for _, tl := range builtin.FileTools(f.ws) {
		if err := r.Register(tl); err != nil {
			t.Fatalf("Register(%s): %v", tl.Spec().Name, err)
		}
	}
	tiers := map[string]tool.Tier{}
	for _, n := range r.Names() {
		e, _ := r.Lookup(n)
		tiers[n] = e.Spec.Tier
	}
	if fmt.Sprint(tiers) != "map[edit:side-effecting read:read-only write:side-effecting]" {
		t.Errorf("tiers = %v", tiers)
	}
	// The schema is what the model sees; the registry refuses before the
	// tool runs.
	o := r.Call(context.Background(), "read", json.RawMessage(`{"path":"a","offset":0}`))
	want := "invalid input for tool \"read\"; fix it and call the tool again:\n- at /offset: minimum: got 0, want at least 1; schema: {\"description\":\"The line number to start at, 1-based (default 1).\",\"minimum\":1,\"type\":\"integer\"}"
	if !o.IsError || o.Content != want {
		t.Errorf("Call = %+v, want %q", o, want)
	}
}

func TestRead(t *testing.T) {
	f := newFixture(t)
	f.file(t, "a.txt", "one\ntwo\nthree\nfour\nfive\n")
	f.file(t, "no-newline.txt", "alpha\nbeta")
	f.file(t, "empty.txt", "")
	f.file(t, "sub/dir/deep.txt", "deep\n")
	f.file(t, "bin.dat", "PNG\x00\x01\x02")
	f.file(t, "long.txt", strings.Repeat("x", builtin.MaxLineBytes+10)+"\nshort\n")
	var many strings.Builder
	for i := 1; i <= 2500; i++ {
		fmt.Fprintf(&many, "line %d\n", i)
	}
	f.file(t, "many.txt", many.String())
	f.symlink(t, "sub/dir/deep.txt", "inside-link")
	f.symlink(t, "../outside/secret.txt", "outside-link")
	f.symlink(t, "../outside", "outside-dir")
	f.symlink(t, filepath.Join(f.dir, "a.txt"), "absolute-link")

	read := builtin.NewRead(f.ws)
	tests := []struct {
		name string
		args map[string]any
		want string
		kind *errs.Kind
	}{
		{name: "whole", args: map[string]any{"path": "a.txt"}, want: "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n     5\tfive\n"},
		{name: "no final newline", args: map[string]any{"path": "no-newline.txt"}, want: "     1\talpha\n     2\tbeta\n"},
		{name: "offset and limit", args: map[string]any{"path": "a.txt", "offset": 2, "limit": 2}, want: "     2\ttwo\n     3\tthree\n[showing lines 2-3 of 5; call read with offset=4 to continue]\n"},
		{name: "offset to the end", args: map[string]any{"path": "a.txt", "offset": 5, "limit": 10}, want: "     5\tfive\n"},
		{name: "integral float offset", args: map[string]any{"path": "a.txt", "offset": 5.0}, want: "     5\tfive\n"},
		{name: "nested", args: map[string]any{"path": "sub/dir/deep.txt"}, want: "     1\tdeep\n"},
		{name: "dot segments inside", args: map[string]any{"path": "sub/../sub/./dir/deep.txt"}, want: "     1\tdeep\n"},
		{name: "absolute inside", args: map[string]any{"path": filepath.Join(f.dir, "sub/dir/deep.txt")}, want: "     1\tdeep\n"},
		{name: "symlink inside to inside", args: map[string]any{"path": "inside-link"}, want: "     1\tdeep\n"},
		{name: "empty file", args: map[string]any{"path": "empty.txt"}, want: `("empty.txt" is empty)`},
		{name: "long line", args: map[string]any{"path": "long.txt"}, want: fmt.Sprintf("     1\t%s… [line cut: 2000 of 2010 bytes shown]\n     2\tshort\n", strings.Repeat("x", 2000))},
		{name: "default limit", args: map[string]any{"path": "many.txt", "offset": 2490}, want: func() string {
			var b strings.Builder
			for i := 2490; i <= 2500; i++ {
				fmt.Fprintf(&b, "%6d\tline %d\n", i, i)
			}
			return b.String()
		}()},
		{name: "offset past end", args: map[string]any{"path": "a.txt", "offset": 6}, kind: errs.OutOfRange, want: `offset 6 is past the end of "a.txt", which has 5 lines`},
		{name: "bad offset", args: map[string]any{"path": "a.txt", "offset": 1.5}, kind: errs.InvalidArgument, want: `offset must be a whole number of at least 1, got 1.5`},
		{name: "directory", args: map[string]any{"path": "sub"}, kind: errs.InvalidArgument, want: `"sub" is a directory, not a file; give the path of a file`},
		{name: "workspace root", args: map[string]any{"path": "."}, kind: errs.InvalidArgument, want: `"." is a directory, not a file; give the path of a file`},
		{name: "binary", args: map[string]any{"path": "bin.dat"}, kind: errs.InvalidArgument, want: `"bin.dat" looks like a binary file (it contains NUL bytes); only text files can be read or edited`},
		{name: "missing", args: map[string]any{"path": "nope.txt"}, kind: errs.NotFound, want: `"nope.txt" does not exist in the workspace`},
		{name: "empty path", args: map[string]any{"path": ""}, kind: errs.InvalidArgument, want: `path is empty; give a path relative to the workspace`},
		{name: "parent file", args: map[string]any{"path": "a.txt/x"}, kind: errs.InvalidArgument, want: `"a.txt/x": a parent of it is a file, not a directory`},
		{name: "dot-dot escape", args: map[string]any{"path": "../outside/secret.txt"}, kind: errs.PermissionDenied, want: escapeMsg(f, "../outside/secret.txt")},
		{name: "dot-dot escape midway", args: map[string]any{"path": "sub/../../outside/secret.txt"}, kind: errs.PermissionDenied, want: escapeMsg(f, "sub/../../outside/secret.txt")},
		{name: "symlink to a file outside", args: map[string]any{"path": "outside-link"}, kind: errs.PermissionDenied, want: escapeMsg(f, "outside-link")},
		{name: "through a symlinked dir outside", args: map[string]any{"path": "outside-dir/secret.txt"}, kind: errs.PermissionDenied, want: escapeMsg(f, "outside-dir/secret.txt")},
		{name: "absolute symlink", args: map[string]any{"path": "absolute-link"}, kind: errs.PermissionDenied, want: escapeMsg(f, "absolute-link")},
		{
			name: "absolute outside", args: map[string]any{"path": filepath.Join(f.outside, "secret.txt")}, kind: errs.PermissionDenied,
			want: fmt.Sprintf(`path escapes the workspace: %q is outside %s; use a path relative to the workspace`, filepath.Join(f.outside, "secret.txt"), f.dir),
		},
		{
			name: "absolute with dot-dot", args: map[string]any{"path": f.dir + "/../outside/secret.txt"}, kind: errs.PermissionDenied,
			want: fmt.Sprintf(`path escapes the workspace: %q is outside %s; use a path relative to the workspace`, f.dir+"/../outside/secret.txt", f.dir),
		},
		{
			name: "absolute sibling prefix", args: map[string]any{"path": f.dir + "2/x"}, kind: errs.PermissionDenied,
			want: fmt.Sprintf(`path escapes the workspace: %q is outside %s; use a path relative to the workspace`, f.dir+"2/x", f.dir),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := call(t, read, tt.args)
			check(t, out, err, tt.want, tt.kind)
		})
	}
}

func TestReadPages(t *testing.T) {
	f := newFixture(t)
	var b strings.Builder
	for i := 1; i <= 2500; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	f.file(t, "many.txt", b.String())
	// 50 lines of 1000 bytes: more than read's output bound.
	f.file(t, "wide.txt", strings.Repeat(strings.Repeat("w", 1000)+"\n", 100))
	read := builtin.NewRead(f.ws)

	out, err := call(t, read, map[string]any{"path": "many.txt"})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2001 || lines[0] != "     1\tline 1" || lines[1999] != "  2000\tline 2000" ||
		lines[2000] != "[showing lines 1-2000 of 2500; call read with offset=2001 to continue]" {
		t.Errorf("default page: %d lines, first %q, last %q", len(lines), lines[0], lines[len(lines)-1])
	}

	out, err = call(t, read, map[string]any{"path": "wide.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) > 50_000 || !strings.HasSuffix(out, "[showing lines 1-49 of 100; call read with offset=50 to continue]\n") {
		t.Errorf("wide page: %d bytes, ending %q", len(out), out[len(out)-100:])
	}
}

func TestReadLimits(t *testing.T) {
	f := newFixture(t)
	big, err := os.Create(filepath.Join(f.dir, "big.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := big.Truncate(builtin.MaxFileBytes + 1); err != nil {
		t.Fatal(err)
	}
	big.Close()
	out, err := call(t, builtin.NewRead(f.ws), map[string]any{"path": "big.txt"})
	check(t, out, err, `"big.txt" is 10485761 bytes; the limit is 10485760 bytes (10 MiB)`, errs.InvalidArgument)

	mkfifo, err := exec.LookPath("mkfifo")
	if err != nil {
		t.Skip("no mkfifo")
	}
	if err := exec.Command(mkfifo, filepath.Join(f.dir, "pipe")).Run(); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	// Opening a FIFO without a writer must not block.
	out, err = call(t, builtin.NewRead(f.ws), map[string]any{"path": "pipe"})
	check(t, out, err, `"pipe" is not a regular file (a named pipe); only regular files can be used`, errs.InvalidArgument)
	out, err = call(t, builtin.NewWrite(f.ws), map[string]any{"path": "pipe", "content": "x"})
	check(t, out, err, `"pipe" is not a regular file`, errs.InvalidArgument)
}

func TestWrite(t *testing.T) {
	f := newFixture(t)
	f.file(t, "exists.txt", "old content that is longer\n")
	f.file(t, "sub/keep.txt", "keep\n")
	f.symlink(t, "sub/keep.txt", "inside-link")
	f.symlink(t, "../outside", "outside-dir")
	f.symlink(t, "../outside/secret.txt", "outside-link")
	write := builtin.NewWrite(f.ws)
	tests := []struct {
		name     string
		args     map[string]any
		want     string
		kind     *errs.Kind
		file     string // checked after success: relative path and its content
		wantFile string
	}{
		{name: "create", args: map[string]any{"path": "new.txt", "content": "hello\n"}, want: `Created "new.txt" (6 bytes).`, file: "new.txt", wantFile: "hello\n"},
		{name: "create with parents", args: map[string]any{"path": "a/b/c/new.txt", "content": "x"}, want: `Created "a/b/c/new.txt" (1 bytes).`, file: "a/b/c/new.txt", wantFile: "x"},
		{name: "replace", args: map[string]any{"path": "exists.txt", "content": "new\n"}, want: `Replaced "exists.txt" (4 bytes).`, file: "exists.txt", wantFile: "new\n"},
		{name: "empty content", args: map[string]any{"path": "empty.txt", "content": ""}, want: `Created "empty.txt" (0 bytes).`, file: "empty.txt", wantFile: ""},
		{name: "absolute inside", args: map[string]any{"path": filepath.Join(f.dir, "abs.txt"), "content": "abs"}, want: fmt.Sprintf(`Created %q (3 bytes).`, filepath.Join(f.dir, "abs.txt")), file: "abs.txt", wantFile: "abs"},
		{name: "symlink inside to inside", args: map[string]any{"path": "inside-link", "content": "via link\n"}, want: `Replaced "inside-link" (9 bytes).`, file: "sub/keep.txt", wantFile: "via link\n"},
		{name: "missing content", args: map[string]any{"path": "x.txt"}, kind: errs.InvalidArgument, want: `missing required property "content"`},
		{name: "directory", args: map[string]any{"path": "sub", "content": "x"}, kind: errs.InvalidArgument, want: `"sub" is a directory, not a file`},
		{name: "parent is a file", args: map[string]any{"path": "exists.txt/x", "content": "x"}, kind: errs.InvalidArgument, want: `"exists.txt/x": a parent of it is a file, not a directory`},
		{name: "dot-dot escape", args: map[string]any{"path": "../outside/new.txt", "content": "x"}, kind: errs.PermissionDenied, want: escapeMsg(f, "../outside/new.txt")},
		{name: "dot-dot escape new dirs", args: map[string]any{"path": "../outside/made/new.txt", "content": "x"}, kind: errs.PermissionDenied, want: escapeMsg(f, "../outside/made/new.txt")},
		{name: "through a symlinked dir outside", args: map[string]any{"path": "outside-dir/new.txt", "content": "x"}, kind: errs.PermissionDenied, want: escapeMsg(f, "outside-dir/new.txt")},
		{name: "mkdir through a symlinked dir outside", args: map[string]any{"path": "outside-dir/made/new.txt", "content": "x"}, kind: errs.PermissionDenied, want: escapeMsg(f, "outside-dir/made/new.txt")},
		{name: "symlink to a file outside", args: map[string]any{"path": "outside-link", "content": "pwned"}, kind: errs.PermissionDenied, want: escapeMsg(f, "outside-link")},
		{
			name: "absolute outside", args: map[string]any{"path": filepath.Join(f.outside, "new.txt"), "content": "x"}, kind: errs.PermissionDenied,
			want: fmt.Sprintf(`path escapes the workspace: %q is outside %s; use a path relative to the workspace`, filepath.Join(f.outside, "new.txt"), f.dir),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := call(t, write, tt.args)
			check(t, out, err, tt.want, tt.kind)
			if tt.file != "" {
				if got := f.content(t, tt.file); got != tt.wantFile {
					t.Errorf("%s = %q, want %q", tt.file, got, tt.wantFile)
				}
			}
		})
	}
	// Nothing reached the outside directory.
	entries, _ := os.ReadDir(f.outside)
	if len(entries) != 1 || entries[0].Name() != "secret.txt" {
		t.Errorf("outside holds %v", entries)
	}
	if b, _ := os.ReadFile(filepath.Join(f.outside, "secret.txt")); string(b) != "top secret\n" {
		t.Errorf("secret.txt = %q", b)
	}
}

func TestEdit(t *testing.T) {
	const src = "func a() {\n\treturn 1\n}\n\nfunc b() {\n\treturn 1\n}\n\nfunc c() {\n\treturn 1\n}\n"
	tests := []struct {
		name     string
		args     map[string]any
		want     string
		kind     *errs.Kind
		wantFile string // the file after the call; src when it must not change
	}{
		{
			name:     "unique",
			args:     map[string]any{"path": "f.go", "old_string": "func b() {\n\treturn 1", "new_string": "func b() {\n\treturn 2"},
			want:     `Replaced 1 occurrence in "f.go".`,
			wantFile: strings.Replace(src, "func b() {\n\treturn 1", "func b() {\n\treturn 2", 1),
		},
		{
			name:     "replace all",
			args:     map[string]any{"path": "f.go", "old_string": "return 1", "new_string": "return 0", "replace_all": true},
			want:     `Replaced 3 occurrences in "f.go".`,
			wantFile: strings.ReplaceAll(src, "return 1", "return 0"),
		},
		{
			name:     "delete text",
			args:     map[string]any{"path": "f.go", "old_string": "\nfunc c() {\n\treturn 1\n}\n", "new_string": ""},
			want:     `Replaced 1 occurrence in "f.go".`,
			wantFile: strings.TrimSuffix(src, "\nfunc c() {\n\treturn 1\n}\n"),
		},
		{
			name: "ambiguous", args: map[string]any{"path": "f.go", "old_string": "return 1", "new_string": "return 2"},
			kind: errs.InvalidArgument, wantFile: src,
			want: `old_string occurs 3 times in "f.go"; include more surrounding lines to make it unique, or set replace_all to true to replace every occurrence`,
		},
		{
			name: "ambiguous, replace_all false", args: map[string]any{"path": "f.go", "old_string": "}\n", "new_string": "};\n", "replace_all": false},
			kind: errs.InvalidArgument, wantFile: src,
			want: `old_string occurs 3 times in "f.go"; include more surrounding lines to make it unique, or set replace_all to true to replace every occurrence`,
		},
		{
			name: "not found", args: map[string]any{"path": "f.go", "old_string": "return 3", "new_string": "return 4"},
			kind: errs.NotFound, wantFile: src,
			want: `old_string was not found in "f.go"; it must match the file exactly, including whitespace and indentation, and without the line-number prefixes read shows. Read the file again to see its current content`,
		},
		{
			name: "same strings", args: map[string]any{"path": "f.go", "old_string": "return 1", "new_string": "return 1"},
			kind: errs.InvalidArgument, wantFile: src, want: `old_string and new_string are the same; there is nothing to change`,
		},
		{
			name: "empty old_string", args: map[string]any{"path": "f.go", "old_string": "", "new_string": "x"},
			kind: errs.InvalidArgument, wantFile: src, want: `old_string is empty; give the exact text to replace (to create a file, use write)`,
		},
		{
			name: "missing new_string", args: map[string]any{"path": "f.go", "old_string": "return 1"},
			kind: errs.InvalidArgument, wantFile: src, want: `missing required property "new_string"`,
		},
		{
			name: "missing file", args: map[string]any{"path": "g.go", "old_string": "a", "new_string": "b"},
			kind: errs.NotFound, wantFile: src, want: `"g.go" does not exist in the workspace`,
		},
		{
			name: "binary", args: map[string]any{"path": "bin.dat", "old_string": "PNG", "new_string": "JPG"},
			kind: errs.InvalidArgument, wantFile: src, want: `"bin.dat" looks like a binary file (it contains NUL bytes); only text files can be read or edited`,
		},
		{
			name: "escape", args: map[string]any{"path": "../outside/secret.txt", "old_string": "top", "new_string": "no"},
			kind: errs.PermissionDenied, wantFile: src, want: "escape:../outside/secret.txt",
		},
		{
			name: "symlink outside", args: map[string]any{"path": "outside-link", "old_string": "top", "new_string": "no"},
			kind: errs.PermissionDenied, wantFile: src, want: "escape:outside-link",
		},
		{
			name:     "symlink inside",
			args:     map[string]any{"path": "link.go", "old_string": "func a()", "new_string": "func z()"},
			want:     `Replaced 1 occurrence in "link.go".`,
			wantFile: strings.Replace(src, "func a()", "func z()", 1),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.file(t, "f.go", src)
			f.file(t, "bin.dat", "PNG\x00")
			f.symlink(t, "f.go", "link.go")
			f.symlink(t, "../outside/secret.txt", "outside-link")
			if err := os.Chmod(filepath.Join(f.dir, "f.go"), 0o600); err != nil {
				t.Fatal(err)
			}
			want := tt.want
			if p, ok := strings.CutPrefix(want, "escape:"); ok {
				want = escapeMsg(f, p)
			}
			out, err := call(t, builtin.NewEdit(f.ws), tt.args)
			check(t, out, err, want, tt.kind)
			if got := f.content(t, "f.go"); got != tt.wantFile {
				t.Errorf("f.go =\n%s\nwant\n%s", got, tt.wantFile)
			}
			if fi, err := os.Stat(filepath.Join(f.dir, "f.go")); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("f.go mode changed: %v %v", fi.Mode(), err)
			}
			if b, _ := os.ReadFile(filepath.Join(f.outside, "secret.txt")); string(b) != "top secret\n" {
				t.Errorf("secret.txt = %q", b)
			}
		})
	}
}

func TestCanceled(t *testing.T) {
	f := newFixture(t)
	f.file(t, "a.txt", "a\n")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tl := range builtin.FileTools(f.ws) {
		args := map[string]any{"path": "a.txt", "content": "b\n", "old_string": "a", "new_string": "b"}
		switch tl.Spec().Name {
		case "read":
			args = map[string]any{"path": "a.txt"}
		case "write":
			delete(args, "old_string")
			delete(args, "new_string")
		case "edit":
			delete(args, "content")
		}
		in, _ := json.Marshal(args)
		if _, err := tl.Call(ctx, in); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: err = %v, want context.Canceled", tl.Spec().Name, err)
		}
	}
	if got := f.content(t, "a.txt"); got != "a\n" {
		t.Errorf("a.txt = %q after canceled calls", got)
	}
}
