//go:build linux

package startbench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/secbear/neuron"

// linkedTargets are the floors of the services' targets: for each, the
// bare server (testdata/bare) with every package from outside this module
// that the service's binary links blank-imported, so their package
// initialisation runs and their pages are in the binary, and none of our
// code. What a service costs above its linked floor is ours; what the
// floor costs above the bare server is the libraries the service needs
// (model SDKs, bleve, the Temporal and Kubernetes clients, protovalidate,
// OpenTelemetry). Each is written to a directory of its own under
// testdata (removed when b ends) and built like the others.
func linkedTargets(b *testing.B, services []target) []target {
	b.Helper()
	bare, err := os.ReadFile(filepath.Join("testdata", "bare", "main.go"))
	if err != nil {
		b.Fatal(err)
	}
	var out []target
	for _, tg := range services {
		if tg.name == "bare" {
			continue
		}
		pkgs, err := linkedPackages(tg.pkg)
		if err != nil {
			b.Fatalf("the packages %s links: %v", tg.name, err)
		}
		dir, err := os.MkdirTemp("testdata", "linked-"+tg.name+"-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
		src := bytes.Replace(bare, []byte("import (\n"), []byte("import (\n"+blankImports(pkgs)), 1)
		if err := os.WriteFile(filepath.Join(dir, "main.go"), src, 0o600); err != nil {
			b.Fatal(err)
		}
		name := "linked-" + tg.name
		out = append(out, target{name: name, pkg: module + "/internal/startbench/" + filepath.ToSlash(dir),
			args: func(addr, _ string, _ runEnv) []string { return []string{"--addr", addr} }})
	}
	return out
}

// linkedPackages lists the importable packages from outside this module
// and the standard library that pkg's binary links.
func linkedPackages(pkg string) ([]string, error) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}} {{.Name}}{{end}}", pkg)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) != 2 || f[1] == "main" || strings.HasPrefix(f[0], module+"/") || strings.HasPrefix(f[0], "vendor/") {
			continue
		}
		// Another module's internal packages cannot be imported from
		// here; what imports them does, so they are linked anyway.
		if slices.Contains(strings.Split(f[0], "/"), "internal") {
			continue
		}
		pkgs = append(pkgs, f[0])
	}
	return pkgs, nil
}

func blankImports(pkgs []string) string {
	var b strings.Builder
	for _, p := range pkgs {
		fmt.Fprintf(&b, "\t_ %q\n", p)
	}
	return b.String()
}

// The linked floors are generated from the services' own dependencies:
// the operator's includes the model SDKs, none of this module, and no
// package another module keeps internal.
func TestLinkedPackages(t *testing.T) {
	pkgs, err := linkedPackages(module + "/services/operator/cmd/operator")
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	if !slices.Contains(pkgs, "github.com/openai/openai-go/v3") || !slices.Contains(pkgs, "google.golang.org/grpc") {
		t.Fatalf("the operator's linked packages miss the OpenAI SDK or grpc: %d packages", len(pkgs))
	}
	for _, p := range pkgs {
		if strings.HasPrefix(p, module) || strings.Contains("/"+p+"/", "/internal/") {
			t.Fatalf("%s cannot be imported by the floor", p)
		}
	}
}
