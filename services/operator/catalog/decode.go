package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/pkg/errs"
)

// file is one parsed catalog file.
type file struct {
	version int
	updated string
	models  []Model
}

// The wire format. Nested objects are decoded one at a time so that an
// error names the field it is in.
type fileJSON struct {
	Version *int              `json:"version"`
	Updated *string           `json:"updated"`
	Notes   string            `json:"notes"`
	Models  []json.RawMessage `json:"models"`
}

type entryJSON struct {
	Name          string          `json:"name"`
	Provider      string          `json:"provider"`
	Aliases       []string        `json:"aliases"`
	ContextWindow int             `json:"context_window"`
	MaxOutput     int             `json:"max_output"`
	Capabilities  json.RawMessage `json:"capabilities"`
	PricePerMTok  json.RawMessage `json:"price_per_mtok"`
	LongContext   json.RawMessage `json:"long_context"`
	Notes         string          `json:"notes"`
}

type capabilitiesJSON struct {
	Tools     bool `json:"tools"`
	Streaming bool `json:"streaming"`
	Images    bool `json:"images"`
}

type priceJSON struct {
	Input      json.RawMessage `json:"input"`
	Output     json.RawMessage `json:"output"`
	CacheRead  json.RawMessage `json:"cache_read"`
	CacheWrite json.RawMessage `json:"cache_write"`
}

type longContextJSON struct {
	AboveInputTokens *uint64         `json:"above_input_tokens"`
	PricePerMTok     json.RawMessage `json:"price_per_mtok"`
}

// fieldError is a problem with one field of an entry (or of the file).
type fieldError struct {
	field string // dotted path; empty for the value itself
	msg   string
}

func fieldErr(field, format string, args ...any) *fieldError {
	return &fieldError{field: field, msg: fmt.Sprintf(format, args...)}
}

func (e *fieldError) String() string {
	if e.field == "" {
		return e.msg
	}
	return e.field + ": " + e.msg
}

// parse decodes and validates one catalog file.
func parse(data []byte, source string) (*file, error) {
	fail := func(fe *fieldError) error {
		return fmt.Errorf("catalog %s: %s: %w", source, fe, errs.InvalidArgument)
	}
	var fj fileJSON
	if fe := strictDecode(data, &fj, ""); fe != nil {
		return nil, fail(fe)
	}
	if fj.Version == nil {
		return nil, fail(fieldErr("version", "required (this build reads version %d)", FormatVersion))
	}
	if *fj.Version != FormatVersion {
		return nil, fail(fieldErr("version", "unsupported catalog format version %d; this build reads version %d",
			*fj.Version, FormatVersion))
	}
	f := &file{version: *fj.Version}
	if fj.Updated != nil {
		if _, err := time.Parse(time.DateOnly, *fj.Updated); err != nil {
			return nil, fail(fieldErr("updated", "must be a date such as \"2025-11-24\", got %q", *fj.Updated))
		}
		f.updated = *fj.Updated
	}
	if fj.Models == nil {
		return nil, fail(fieldErr("models", "required (an array of models, possibly empty)"))
	}
	seen := make(map[string]int)
	for i, raw := range fj.Models {
		m, fe := parseEntry(raw)
		if fe == nil {
			if j, dup := seen[m.Name]; dup {
				fe = fieldErr("name", "duplicate: models[%d] has the same name", j)
			}
		}
		if fe != nil {
			return nil, fmt.Errorf("catalog %s: models[%d]%s: %s: %w", source, i, nameHint(raw), fe, errs.InvalidArgument)
		}
		seen[m.Name] = i
		m.Source = source
		f.models = append(f.models, m)
	}
	return f, nil
}

// nameHint is ` "name"` when the entry has a usable name, for errors.
func nameHint(raw json.RawMessage) string {
	var n struct {
		Name any `json:"name"`
	}
	if json.Unmarshal(raw, &n) != nil {
		return ""
	}
	if s, ok := n.Name.(string); ok && s != "" {
		return fmt.Sprintf(" %q", s)
	}
	return ""
}

func parseEntry(raw json.RawMessage) (Model, *fieldError) {
	var ej entryJSON
	if isNull(raw) {
		return Model{}, fieldErr("", "expected an object, got JSON null")
	}
	if fe := strictDecode(raw, &ej, ""); fe != nil {
		return Model{}, fe
	}
	m := Model{
		Name:          ej.Name,
		Provider:      ej.Provider,
		ContextWindow: ej.ContextWindow,
		MaxOutput:     ej.MaxOutput,
		Notes:         ej.Notes,
	}
	if err := checkName(ej.Name); err != nil {
		return Model{}, fieldErr("name", "%s", err)
	}
	if err := checkProvider(ej.Provider); err != nil {
		return Model{}, fieldErr("provider", "%s", err)
	}
	for i, a := range ej.Aliases {
		field := fmt.Sprintf("aliases[%d]", i)
		if err := checkName(a); err != nil {
			return Model{}, fieldErr(field, "%s", err)
		}
		if a == ej.Name {
			return Model{}, fieldErr(field, "%q is the model's own name", a)
		}
		for j := range i {
			if ej.Aliases[j] == a {
				return Model{}, fieldErr(field, "duplicate of aliases[%d] %q", j, a)
			}
		}
		m.Aliases = append(m.Aliases, a)
	}
	if ej.ContextWindow < 0 {
		return Model{}, fieldErr("context_window", "must not be negative, got %d (0 means unknown)", ej.ContextWindow)
	}
	if ej.MaxOutput < 0 {
		return Model{}, fieldErr("max_output", "must not be negative, got %d (0 means unknown)", ej.MaxOutput)
	}
	if ej.ContextWindow > 0 && ej.MaxOutput > ej.ContextWindow {
		return Model{}, fieldErr("max_output", "%d exceeds context_window %d", ej.MaxOutput, ej.ContextWindow)
	}
	if !isNull(ej.Capabilities) {
		var cj capabilitiesJSON
		if fe := strictDecode(ej.Capabilities, &cj, "capabilities"); fe != nil {
			return Model{}, fe
		}
		m.Capabilities = Capabilities(cj)
	}
	price, fe := parsePrice(ej.PricePerMTok, "price_per_mtok")
	if fe != nil {
		return Model{}, fe
	}
	m.Price = price
	if !isNull(ej.LongContext) {
		var lj longContextJSON
		if fe := strictDecode(ej.LongContext, &lj, "long_context"); fe != nil {
			return Model{}, fe
		}
		if lj.AboveInputTokens == nil || *lj.AboveInputTokens == 0 {
			return Model{}, fieldErr("long_context.above_input_tokens", "required, a positive token count")
		}
		lp, fe := parsePrice(lj.PricePerMTok, "long_context.price_per_mtok")
		if fe != nil {
			return Model{}, fe
		}
		m.LongContext = &LongContext{AboveInputTokens: *lj.AboveInputTokens, Price: lp}
	}
	return m, nil
}

func parsePrice(raw json.RawMessage, field string) (Price, *fieldError) {
	if isNull(raw) {
		return Price{}, fieldErr(field, "required, e.g. {\"input\": \"3\", \"output\": \"15\", \"cache_read\": \"0.30\", \"cache_write\": \"3.75\"}")
	}
	var pj priceJSON
	if fe := strictDecode(raw, &pj, field); fe != nil {
		return Price{}, fe
	}
	var p Price
	for _, a := range []struct {
		name string
		raw  json.RawMessage
		dst  *decimal.Decimal
	}{
		{"input", pj.Input, &p.Input},
		{"output", pj.Output, &p.Output},
		{"cache_read", pj.CacheRead, &p.CacheRead},
		{"cache_write", pj.CacheWrite, &p.CacheWrite},
	} {
		d, fe := parseAmount(a.raw, field+"."+a.name)
		if fe != nil {
			return Price{}, fe
		}
		*a.dst = d
	}
	return p, nil
}

var amountRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// parseAmount reads a price: a JSON string holding a non-negative decimal
// without sign or exponent. Numbers are refused so that no price ever
// passes through a float.
func parseAmount(raw json.RawMessage, field string) (decimal.Decimal, *fieldError) {
	if isNull(raw) {
		return decimal.Decimal{}, fieldErr(field, "required, a decimal string such as \"3.75\" (USD per million tokens; \"0\" when free)")
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return decimal.Decimal{}, fieldErr(field, "must be a decimal string such as \"3.75\", got JSON %s", raw)
	}
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "-") {
		return decimal.Decimal{}, fieldErr(field, "must not be negative, got %q", s)
	}
	if !amountRE.MatchString(s) {
		return decimal.Decimal{}, fieldErr(field, "must be a decimal string such as \"3.75\", got %q", s)
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		return decimal.Decimal{}, fieldErr(field, "must be a decimal string such as \"3.75\", got %q", s)
	}
	return d, nil
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// checkName accepts model names as providers spell them: "gpt-4.1",
// "llama3.1:8b", "meta-llama/Llama-3.1-8B-Instruct".
func checkName(n string) error {
	switch {
	case n == "":
		return errors.New("required")
	case len(n) > 200:
		return fmt.Errorf("longer than 200 bytes")
	case strings.IndexFunc(n, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r == ',' }) >= 0:
		return fmt.Errorf("%q holds whitespace, a control character or a comma", n)
	}
	return nil
}

// providerRE and maxProvider: a provider name of at most 64 bytes. The
// length is checked apart: a counted repetition such as {0,63} compiles
// into one copy of the class per count, built when the process starts.
var providerRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

const maxProvider = 64

func checkProvider(p string) error {
	if p == "" {
		return errors.New("required")
	}
	if len(p) > maxProvider || !providerRE.MatchString(p) {
		return fmt.Errorf("%q must be lowercase letters, digits, '.', '_' or '-' (such as \"anthropic\" or \"ollama\")", p)
	}
	return nil
}

// strictDecode decodes one JSON value into v, refusing unknown fields and
// trailing data, and turns a decoding error into a fieldError under
// prefix.
func strictDecode(data []byte, v any, prefix string) *fieldError {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			return fieldErr(prefix, "unexpected data after the JSON value")
		}
		return nil
	}
	join := func(f string) string {
		switch {
		case prefix == "":
			return f
		case f == "":
			return prefix
		}
		return prefix + "." + f
	}
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &syn):
		// Offset counts the bytes read, the offending one included.
		line, col := position(data, syn.Offset-1)
		return fieldErr(prefix, "invalid JSON at line %d, column %d: %v", line, col, syn)
	case errors.As(err, &typ):
		return fieldErr(join(typ.Field), "expected %s, got JSON %s", jsonKind(typ.Type), typ.Value)
	case errors.Is(err, io.EOF):
		return fieldErr(prefix, "empty: expected a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fieldErr(prefix, "truncated JSON")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return fieldErr(join(strings.Trim(f, `"`)), "unknown field")
	}
	return fieldErr(prefix, "%v", err)
}

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		return "a non-negative integer"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			return "an array of strings"
		}
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return t.String()
}

// position is the 1-based line and column of the byte at 0-based offset
// off.
func position(data []byte, off int64) (line, col int) {
	off = max(0, min(off, int64(len(data))))
	before := data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - bytes.LastIndexByte(before, '\n')
	return line, col
}
