package environment_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// TestDirSecretsNames: a credential name is letters, digits, '.', '_'
// and '-', starting with a letter or digit, at most 256 bytes; any other
// is refused (INVALID_ARGUMENT) before the directory is looked at.
func TestDirSecretsNames(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("v\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		test, name string
		want       error // nil: the value "v"
	}{
		{"present", "token", nil},
		{"absent", "absent.key_1-x", errs.NotFound},
		{"255 bytes", strings.Repeat("k", 255), errs.NotFound},
		{"257 bytes", strings.Repeat("k", 257), errs.InvalidArgument},
		{"empty", "", errs.InvalidArgument},
		{"leading dot", ".hidden", errs.InvalidArgument},
		{"parent", "../token", errs.InvalidArgument},
		{"slash", "a/b", errs.InvalidArgument},
		{"space", "tok en", errs.InvalidArgument},
	} {
		t.Run(tt.test, func(t *testing.T) {
			v, err := environment.DirSecrets{Dir: dir}.Secret(context.Background(), tt.name)
			if tt.want == nil {
				if err != nil || v != "v" {
					t.Fatalf("Secret = %q, %v; want \"v\"", v, err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Secret err = %v, want %v", err, tt.want)
			}
		})
	}
}
