package providers

import (
	"net/url"
	"regexp"
	"slices"
	"testing"
)

// The list is consistent: names, flags and variables are unique where
// they must be, and every provider can be enabled.
func TestAllConsistent(t *testing.T) {
	names, flags, keys := map[string]bool{}, map[string]bool{}, map[string]string{}
	envRE := regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	for _, d := range All() {
		if d.Name == "" || names[d.Name] {
			t.Errorf("provider %q: empty or duplicate name", d.Name)
		}
		names[d.Name] = true
		if d.Flag == "" || flags[d.Flag] {
			t.Errorf("provider %q: empty or duplicate flag prefix %q", d.Name, d.Flag)
		}
		flags[d.Flag] = true
		if d.Title == "" {
			t.Errorf("provider %q: no title", d.Name)
		}
		for _, k := range d.KeyEnv {
			if other, dup := keys[k]; dup {
				t.Errorf("provider %q: key variable %s is %q's too", d.Name, k, other)
			}
			keys[k] = d.Name
			if !envRE.MatchString(k) {
				t.Errorf("provider %q: key variable %q", d.Name, k)
			}
		}
		if !envRE.MatchString(d.BaseURLEnv) {
			t.Errorf("provider %q: base URL variable %q", d.Name, d.BaseURLEnv)
		}
		if len(d.KeyEnv) > 0 && (d.Host == "" || d.DefaultModel == "") {
			t.Errorf("provider %q has keys but no public host or default model", d.Name)
		}
		if d.Host != "" {
			u, err := url.Parse(d.DefaultBaseURL())
			if err != nil || u.Host != d.Host || u.Path != d.BasePath {
				t.Errorf("provider %q: default base URL %q does not parse back (%v)", d.Name, d.DefaultBaseURL(), err)
			}
		}
	}
}

// What the binaries print is derived as it was written by hand before.
func TestDerived(t *testing.T) {
	if got, want := ModelVars(), []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENAI_BASE_URL"}; !slices.Equal(got, want) {
		t.Errorf("ModelVars() = %q, want %q", got, want)
	}
	for v, want := range map[string]string{"GOOGLE_API_KEY": "gemini", "OPENAI_API_KEY": "openai", "OPENAI_BASE_URL": "openai-compatible", "NEURON_X": ""} {
		if d, _ := EnabledBy(v); d.Name != want {
			t.Errorf("EnabledBy(%s) = %q, want %q", v, d.Name, want)
		}
	}
	if got, want := EnableVars(), "ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY or OPENAI_BASE_URL"; got != want {
		t.Errorf("EnableVars() = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		name, credential, keyFileHelp, baseURLHelp, baseURL string
	}{
		{"anthropic", "ANTHROPIC_API_KEY or --anthropic-key-file",
			"file holding the Anthropic API key (default: $ANTHROPIC_API_KEY)",
			"Anthropic API base URL (default: $ANTHROPIC_BASE_URL, else the public API)",
			"https://api.anthropic.com"},
		{"openai", "OPENAI_API_KEY or --openai-key-file",
			"file holding the OpenAI API key (default: $OPENAI_API_KEY)",
			"OpenAI API base URL, with /v1 (default: $OPENAI_BASE_URL, else the public API)",
			"https://api.openai.com/v1"},
		{"gemini", "GEMINI_API_KEY or --gemini-key-file",
			"file holding the Gemini API key (default: $GEMINI_API_KEY, then $GOOGLE_API_KEY)",
			"Gemini API base URL (default: $GOOGLE_GEMINI_BASE_URL, else the public API)",
			"https://generativelanguage.googleapis.com"},
		{"openai-compatible", "OPENAI_BASE_URL or --compatible-base-url",
			"file holding the key of the OpenAI-compatible server, if it needs one",
			"base URL of an OpenAI-compatible server such as Ollama or vLLM, e.g. http://127.0.0.1:11434/v1 (default: $OPENAI_BASE_URL when no OpenAI key is set)",
			""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := slices.IndexFunc(All(), func(d Descriptor) bool { return d.Name == tc.name })
			if i < 0 {
				t.Fatalf("no provider %q", tc.name)
			}
			d := All()[i]
			for _, c := range []struct{ what, got, want string }{
				{"Credential", d.Credential(), tc.credential},
				{"KeyFileHelp", d.KeyFileHelp(), tc.keyFileHelp},
				{"BaseURLHelp", d.BaseURLHelp(), tc.baseURLHelp},
				{"DefaultBaseURL", d.DefaultBaseURL(), tc.baseURL},
			} {
				if c.got != c.want {
					t.Errorf("%s() = %q, want %q", c.what, c.got, c.want)
				}
			}
		})
	}
}

// All hands out a fresh list: a caller cannot change another's.
func TestAllIsFresh(t *testing.T) {
	a := All()
	a[0].KeyEnv[0] = "CHANGED"
	a[0].Name = "changed"
	if b := All(); b[0].Name == "changed" || b[0].KeyEnv[0] == "CHANGED" {
		t.Errorf("All() shares its entries: %+v", b[0])
	}
}
