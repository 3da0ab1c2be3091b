package catalog

import (
	_ "embed"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/pkg/errs"
)

//go:embed models.json
var embedded []byte

// FormatVersion is the catalog file format this package reads: the
// "version" field every catalog file must hold.
const FormatVersion = 1

// EmbeddedSource is the Source of entries from the embedded models.json.
const EmbeddedSource = "embedded models.json"

// LocalSource is the Source of entries declared with AddLocal.
const LocalSource = "local"

// Capabilities are what a model accepts.
type Capabilities struct {
	// Tools: the model can be given tools and asked to call them.
	Tools bool
	// Streaming: the provider can stream the model's text.
	Streaming bool
	// Images: messages may hold images.
	Images bool
}

// Price is what a model costs, in USD per million tokens of each kind.
type Price struct {
	Input      decimal.Decimal
	Output     decimal.Decimal
	CacheRead  decimal.Decimal
	CacheWrite decimal.Decimal
}

// LongContext is a second price tier that applies to a whole call when its
// prompt is longer than AboveInputTokens: Gemini 2.5 Pro above 200k
// prompt tokens, Claude Sonnet 4/4.5 with the 1M-token context beta.
type LongContext struct {
	// AboveInputTokens is compared with the call's input, cache read and
	// cache write tokens together.
	AboveInputTokens uint64
	Price            Price
}

// Model is one catalog entry.
type Model struct {
	// Name is the canonical name, the one sent to the provider.
	Name string
	// Provider names the provider that serves the model: "anthropic",
	// "openai", "gemini", "scripted", or one an override or AddLocal
	// declares (an OpenAI-compatible server such as "ollama"). The
	// router maps it to a configured provider and picks the API.
	Provider string
	// Aliases are other names that resolve to the model, typically dated
	// snapshots ("claude-sonnet-4-5-20250929").
	Aliases []string
	// ContextWindow and MaxOutput are token limits; 0 means unknown.
	ContextWindow int
	MaxOutput     int
	Capabilities  Capabilities
	// Price is the standard price.
	Price Price
	// LongContext is the price above a prompt length, nil when the price
	// is flat.
	LongContext *LongContext
	// Notes is free text from the catalog file.
	Notes string
	// Source is where the entry came from: EmbeddedSource, an override
	// file's path, or LocalSource.
	Source string
}

// clone returns a copy of m sharing nothing mutable with it.
func (m Model) clone() Model {
	m.Aliases = slices.Clone(m.Aliases)
	if m.LongContext != nil {
		lc := *m.LongContext
		m.LongContext = &lc
	}
	return m
}

// Catalog is a set of models, indexed by name and alias. It is safe for
// concurrent use; AddLocal is meant for start-up.
type Catalog struct {
	version int
	updated string

	mu     sync.RWMutex
	models map[string]*Model // by canonical name
	index  map[string]string // name or alias -> canonical name
}

// Load returns the embedded catalog merged with the override file at path
// override, when it is not empty. An override entry replaces the embedded
// entry of the same name (aliases included) and adds any other. The merged
// catalog must not hold a name or alias twice. Errors name the file, the
// entry and the field, and wrap errs.InvalidArgument (a file that cannot
// be read: the os error).
func Load(override string) (*Catalog, error) {
	base, err := parse(embedded, EmbeddedSource)
	if err != nil {
		return nil, err
	}
	if override == "" {
		return build(base, nil)
	}
	data, err := os.ReadFile(override)
	if err != nil {
		return nil, fmt.Errorf("catalog override: %w", err)
	}
	over, err := parse(data, override)
	if err != nil {
		return nil, err
	}
	return build(base, over)
}

// Parse returns the catalog held by data alone, a file in the models.json
// format, without the embedded models. source names it in errors.
func Parse(data []byte, source string) (*Catalog, error) {
	f, err := parse(data, source)
	if err != nil {
		return nil, err
	}
	return build(f, nil)
}

// Embedded returns a copy of the embedded models.json.
func Embedded() []byte { return slices.Clone(embedded) }

// build merges the override into the base file and indexes the result.
func build(base, over *file) (*Catalog, error) {
	c := &Catalog{
		version: base.version,
		updated: base.updated,
		models:  make(map[string]*Model),
		index:   make(map[string]string),
	}
	merged := slices.Clone(base.models)
	if over != nil {
		for _, m := range over.models {
			i := slices.IndexFunc(merged, func(b Model) bool { return b.Name == m.Name })
			if i >= 0 {
				merged[i] = m
			} else {
				merged = append(merged, m)
			}
		}
	}
	for _, m := range merged {
		if err := c.add(m); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// add indexes m; the caller holds mu or owns c.
func (c *Catalog) add(m Model) error {
	for _, n := range append([]string{m.Name}, m.Aliases...) {
		if owner, ok := c.index[n]; ok {
			other := c.models[owner]
			return fmt.Errorf("catalog %s: model %q: %s %q is already taken by model %q (%s): %w",
				m.Source, m.Name, nameOrAlias(m, n), n, other.Name, other.Source, errs.InvalidArgument)
		}
	}
	stored := m.clone()
	c.models[m.Name] = &stored
	c.index[m.Name] = m.Name
	for _, a := range m.Aliases {
		c.index[a] = m.Name
	}
	return nil
}

func nameOrAlias(m Model, n string) string {
	if n == m.Name {
		return "name"
	}
	return "alias"
}

// Version is the catalog format version of the embedded file.
func (c *Catalog) Version() int { return c.version }

// Updated is the date (YYYY-MM-DD) the embedded file's prices were taken.
func (c *Catalog) Updated() string { return c.updated }

// Lookup returns the model called name, by canonical name or alias.
func (c *Catalog) Lookup(name string) (Model, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	canonical, ok := c.index[name]
	if !ok {
		return Model{}, false
	}
	return c.models[canonical].clone(), true
}

// Resolve is Lookup for names that come from configuration or a caller:
// an unknown name is an error wrapping errs.InvalidArgument that lists the
// known models, so a misspelt model fails at start-up, not mid-run.
func (c *Catalog) Resolve(name string) (Model, error) {
	if m, ok := c.Lookup(name); ok {
		return m, nil
	}
	return Model{}, fmt.Errorf("unknown model %q; known models: %s: %w",
		name, strings.Join(c.Names(), ", "), errs.InvalidArgument)
}

// Models returns every model, sorted by name.
func (c *Catalog) Models() []Model {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Model, 0, len(c.models))
	for _, m := range c.models {
		out = append(out, m.clone())
	}
	slices.SortFunc(out, func(a, b Model) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Names returns the canonical names, sorted.
func (c *Catalog) Names() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]string, 0, len(c.models))
	for n := range c.models {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ForProvider returns the models a provider serves, sorted by name.
func (c *Catalog) ForProvider(provider string) []Model {
	return slices.DeleteFunc(c.Models(), func(m Model) bool { return m.Provider != provider })
}

// AddLocal declares a model served by an OpenAI-compatible server (Ollama,
// vLLM, llama.cpp, LM Studio) that the catalog does not know: zero price,
// unknown context window and output limit, tools and streaming assumed,
// no images. provider is the name the router knows the server by. A model
// that needs more (limits, images, a price) is declared in an override
// file instead. Declaring a name or alias already known is an error
// wrapping errs.AlreadyExists, so a local model never silently shadows a
// priced one; an invalid name or provider wraps errs.InvalidArgument.
func (c *Catalog) AddLocal(name, provider string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("catalog: local model %q: name: %s: %w", name, err, errs.InvalidArgument)
	}
	if err := checkProvider(provider); err != nil {
		return fmt.Errorf("catalog: local model %q: provider: %s: %w", name, err, errs.InvalidArgument)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if owner, ok := c.index[name]; ok {
		return fmt.Errorf("catalog: local model %q: the name is already taken by model %q (%s): %w",
			name, owner, c.models[owner].Source, errs.AlreadyExists)
	}
	return c.add(Model{
		Name:         name,
		Provider:     provider,
		Capabilities: Capabilities{Tools: true, Streaming: true},
		Source:       LocalSource,
	})
}
