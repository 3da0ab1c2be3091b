package providers

import (
	"slices"
	"strings"
)

// Descriptor is what the binaries know of one model provider.
type Descriptor struct {
	// Name is the provider's name, the one catalog entries name and the
	// provider reports ("anthropic").
	Name string
	// Title names the provider in help text ("Anthropic").
	Title string
	// KeyEnv are the environment variables that hold the API key, in
	// order of precedence; the first is the one deployments set. Empty:
	// the provider needs no key, and a base URL enables it.
	KeyEnv []string
	// BaseURLEnv is the environment variable of the API's base URL.
	// For a provider without KeyEnv it is read only when no provider
	// sharing the variable has a key (OPENAI_BASE_URL points the OpenAI
	// provider elsewhere when OPENAI_API_KEY is set, and enables the
	// OpenAI-compatible provider when it is not).
	BaseURLEnv string
	// Host is the host of the public API: the operator sends to
	// https://Host+BasePath when no base URL is configured, egress rules
	// allow it, and the environment's egress proxy injects a key for it.
	// Empty: there is no public API (a local server).
	Host string
	// BasePath is the path of the public API below Host that a base URL
	// includes ("/v1"), or empty.
	BasePath string
	// DefaultModel is the model used when the operator is given no
	// --model and this is the first provider with credentials. Empty:
	// the model must be named.
	DefaultModel string
	// Flag prefixes the operator's flags for the provider:
	// --<Flag>-key-file and --<Flag>-base-url.
	Flag string
	// KeyFileUsage and BaseURLUsage override the generated help of the
	// two flags.
	KeyFileUsage, BaseURLUsage string
}

const openAIBaseURLEnv = "OPENAI_BASE_URL"

// All returns the providers in the operator's order of preference: with
// no --model, the default model is that of the first one with a key.
func All() []Descriptor {
	return []Descriptor{
		{
			Name: "anthropic", Title: "Anthropic",
			KeyEnv: []string{"ANTHROPIC_API_KEY"}, BaseURLEnv: "ANTHROPIC_BASE_URL",
			Host:         "api.anthropic.com",
			DefaultModel: "claude-sonnet-4-5",
			Flag:         "anthropic",
		},
		{
			Name: "openai", Title: "OpenAI",
			KeyEnv: []string{"OPENAI_API_KEY"}, BaseURLEnv: openAIBaseURLEnv,
			Host: "api.openai.com", BasePath: "/v1",
			DefaultModel: "gpt-4.1-mini",
			Flag:         "openai",
		},
		{
			Name: "gemini", Title: "Gemini",
			KeyEnv: []string{"GEMINI_API_KEY", "GOOGLE_API_KEY"}, BaseURLEnv: "GOOGLE_GEMINI_BASE_URL",
			Host:         "generativelanguage.googleapis.com",
			DefaultModel: "gemini-2.5-flash",
			Flag:         "gemini",
		},
		{
			// A server that speaks the Chat Completions API: Ollama,
			// vLLM, llama.cpp, LM Studio.
			Name: "openai-compatible", Title: "OpenAI-compatible server",
			BaseURLEnv:   openAIBaseURLEnv,
			Flag:         "compatible",
			KeyFileUsage: "file holding the key of the OpenAI-compatible server, if it needs one",
			BaseURLUsage: "base URL of an OpenAI-compatible server such as Ollama or vLLM, e.g. http://127.0.0.1:11434/v1 (default: $" + openAIBaseURLEnv + " when no OpenAI key is set)",
		},
	}
}

// KeyFileFlag is the name of the operator's flag of the key file.
func (d Descriptor) KeyFileFlag() string { return d.Flag + "-key-file" }

// BaseURLFlag is the name of the operator's flag of the base URL.
func (d Descriptor) BaseURLFlag() string { return d.Flag + "-base-url" }

// DefaultBaseURL is the public API's base URL, "https://" + Host +
// BasePath, or empty without a Host.
func (d Descriptor) DefaultBaseURL() string {
	if d.Host == "" {
		return ""
	}
	return "https://" + d.Host + d.BasePath
}

// EnableVar is the variable that enables the provider: its first key
// variable, else its base URL variable.
func (d Descriptor) EnableVar() string {
	if len(d.KeyEnv) > 0 {
		return d.KeyEnv[0]
	}
	return d.BaseURLEnv
}

// Credential says what to set to enable the provider, for error
// messages: "ANTHROPIC_API_KEY or --anthropic-key-file".
func (d Descriptor) Credential() string {
	if len(d.KeyEnv) > 0 {
		return d.KeyEnv[0] + " or --" + d.KeyFileFlag()
	}
	return d.BaseURLEnv + " or --" + d.BaseURLFlag()
}

// KeyFileHelp is the help of the operator's --<Flag>-key-file.
func (d Descriptor) KeyFileHelp() string {
	if d.KeyFileUsage != "" {
		return d.KeyFileUsage
	}
	return "file holding the " + d.Title + " API key (default: $" + strings.Join(d.KeyEnv, ", then $") + ")"
}

// BaseURLHelp is the help of the operator's --<Flag>-base-url.
func (d Descriptor) BaseURLHelp() string {
	if d.BaseURLUsage != "" {
		return d.BaseURLUsage
	}
	with := ""
	if d.BasePath != "" {
		with = ", with " + d.BasePath
	}
	return d.Title + " API base URL" + with + " (default: $" + d.BaseURLEnv + ", else the public API)"
}

// ModelVars are the variables that configure a real model, in the
// operator's order of preference: every key variable, then the base URL
// variables of the providers that need no key.
func ModelVars() []string {
	var keys, urls []string
	for _, d := range All() {
		keys = append(keys, d.KeyEnv...)
		if len(d.KeyEnv) == 0 {
			urls = append(urls, d.BaseURLEnv)
		}
	}
	return append(keys, urls...)
}

// EnabledBy returns the provider that variable v of ModelVars enables:
// the one with v among its key variables, else the one without key
// variables whose base URL variable is v.
func EnabledBy(v string) (Descriptor, bool) {
	all := All()
	for _, d := range all {
		if slices.Contains(d.KeyEnv, v) {
			return d, true
		}
	}
	for _, d := range all {
		if len(d.KeyEnv) == 0 && d.BaseURLEnv == v {
			return d, true
		}
	}
	return Descriptor{}, false
}

// EnableVars lists each provider's EnableVar for messages:
// "ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY or OPENAI_BASE_URL".
func EnableVars() string {
	var vars []string
	for _, d := range All() {
		vars = append(vars, d.EnableVar())
	}
	return orList(vars)
}

// orList joins items as "a, b or c".
func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}
