package testenv

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Python is the interpreter the tests run Python programs with: Debian's,
// where scripts/client-deps.sh installs python3-grpcio and
// python3-protobuf. The python3 first on PATH (pyenv, a virtualenv) may
// lack grpc.
const Python = "/usr/bin/python3"

// pythonDepsHint is what a test that cannot generate or run Python stubs
// tells the reader to run.
const pythonDepsHint = "run scripts/client-deps.sh"

// PythonStubs generates the Python protobuf and gRPC modules (NAME_pb2.py,
// NAME_pb2_grpc.py) of files into a fresh directory of the calling test
// and returns it, for PYTHONPATH: layer0/state/v1/state.proto becomes the
// package layer0.state.v1 there. root is the repository's root; files
// are relative to proto/ or third_party/protovalidate (the include path,
// in that order), and must name every file whose module will be imported,
// imports included, since only the named files are generated. Without
// files it generates every .proto under proto/ and
// buf/validate/validate.proto, which they import.
//
// It generates with protoc and grpc_python_plugin when both are on PATH
// (Debian: protobuf-compiler, protobuf-compiler-grpc and libprotobuf-dev
// for the well-known types), else with `Python -m grpc_tools.protoc`
// (python3-grpc-tools), and logs which one ran.
//
// When the Python programs cannot run here it returns, as missing, why
// and what to run, and no directory: Python is absent or cannot import
// grpc and google.protobuf, there is neither protoc with
// grpc_python_plugin nor grpc_tools, the protoc found predates proto3
// `optional` (Debian 12's python3-grpc-tools bundles protoc 3.5), or
// protoc has no well-known types. The caller decides whether to skip. Any
// other failure fails the test.
func PythonStubs(t testing.TB, root string, files ...string) (dir, missing string) {
	t.Helper()
	if _, err := os.Stat(Python); err != nil {
		return "", Python + " is missing: " + pythonDepsHint
	}
	if out, err := exec.Command(Python, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		return "", fmt.Sprintf("%s cannot import grpc and google.protobuf (%s): %s", Python, pythonLastLine(out, err), pythonDepsHint)
	}
	if len(files) == 0 {
		var err error
		if files, err = pythonAllProtos(root); err != nil {
			t.Fatalf("listing the protos: %v", err)
		}
	}

	dir = t.TempDir()
	flags := []string{"-I", "proto", "-I", filepath.Join("third_party", "protovalidate"),
		"--python_out=" + dir, "--grpc_python_out=" + dir}
	var cmd *exec.Cmd
	var generator string
	protoc, perr := exec.LookPath("protoc")
	plugin, gerr := exec.LookPath("grpc_python_plugin")
	if perr == nil && gerr == nil {
		generator = protoc + " with " + plugin
		cmd = exec.Command(protoc, append(append([]string{"--plugin=protoc-gen-grpc_python=" + plugin}, flags...), files...)...)
	} else {
		generator = Python + " -m grpc_tools.protoc"
		cmd = exec.Command(Python, append(append([]string{"-m", "grpc_tools.protoc"}, flags...), files...)...)
	}
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := string(out)
		switch {
		case strings.Contains(msg, "No module named grpc_tools"):
			return "", "no protoc with grpc_python_plugin on PATH and no grpc_tools for " + Python + ": " + pythonDepsHint
		case strings.Contains(msg, "Explicit 'optional' labels are disallowed"),
			strings.Contains(msg, "--experimental_allow_proto3_optional was not set"):
			return "", generator + ": its protoc predates proto3 optional; " + pythonDepsHint + " (protobuf-compiler, protobuf-compiler-grpc)"
		case strings.Contains(msg, "google/protobuf/descriptor.proto: File not found"),
			strings.Contains(msg, "google/protobuf/struct.proto: File not found"):
			return "", generator + " cannot find the well-known types: " + pythonDepsHint + " (libprotobuf-dev)"
		}
		t.Fatalf("generating the Python stubs with %s: %v\n%s", generator, err, out)
	}
	t.Logf("generated the Python stubs of %d proto files with %s", len(files), generator)
	return dir, ""
}

// pythonAllProtos lists every .proto under root/proto, relative to it, and
// buf/validate/validate.proto, which they import.
func pythonAllProtos(root string) ([]string, error) {
	files := []string{"buf/validate/validate.proto"}
	base := filepath.Join(root, "proto")
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".proto") {
			return err
		}
		rel, err := filepath.Rel(base, p)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	return files, err
}

// pythonLastLine is the last line of a failed command's output (the
// exception of a Python traceback), or its error when it printed nothing.
func pythonLastLine(out []byte, err error) string {
	s := strings.TrimSpace(string(out))
	if s == "" {
		return err.Error()
	}
	return s[strings.LastIndex(s, "\n")+1:]
}
