package environment

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/secbear/neuron/pkg/errs"
)

// SecretSource resolves a credential name to its value, on the
// environment service's side: values never travel in requests.
type SecretSource interface {
	// Secret returns the value of name, or an error wrapping
	// errs.NotFound when there is no such secret.
	Secret(ctx context.Context, name string) (string, error)
}

// secretName is what a credential name may look like: no path
// separators, so a name cannot walk out of a secrets directory; at most
// maxSecretName bytes. The length is checked apart: a counted repetition
// such as {0,255} compiles into one copy of the class per count, a
// quarter of a megabyte built when the process starts.
var secretName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

const maxSecretName = 256

func validSecretName(name string) bool {
	return len(name) <= maxSecretName && secretName.MatchString(name)
}

// DirSecrets reads each secret from a file named after it in a directory,
// the layout of a mounted Kubernetes Secret. Surrounding whitespace (a
// trailing newline) is trimmed.
type DirSecrets struct {
	// Dir is the directory.
	Dir string
}

// Secret implements SecretSource.
func (d DirSecrets) Secret(_ context.Context, name string) (string, error) {
	if !validSecretName(name) {
		return "", fmt.Errorf("credential name %q: use letters, digits, '.', '_' and '-' only: %w", name, errs.InvalidArgument)
	}
	if d.Dir == "" {
		return "", fmt.Errorf("credential %q: this environment service has no secret store (start it with --secrets-dir): %w", name, errs.NotFound)
	}
	b, err := os.ReadFile(filepath.Join(d.Dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("credential %q: no such secret in the environment service's secret store: %w", name, errs.NotFound)
	}
	if err != nil {
		return "", fmt.Errorf("credential %q: %v: %w", name, err, errs.Internal)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("credential %q: the secret is empty: %w", name, errs.FailedPrecondition)
	}
	return v, nil
}

// MapSecrets is a SecretSource held in memory, for tests and embedding.
type MapSecrets map[string]string

// Secret implements SecretSource.
func (m MapSecrets) Secret(_ context.Context, name string) (string, error) {
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("credential %q: no such secret: %w", name, errs.NotFound)
	}
	return v, nil
}
