package provider

import (
	"fmt"
	"slices"
	"strings"

	"github.com/secbear/neuron/pkg/errs"
)

// ScriptedName is the Name of the built-in deterministic model. Output
// produced by it is marked as such so that it is never mistaken for a real
// model's.
const ScriptedName = "scripted"

// Router picks the provider that serves a model name.
type Router interface {
	// Route returns the provider for model and the model name to send it.
	// The empty name means the default model. An unknown name is an error
	// wrapping errs.InvalidArgument that names it.
	Route(model string) (Provider, string, error)
	// Models lists the names Route accepts, for error messages and help.
	Models() []string
}

// Single is a Router with one provider serving a fixed list of models.
type Single struct {
	Provider Provider
	// Default is used when no model is named.
	Default string
	// Names are the accepted model names; Default is always accepted.
	Names []string
}

// Route implements Router.
func (s Single) Route(model string) (Provider, string, error) {
	if model == "" || model == s.Default || slices.Contains(s.Names, model) {
		if model == "" {
			model = s.Default
		}
		return s.Provider, model, nil
	}
	return nil, "", fmt.Errorf("unknown model %q: this operator serves %s (provider %s): %w",
		model, strings.Join(s.Models(), ", "), s.Provider.Name(), errs.InvalidArgument)
}

// Models implements Router.
func (s Single) Models() []string {
	out := slices.Clone(s.Names)
	if s.Default != "" && !slices.Contains(out, s.Default) {
		out = append([]string{s.Default}, out...)
	}
	return out
}
