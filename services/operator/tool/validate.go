package tool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/secbear/neuron/pkg/errs"
)

// Bounds of a validation message, to keep it compact in the model's
// context.
const (
	// maxProblems is the most problems a message lists.
	maxProblems = 8
	// maxFragment is the longest schema fragment quoted, in bytes.
	maxFragment = 300
	// maxFullSchema is the longest whole schema quoted after malformed
	// JSON, in bytes.
	maxFullSchema = 1500
	// snippetRadius is how many bytes around a syntax error are quoted.
	snippetRadius = 24
)

// schemaInfo is a tool's compiled schema and the document it came from,
// for quoting fragments in messages.
type schemaInfo struct {
	url     string
	doc     any
	schema  *jsonschema.Schema
	compact []byte
}

// ValidationError is a tool input that failed: malformed JSON or a schema
// violation. Its message is written for the model to correct its call.
// It wraps errs.InvalidArgument.
type ValidationError struct {
	// Tool is the tool's name.
	Tool string
	// Malformed is true when the input is not valid JSON; Problems then
	// holds one problem at the position of the syntax error.
	Malformed bool
	// Problems are the violations, sorted by location. The message lists
	// at most a few of them.
	Problems []Problem

	msg string
}

// Problem is one violation in a tool input.
type Problem struct {
	// Pointer is the JSON pointer (RFC 6901) of the offending value in the
	// input, such as "/path" or "/edits/0/line"; "" is the whole input.
	// For a missing property it points where the property should be.
	Pointer string
	// Message says what is wrong, such as `got number, want string`.
	Message string
	// Schema is the compact JSON of the schema fragment that applies, cut
	// short when long; empty when there is none to quote.
	Schema string
	// Allowed lists the property names the schema allows where an
	// additional property was refused.
	Allowed []string
}

func (e *ValidationError) Error() string { return e.msg }

// Unwrap makes errors.Is(err, errs.InvalidArgument) hold.
func (e *ValidationError) Unwrap() error { return errs.InvalidArgument }

// decodeJSON parses exactly one JSON value, numbers as json.Number.
func decodeJSON(in []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if off := dec.InputOffset(); len(bytes.TrimSpace(in[off:])) != 0 {
		return nil, &trailingError{offset: off}
	}
	return v, nil
}

// trailingError is data after the first JSON value.
type trailingError struct{ offset int64 }

func (e *trailingError) Error() string {
	return "unexpected data after the first JSON value"
}

// validate parses and validates the input of tool name.
func (s *schemaInfo) validate(name string, input json.RawMessage) (json.RawMessage, error) {
	in := bytes.TrimSpace(input)
	if len(in) == 0 {
		in = []byte("{}")
	}
	v, err := decodeJSON(in)
	if err != nil {
		return nil, s.malformed(name, in, err)
	}
	if err := s.schema.Validate(v); err != nil {
		var ve *jsonschema.ValidationError
		if !errors.As(err, &ve) {
			// The schema compiled, so this does not happen; report it
			// without internals all the same.
			return nil, s.newError(name, false, []Problem{{Message: "the input could not be checked against the schema"}}, "")
		}
		return nil, s.newError(name, false, s.problems(ve), hint(v))
	}
	return json.RawMessage(in), nil
}

// hint adds advice for a common mistake: a JSON string holding the
// arguments object instead of the object itself.
func hint(v any) string {
	str, ok := v.(string)
	if !ok {
		return ""
	}
	if inner, err := decodeJSON([]byte(str)); err == nil {
		if _, ok := inner.(map[string]any); ok {
			return "The arguments are a JSON string that holds an object; send the object itself, not a string."
		}
	}
	return ""
}

// malformed builds the error for input that is not valid JSON.
func (s *schemaInfo) malformed(name string, in []byte, err error) *ValidationError {
	var (
		syn   *json.SyntaxError
		trail *trailingError
		pos   = -1
		what  = err.Error()
	)
	switch {
	case errors.As(err, &syn):
		pos = int(syn.Offset) - 1
	case errors.As(err, &trail):
		pos = int(trail.offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		pos = len(in)
		what = "unexpected end of JSON input, the JSON is cut off"
	}
	pos = max(0, min(pos, len(in)))
	line, col := lineCol(in, pos)
	msg := fmt.Sprintf("%s (line %d, column %d, byte %d), near %s", what, line, col, pos, snippet(in, pos))
	e := &ValidationError{Tool: name, Malformed: true, Problems: []Problem{{Message: msg}}}
	e.msg = fmt.Sprintf("invalid input for tool %q: the arguments are not valid JSON: %s. Send one JSON object that matches the tool's input schema: %s",
		name, msg, fragment(s.doc, maxFullSchema))
	return e
}

// lineCol returns the 1-based line and byte column of in[pos].
func lineCol(in []byte, pos int) (int, int) {
	before := in[:pos]
	line := bytes.Count(before, []byte("\n")) + 1
	col := pos - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}

// snippet quotes the input around pos, marking cut ends with "…".
func snippet(in []byte, pos int) string {
	from, to := max(0, pos-snippetRadius), min(len(in), pos+snippetRadius)
	for from > 0 && !utf8.RuneStart(in[from]) {
		from--
	}
	for to < len(in) && !utf8.RuneStart(in[to]) {
		to++
	}
	s := strconv.Quote(string(in[from:to]))
	if from > 0 {
		s = "…" + s
	}
	if to < len(in) {
		s += "…"
	}
	return s
}

func (s *schemaInfo) newError(name string, malformed bool, problems []Problem, hint string) *ValidationError {
	slices.SortStableFunc(problems, func(a, b Problem) int {
		if c := strings.Compare(a.Pointer, b.Pointer); c != 0 {
			return c
		}
		return strings.Compare(a.Message, b.Message)
	})
	problems = slices.CompactFunc(problems, func(a, b Problem) bool {
		return a.Pointer == b.Pointer && a.Message == b.Message
	})
	e := &ValidationError{Tool: name, Malformed: malformed, Problems: problems}
	var b strings.Builder
	if len(problems) == 1 {
		fmt.Fprintf(&b, "invalid input for tool %q; fix it and call the tool again:", name)
	} else {
		fmt.Fprintf(&b, "invalid input for tool %q (%d problems); fix them and call the tool again:", name, len(problems))
	}
	for i, p := range problems {
		if i == maxProblems {
			fmt.Fprintf(&b, "\n- and %d more", len(problems)-maxProblems)
			break
		}
		fmt.Fprintf(&b, "\n- at %s: %s", displayPointer(p.Pointer), p.Message)
		switch {
		case p.Allowed != nil:
			if len(p.Allowed) == 0 {
				b.WriteString("; no properties are allowed here")
			} else {
				fmt.Fprintf(&b, "; allowed properties: %s", quoteList(p.Allowed))
			}
		case p.Schema != "":
			fmt.Fprintf(&b, "; schema: %s", p.Schema)
		}
	}
	if hint != "" {
		b.WriteString("\n")
		b.WriteString(hint)
	}
	e.msg = b.String()
	return e
}

func displayPointer(p string) string {
	if p == "" {
		return "(root)"
	}
	return p
}

// printer renders the library's messages for the kinds we do not phrase
// ourselves.
var printer = message.NewPrinter(language.English)

// problems flattens a validation error tree into the leaf violations.
func (s *schemaInfo) problems(ve *jsonschema.ValidationError) []Problem {
	var out []Problem
	s.collect(ve, &out)
	if len(out) == 0 {
		out = append(out, Problem{Message: "the input does not match the schema", Schema: fragment(s.doc, maxFragment)})
	}
	return out
}

func (s *schemaInfo) collect(ve *jsonschema.ValidationError, out *[]Problem) {
	ptr := pointer(ve.InstanceLocation)
	frag, _ := s.fragmentAt(ve.SchemaURL)
	limit := maxFragment
	if ptr == "" {
		// At the root the whole schema is what the model needs.
		limit = maxFullSchema
	}
	switch k := ve.ErrorKind.(type) {
	case *kind.Required:
		props, _ := lookup(frag, "properties")
		for _, m := range k.Missing {
			sub, _ := lookup(props, m)
			*out = append(*out, Problem{
				Pointer: ptr + "/" + escapeToken(m),
				Message: fmt.Sprintf("missing required property %q", m),
				Schema:  fragmentOrEmpty(sub, maxFragment),
			})
		}
		return
	case *kind.AdditionalProperties:
		allowed := allowedProps(frag)
		for _, p := range k.Properties {
			*out = append(*out, Problem{
				Pointer: ptr + "/" + escapeToken(p),
				Message: fmt.Sprintf("property %q is not allowed", p),
				Allowed: allowed,
			})
		}
		return
	case *kind.AnyOf:
		*out = append(*out, Problem{Pointer: ptr, Message: "matches none of the alternatives in anyOf", Schema: fragmentOrEmpty(frag, limit)})
		return
	case *kind.OneOf:
		msg := "matches none of the alternatives in oneOf"
		if len(k.Subschemas) >= 2 {
			msg = fmt.Sprintf("matches more than one alternative in oneOf (alternatives %d and %d); it must match exactly one", k.Subschemas[0], k.Subschemas[1])
		}
		*out = append(*out, Problem{Pointer: ptr, Message: msg, Schema: fragmentOrEmpty(frag, limit)})
		return
	}
	if len(ve.Causes) > 0 {
		for _, c := range ve.Causes {
			s.collect(c, out)
		}
		return
	}
	var msg string
	switch k := ve.ErrorKind.(type) {
	case *kind.FalseSchema:
		msg = "no value is allowed here"
	case *kind.Not:
		msg = `must not match the schema under "not"`
	case *kind.Type:
		msg = fmt.Sprintf("got %s, want %s", k.Got, strings.Join(k.Want, " or "))
	default:
		msg = ve.ErrorKind.LocalizedString(printer)
	}
	*out = append(*out, Problem{Pointer: ptr, Message: msg, Schema: fragmentOrEmpty(frag, limit)})
}

// allowedProps lists the property names an object schema names, sorted;
// never nil, so that an empty list says none are allowed.
func allowedProps(frag any) []string {
	allowed := []string{}
	if props, ok := lookup(frag, "properties"); ok {
		if m, ok := props.(map[string]any); ok {
			for n := range m {
				allowed = append(allowed, n)
			}
		}
	}
	slices.Sort(allowed)
	return allowed
}

// fragmentAt returns the part of the schema document at schema location
// u, when u points into this tool's schema by JSON pointer.
func (s *schemaInfo) fragmentAt(u string) (any, bool) {
	rest, ok := strings.CutPrefix(u, s.url+"#")
	if !ok {
		return nil, false
	}
	ptr, err := url.PathUnescape(rest)
	if err != nil || (ptr != "" && !strings.HasPrefix(ptr, "/")) {
		return nil, false
	}
	v := s.doc
	if ptr == "" {
		return v, true
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		if v, ok = lookup(v, tok); !ok {
			return nil, false
		}
	}
	return v, true
}

// lookup steps from v into its member or element tok.
func lookup(v any, tok string) (any, bool) {
	switch v := v.(type) {
	case map[string]any:
		x, ok := v[tok]
		return x, ok
	case []any:
		i, err := strconv.Atoi(tok)
		if err != nil || i < 0 || i >= len(v) {
			return nil, false
		}
		return v[i], true
	}
	return nil, false
}

func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(escapeToken(t))
	}
	return b.String()
}

func escapeToken(t string) string {
	return strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
}

func fragmentOrEmpty(v any, limit int) string {
	if v == nil {
		return ""
	}
	return fragment(v, limit)
}

// annotations are schema keywords that explain rather than constrain;
// they are dropped first when a fragment is too long.
var annotations = []string{"description", "title", "examples", "$comment", "default"}

// fragment renders a schema fragment as compact JSON of at most limit
// bytes (plus "…" when cut): whole if it fits, else without annotations,
// else cut.
func fragment(v any, limit int) string {
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	if len(b) <= limit {
		return string(b)
	}
	if b2, err := json.Marshal(stripAnnotations(v)); err == nil {
		b = b2
	}
	if len(b) <= limit {
		return string(b)
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "…"
}

// stripAnnotations copies a schema without its annotation keywords. The
// properties map is copied as is, since its keys are property names.
func stripAnnotations(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			if slices.Contains(annotations, k) {
				continue
			}
			if k == "properties" || k == "patternProperties" || k == "$defs" || k == "definitions" || k == "dependentSchemas" {
				if m, ok := x.(map[string]any); ok {
					mm := make(map[string]any, len(m))
					for n, sub := range m {
						mm[n] = stripAnnotations(sub)
					}
					out[k] = mm
					continue
				}
			}
			out[k] = stripAnnotations(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = stripAnnotations(x)
		}
		return out
	}
	return v
}
