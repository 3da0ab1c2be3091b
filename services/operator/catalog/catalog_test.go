package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func TestEmbeddedLoadsAndEveryEntryIsValid(t *testing.T) {
	c, err := Load("")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.Version() != FormatVersion {
		t.Errorf("Version = %d, want %d", c.Version(), FormatVersion)
	}
	if _, err := time.Parse(time.DateOnly, c.Updated()); err != nil {
		t.Errorf("Updated = %q: %v", c.Updated(), err)
	}
	known := map[string]bool{"anthropic": true, "openai": true, "gemini": true, "scripted": true}
	providers := map[string]int{}
	for _, m := range c.Models() {
		providers[m.Provider]++
		if !known[m.Provider] {
			t.Errorf("%s: provider %q is not one the operator ships", m.Name, m.Provider)
		}
		if m.Source != EmbeddedSource {
			t.Errorf("%s: Source = %q", m.Name, m.Source)
		}
		if m.Provider == "scripted" {
			if !m.Free() {
				t.Errorf("scripted must be free: %+v", m.Price)
			}
			continue
		}
		if m.ContextWindow <= 0 || m.MaxOutput <= 0 || m.MaxOutput > m.ContextWindow {
			t.Errorf("%s: limits %d/%d", m.Name, m.ContextWindow, m.MaxOutput)
		}
		if !m.Capabilities.Tools || !m.Capabilities.Streaming {
			t.Errorf("%s: capabilities %+v", m.Name, m.Capabilities)
		}
		if m.Price.Input.IsZero() || m.Price.Output.IsZero() || m.Price.CacheRead.IsZero() {
			t.Errorf("%s: a real model with a zero price: %+v", m.Name, m.Price)
		}
		// Output costs more than input, and cache reads less, everywhere.
		if !m.Price.Output.GreaterThan(m.Price.Input) || !m.Price.CacheRead.LessThan(m.Price.Input) {
			t.Errorf("%s: implausible price %+v", m.Name, m.Price)
		}
		if lc := m.LongContext; lc != nil && !lc.Price.Input.GreaterThan(m.Price.Input) {
			t.Errorf("%s: long-context tier is not dearer", m.Name)
		}
		for _, a := range m.Aliases {
			got, ok := c.Lookup(a)
			if !ok || got.Name != m.Name {
				t.Errorf("alias %q resolves to %q, %v", a, got.Name, ok)
			}
		}
	}
	for _, p := range []string{"anthropic", "openai", "gemini", "scripted"} {
		if providers[p] == 0 {
			t.Errorf("no %s models", p)
		}
	}
	for _, n := range []string{
		"claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-5",
		"gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4.1-mini", "o4-mini", "gpt-5",
		"gemini-2.5-pro", "gemini-2.5-flash", "gemini-2.0-flash", "scripted",
	} {
		if _, err := c.Resolve(n); err != nil {
			t.Errorf("Resolve(%q): %v", n, err)
		}
	}
	// The embedded file is strictly formatted JSON a person can edit.
	var anyJSON map[string]any
	if err := json.Unmarshal(Embedded(), &anyJSON); err != nil {
		t.Fatal(err)
	}
}

func TestCostExact(t *testing.T) {
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		model string
		usage provider.Usage
		want  string
	}{
		{
			// 3/15/0.30/3.75 per Mtok:
			//   1234 × 3    =  3702
			//    567 × 15   =  8505
			//   1000 × 0.30 =   300
			//    200 × 3.75 =   750
			//   sum 13257 / 1e6 = 0.013257
			name:  "sonnet mixed usage",
			model: "claude-sonnet-4-5",
			usage: provider.Usage{InputTokens: 1234, OutputTokens: 567, CacheReadTokens: 1000, CacheWriteTokens: 200},
			want:  "0.013257",
		},
		{
			// by alias, same model
			name:  "sonnet by dated alias",
			model: "claude-sonnet-4-5-20250929",
			usage: provider.Usage{InputTokens: 1234, OutputTokens: 567, CacheReadTokens: 1000, CacheWriteTokens: 200},
			want:  "0.013257",
		},
		{
			// 0.15/0.60/0.075 per Mtok:
			//   123 × 0.15  = 18.45
			//    45 × 0.60  = 27
			//     6 × 0.075 =  0.45
			//   sum 45.9 / 1e6 = 0.0000459
			name:  "gpt-4o-mini small",
			model: "gpt-4o-mini",
			usage: provider.Usage{InputTokens: 123, OutputTokens: 45, CacheReadTokens: 6},
			want:  "0.0000459",
		},
		{
			// 1e6 input tokens at 1 = 1; 1e6 output at 5 = 5
			name:  "haiku one million each",
			model: "claude-haiku-4-5",
			usage: provider.Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000},
			want:  "6",
		},
		{
			// 15/75/1.50/18.75: 1×15 + 1×75 + 1×1.50 + 1×18.75 = 110.25 → 0.00011025
			name:  "opus 4.1 one of each",
			model: "claude-opus-4-1",
			usage: provider.Usage{InputTokens: 1, OutputTokens: 1, CacheReadTokens: 1, CacheWriteTokens: 1},
			want:  "0.00011025",
		},
		{
			// prompt 150000 + 50000 = 200000, not above the threshold:
			// base 1.25/10/0.125: 187500 + 1000×10=10000 + 50000×0.125=6250
			//   = 203750 / 1e6 = 0.20375
			name:  "gemini-2.5-pro at the threshold",
			model: "gemini-2.5-pro",
			usage: provider.Usage{InputTokens: 150000, OutputTokens: 1000, CacheReadTokens: 50000},
			want:  "0.20375",
		},
		{
			// prompt 150001 + 50000 = 200001 > 200000: long tier 2.50/15/0.25
			//   150001 × 2.50 = 375002.5
			//     1000 × 15   =  15000
			//    50000 × 0.25 =  12500
			//   sum 402502.5 / 1e6 = 0.4025025
			name:  "gemini-2.5-pro above the threshold",
			model: "gemini-2.5-pro",
			usage: provider.Usage{InputTokens: 150001, OutputTokens: 1000, CacheReadTokens: 50000},
			want:  "0.4025025",
		},
		{name: "zero usage", model: "gpt-4.1", want: "0"},
		{name: "scripted is free", model: "scripted", usage: provider.Usage{InputTokens: 99, OutputTokens: 99}, want: "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := c.Resolve(tt.model)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Cost(tt.usage).String(); got != tt.want {
				t.Errorf("Cost = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestLookupAndResolve(t *testing.T) {
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	m, ok := c.Lookup("gpt-4o-2024-11-20")
	if !ok || m.Name != "gpt-4o" || m.Provider != "openai" {
		t.Fatalf("Lookup alias = %+v, %v", m, ok)
	}
	if _, ok := c.Lookup("GPT-4o"); ok {
		t.Error("names are case-sensitive")
	}
	// Returned models share nothing with the catalog.
	m.Aliases[0] = "mutated"
	if again, _ := c.Lookup("gpt-4o"); again.Aliases[0] == "mutated" {
		t.Error("Lookup returned shared aliases")
	}
	_, err = c.Resolve("gpt-9")
	if !errors.Is(err, errs.InvalidArgument) {
		t.Fatalf("Resolve unknown: %v, want InvalidArgument", err)
	}
	want := `unknown model "gpt-9"; known models: ` + strings.Join(c.Names(), ", ") + ": invalid argument"
	if err.Error() != want {
		t.Errorf("error = %q\nwant    %q", err, want)
	}
	if _, err := c.Resolve(""); !errors.Is(err, errs.InvalidArgument) {
		t.Errorf("Resolve empty: %v", err)
	}
	names := c.Names()
	if !slices.IsSorted(names) || slices.Contains(names, "gpt-4o-2024-11-20") {
		t.Errorf("Names = %v: sorted canonical names only", names)
	}
	for _, m := range c.ForProvider("gemini") {
		if m.Provider != "gemini" {
			t.Errorf("ForProvider(gemini) has %s", m.Name)
		}
	}
	if len(c.ForProvider("gemini")) < 3 {
		t.Error("ForProvider(gemini) too short")
	}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "override.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const free = `"price_per_mtok": {"input": "0", "output": "0", "cache_read": "0", "cache_write": "0"}`

func TestOverride(t *testing.T) {
	path := writeFile(t, `{
	  "version": 1,
	  "updated": "2026-11-01",
	  "models": [
	    {"name": "gpt-4o", "provider": "openai", "context_window": 128000, "max_output": 16384,
	     "capabilities": {"tools": true, "streaming": true},
	     "price_per_mtok": {"input": "2", "output": "8", "cache_read": "1", "cache_write": "2"}},
	    {"name": "llama3.1:8b", "provider": "ollama", "context_window": 131072, `+free+`},
	    {"name": "claude-sonnet-4-5", "provider": "anthropic", `+free+`},
	    {"name": "claude-sonnet-4-5-20250929", "provider": "anthropic", `+free+`}
	  ]
	}`)
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	gpt, _ := c.Lookup("gpt-4o")
	if gpt.Source != path || gpt.Price.Input.String() != "2" || len(gpt.Aliases) != 0 || gpt.Capabilities.Images {
		t.Errorf("replaced gpt-4o = %+v", gpt)
	}
	// The replaced entry's aliases are gone with it.
	if _, ok := c.Lookup("gpt-4o-2024-08-06"); ok {
		t.Error("alias of a replaced entry still resolves")
	}
	// An override may reuse a replaced entry's alias as a name.
	if m, ok := c.Lookup("claude-sonnet-4-5-20250929"); !ok || m.Name != "claude-sonnet-4-5-20250929" {
		t.Errorf("re-declared snapshot = %+v, %v", m, ok)
	}
	llama, ok := c.Lookup("llama3.1:8b")
	if !ok || llama.Provider != "ollama" || llama.ContextWindow != 131072 || !llama.Free() {
		t.Errorf("added llama = %+v, %v", llama, ok)
	}
	// Untouched embedded entries stay.
	if m, ok := c.Lookup("gemini-2.5-flash"); !ok || m.Source != EmbeddedSource {
		t.Errorf("gemini-2.5-flash = %+v, %v", m, ok)
	}
	// The catalog's date is the embedded file's.
	base, _ := Load("")
	if c.Updated() != base.Updated() || len(c.Models()) != len(base.Models())+2 {
		t.Errorf("Updated %q, %d models", c.Updated(), len(c.Models()))
	}
}

func TestOverrideErrors(t *testing.T) {
	t.Run("missing file", func(t *testing.T) {
		_, err := Load(filepath.Join(t.TempDir(), "nope.json"))
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("alias clashes with an embedded model", func(t *testing.T) {
		path := writeFile(t, `{"version": 1, "models": [
		  {"name": "my-model", "provider": "ollama", "aliases": ["gpt-4o-mini"], `+free+`}]}`)
		_, err := Load(path)
		want := `catalog ` + path + `: model "my-model": alias "gpt-4o-mini" is already taken by model "gpt-4o-mini" (embedded models.json): invalid argument`
		if err == nil || err.Error() != want {
			t.Errorf("err = %v\nwant  %s", err, want)
		}
	})
	t.Run("name clashes with an embedded alias", func(t *testing.T) {
		path := writeFile(t, `{"version": 1, "models": [
		  {"name": "gpt-4o-2024-08-06", "provider": "openai", `+free+`}]}`)
		_, err := Load(path)
		if !errors.Is(err, errs.InvalidArgument) || !strings.Contains(err.Error(), `name "gpt-4o-2024-08-06" is already taken by model "gpt-4o"`) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("invalid override", func(t *testing.T) {
		path := writeFile(t, `{"version": 1, "models": [{"name": "x", "provider": "ollama"}]}`)
		_, err := Load(path)
		if !errors.Is(err, errs.InvalidArgument) || !strings.HasPrefix(err.Error(), "catalog "+path+`: models[0] "x": price_per_mtok: required`) {
			t.Errorf("err = %v", err)
		}
	})
}

func TestParseErrors(t *testing.T) {
	const price = `"price_per_mtok": {"input": "3", "output": "15", "cache_read": "0.30", "cache_write": "3.75"}`
	file := func(models string) string { return `{"version": 1, "models": [` + models + `]}` }
	tests := []struct {
		name string
		json string
		want string // the message after "catalog test.json: ", before ": invalid argument"
	}{
		{"unknown top-level field", `{"version": 1, "models": [], "modles": []}`, `modles: unknown field`},
		{"missing version", `{"models": []}`, `version: required (this build reads version 1)`},
		{"future version", `{"version": 2, "models": []}`, `version: unsupported catalog format version 2; this build reads version 1`},
		{"version as string", `{"version": "1", "models": []}`, `version: expected an integer, got JSON string`},
		{"bad date", `{"version": 1, "updated": "01/11/2026", "models": []}`, `updated: must be a date such as "2025-11-24", got "01/11/2026"`},
		{"missing models", `{"version": 1}`, `models: required (an array of models, possibly empty)`},
		{"models not an array", `{"version": 1, "models": {}}`, `models: expected an array, got JSON object`},
		{"syntax error", "{\"version\": 1,\n \"models\": [}", `invalid JSON at line 2, column 13: invalid character '}' looking for beginning of value`},
		{"trailing data", `{"version": 1, "models": []} {}`, `unexpected data after the JSON value`},
		{"empty", ``, `empty: expected a JSON object`},
		{"entry not an object", file(`"gpt-4o"`), `models[0]: expected an object, got JSON string`},
		{"entry null", file(`null`), `models[0]: expected an object, got JSON null`},
		{"unknown entry field", file(`{"name": "a", "provider": "p", "colour": "red", ` + price + `}`), `models[0] "a": colour: unknown field`},
		{"unknown capability", file(`{"name": "a", "provider": "p", "capabilities": {"vision": true}, ` + price + `}`), `models[0] "a": capabilities.vision: unknown field`},
		{"capability not bool", file(`{"name": "a", "provider": "p", "capabilities": {"tools": "yes"}, ` + price + `}`), `models[0] "a": capabilities.tools: expected true or false, got JSON string`},
		{"unknown price field", file(`{"name": "a", "provider": "p", "price_per_mtok": {"input": "1", "output": "1", "cache_read": "1", "cache_write": "1", "batch": "1"}}`), `models[0] "a": price_per_mtok.batch: unknown field`},
		{"missing name", file(`{"provider": "p", ` + price + `}`), `models[0]: name: required`},
		{"name with space", file(`{"name": "gpt 4o", "provider": "p", ` + price + `}`), `models[0] "gpt 4o": name: "gpt 4o" holds whitespace, a control character or a comma`},
		{"missing provider", file(`{"name": "a", ` + price + `}`), `models[0] "a": provider: required`},
		{"bad provider", file(`{"name": "a", "provider": "Open AI", ` + price + `}`), `models[0] "a": provider: "Open AI" must be lowercase letters, digits, '.', '_' or '-' (such as "anthropic" or "ollama")`},
		{"provider too long", file(`{"name": "a", "provider": "` + strings.Repeat("p", 65) + `", ` + price + `}`), `models[0] "a": provider: "` + strings.Repeat("p", 65) + `" must be lowercase letters, digits, '.', '_' or '-' (such as "anthropic" or "ollama")`},
		{"alias is own name", file(`{"name": "a", "provider": "p", "aliases": ["b", "a"], ` + price + `}`), `models[0] "a": aliases[1]: "a" is the model's own name`},
		{"duplicate alias", file(`{"name": "a", "provider": "p", "aliases": ["b", "b"], ` + price + `}`), `models[0] "a": aliases[1]: duplicate of aliases[0] "b"`},
		{"empty alias", file(`{"name": "a", "provider": "p", "aliases": [""], ` + price + `}`), `models[0] "a": aliases[0]: required`},
		{"negative context", file(`{"name": "a", "provider": "p", "context_window": -1, ` + price + `}`), `models[0] "a": context_window: must not be negative, got -1 (0 means unknown)`},
		{"negative output", file(`{"name": "a", "provider": "p", "max_output": -5, ` + price + `}`), `models[0] "a": max_output: must not be negative, got -5 (0 means unknown)`},
		{"output over context", file(`{"name": "a", "provider": "p", "context_window": 1000, "max_output": 2000, ` + price + `}`), `models[0] "a": max_output: 2000 exceeds context_window 1000`},
		{"context as string", file(`{"name": "a", "provider": "p", "context_window": "200k", ` + price + `}`), `models[0] "a": context_window: expected an integer, got JSON string`},
		{"missing price", file(`{"name": "a", "provider": "p"}`), `models[0] "a": price_per_mtok: required, e.g. {"input": "3", "output": "15", "cache_read": "0.30", "cache_write": "3.75"}`},
		{"missing cache_write", file(`{"name": "a", "provider": "p", "price_per_mtok": {"input": "3", "output": "15", "cache_read": "0.30"}}`), `models[0] "a": price_per_mtok.cache_write: required, a decimal string such as "3.75" (USD per million tokens; "0" when free)`},
		{"price as number", file(`{"name": "a", "provider": "p", "price_per_mtok": {"input": 3, "output": "15", "cache_read": "0.30", "cache_write": "3.75"}}`), `models[0] "a": price_per_mtok.input: must be a decimal string such as "3.75", got JSON 3`},
		{"negative price", file(`{"name": "a", "provider": "p", "price_per_mtok": {"input": "3", "output": "-15", "cache_read": "0.30", "cache_write": "3.75"}}`), `models[0] "a": price_per_mtok.output: must not be negative, got "-15"`},
		{"exponent price", file(`{"name": "a", "provider": "p", "price_per_mtok": {"input": "3", "output": "15", "cache_read": "3e-1", "cache_write": "3.75"}}`), `models[0] "a": price_per_mtok.cache_read: must be a decimal string such as "3.75", got "3e-1"`},
		{"garbage price", file(`{"name": "a", "provider": "p", "price_per_mtok": {"input": "3", "output": "15", "cache_read": "0.30", "cache_write": "$3.75"}}`), `models[0] "a": price_per_mtok.cache_write: must be a decimal string such as "3.75", got "$3.75"`},
		{"long context without threshold", file(`{"name": "a", "provider": "p", ` + price + `, "long_context": {` + price + `}}`), `models[0] "a": long_context.above_input_tokens: required, a positive token count`},
		{"long context negative price", file(`{"name": "a", "provider": "p", ` + price + `, "long_context": {"above_input_tokens": 5, "price_per_mtok": {"input": "-6", "output": "1", "cache_read": "1", "cache_write": "1"}}}`), `models[0] "a": long_context.price_per_mtok.input: must not be negative, got "-6"`},
		{"long context unknown field", file(`{"name": "a", "provider": "p", ` + price + `, "long_context": {"above": 5}}`), `models[0] "a": long_context.above: unknown field`},
		{"duplicate name", file(`{"name": "a", "provider": "p", ` + price + `}, {"name": "a", "provider": "q", ` + price + `}`), `models[1] "a": name: duplicate: models[0] has the same name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.json), "test.json")
			if !errors.Is(err, errs.InvalidArgument) {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			want := "catalog test.json: " + tt.want + ": invalid argument"
			if err.Error() != want {
				t.Errorf("err  = %s\nwant = %s", err, want)
			}
		})
	}
	t.Run("provider of 64 bytes", func(t *testing.T) {
		if _, err := Parse([]byte(file(`{"name": "a", "provider": "`+strings.Repeat("p", 64)+`", `+price+`}`)), "test.json"); err != nil {
			t.Errorf("err = %v, want nil", err)
		}
	})
	t.Run("alias taken by another entry", func(t *testing.T) {
		_, err := Parse([]byte(file(`{"name": "a", "provider": "p", "aliases": ["x"], `+price+`}, {"name": "b", "provider": "p", "aliases": ["x"], `+price+`}`)), "test.json")
		want := `catalog test.json: model "b": alias "x" is already taken by model "a" (test.json): invalid argument`
		if err == nil || err.Error() != want {
			t.Errorf("err = %v\nwant  %s", err, want)
		}
	})
}

func TestAddLocal(t *testing.T) {
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddLocal("qwen2.5-coder:7b", "ollama"); err != nil {
		t.Fatal(err)
	}
	m, err := c.Resolve("qwen2.5-coder:7b")
	if err != nil {
		t.Fatal(err)
	}
	want := Model{Name: "qwen2.5-coder:7b", Provider: "ollama", Capabilities: Capabilities{Tools: true, Streaming: true}, Source: LocalSource}
	if m.Name != want.Name || m.Provider != want.Provider || m.Capabilities != want.Capabilities ||
		m.Source != want.Source || m.ContextWindow != 0 || m.MaxOutput != 0 || !m.Free() {
		t.Errorf("local model = %+v", m)
	}
	if got := m.Cost(provider.Usage{InputTokens: 1e9, OutputTokens: 1e9}); !got.IsZero() {
		t.Errorf("local cost = %s", got)
	}
	for _, tt := range []struct {
		name, provider string
		kind           *errs.Kind
		want           string
	}{
		{"qwen2.5-coder:7b", "ollama", errs.AlreadyExists, `catalog: local model "qwen2.5-coder:7b": the name is already taken by model "qwen2.5-coder:7b" (local): already exists`},
		{"gpt-4o-2024-08-06", "ollama", errs.AlreadyExists, `catalog: local model "gpt-4o-2024-08-06": the name is already taken by model "gpt-4o" (embedded models.json): already exists`},
		{"", "ollama", errs.InvalidArgument, `catalog: local model "": name: required: invalid argument`},
		{"llama", "", errs.InvalidArgument, `catalog: local model "llama": provider: required: invalid argument`},
	} {
		err := c.AddLocal(tt.name, tt.provider)
		if !errors.Is(err, tt.kind) || err.Error() != tt.want {
			t.Errorf("AddLocal(%q, %q) = %v\nwant %s", tt.name, tt.provider, err, tt.want)
		}
	}
}

func TestConcurrentAddLocalAndLookup(t *testing.T) {
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			_ = c.AddLocal("local-"+string(rune('a'+i)), "ollama")
		})
		wg.Go(func() {
			c.Lookup("gpt-4o")
			c.Models()
			_, _ = c.Resolve("nope")
		})
	}
	wg.Wait()
	if len(c.ForProvider("ollama")) != 8 {
		t.Errorf("ollama models = %d", len(c.ForProvider("ollama")))
	}
}

func TestRouter(t *testing.T) {
	cat, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.AddLocal("llama3.2", "openai-compatible"); err != nil {
		t.Fatal(err)
	}
	anth := namedProvider("anthropic")
	local := namedProvider("openai-compatible")
	r := Router{Catalog: cat, Default: "claude-sonnet-4-5",
		Providers:   map[string]provider.Provider{"anthropic": anth, "openai-compatible": local},
		Credentials: map[string]string{"gemini": "GEMINI_API_KEY"}}
	tests := []struct {
		name, model, wantProvider, wantModel, wantErr string
	}{
		{"default", "", "anthropic", "claude-sonnet-4-5", ""},
		{"local model", "llama3.2", "openai-compatible", "llama3.2", ""},
		{"provider not configured", "gemini-2.5-flash", "", "", "GEMINI_API_KEY"},
		{"unknown", "gpt-17", "", "", `unknown model "gpt-17"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, m, err := r.Route(tt.model)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || errs.Code(err) != errs.InvalidArgument.Code() {
					t.Fatalf("err %v, want INVALID_ARGUMENT mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || p.Name() != tt.wantProvider || m != tt.wantModel {
				t.Fatalf("got %v %q %v", p, m, err)
			}
		})
	}
	for _, m := range r.Models() {
		if mm, _ := cat.Lookup(m); mm.Provider != "anthropic" && mm.Provider != "openai-compatible" {
			t.Fatalf("Models lists %s of unconfigured provider %s", m, mm.Provider)
		}
	}
}

type namedProvider string

func (n namedProvider) Name() string { return string(n) }
func (n namedProvider) Complete(context.Context, *provider.Request) (*provider.Response, error) {
	return nil, nil
}
