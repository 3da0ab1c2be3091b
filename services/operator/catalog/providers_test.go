package catalog

import (
	"testing"

	"github.com/secbear/neuron/services/operator/provider/providers"
)

// Every provider the operator knows has its default model in the
// built-in catalog, under its name: a provider added to providers.All
// without its models here would leave the operator unable to route its
// default model.
func TestBuiltinCoversProviders(t *testing.T) {
	cat, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range providers.All() {
		if d.DefaultModel == "" {
			continue
		}
		m, ok := cat.Lookup(d.DefaultModel)
		if !ok {
			t.Errorf("provider %q: default model %q is not in the built-in catalog", d.Name, d.DefaultModel)
			continue
		}
		if m.Provider != d.Name {
			t.Errorf("provider %q: default model %q is served by %q in the catalog", d.Name, d.DefaultModel, m.Provider)
		}
	}
}
