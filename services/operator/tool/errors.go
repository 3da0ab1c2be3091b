package tool

import (
	"fmt"

	"github.com/secbear/neuron/pkg/errs"
)

// Errorf returns an error whose text is exactly the formatted message (no
// kind suffix), for the model to read, and which wraps kind so that
// errors.Is(err, kind) holds. Format other errors into it with %v, not %w.
func Errorf(kind *errs.Kind, format string, args ...any) error {
	return &kindError{msg: fmt.Sprintf(format, args...), kind: kind}
}

type kindError struct {
	msg  string
	kind *errs.Kind
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }
