package tool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"

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

// schemaInfo is a tool's resolved schema and the document it came from.
// The library (github.com/google/jsonschema-go, whose package init costs
// next to nothing) decides whether an input is valid; its errors are
// strings that stop at the first failure and name the schema's location,
// not the input's, so the problems the model is shown are worked out by
// explain over the document (all of them, each at its place in the
// input).
type schemaInfo struct {
	doc      any // decoded with json.Number
	resolved *jsonschema.Resolved
	compact  []byte
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
	inst, bad := plainNumbers(v, "")
	if bad != nil {
		return nil, s.newError(name, false, []Problem{*bad}, "")
	}
	if err := guard(func() error { return s.resolved.Validate(inst) }); err != nil {
		return nil, s.newError(name, false, s.problems(v, err), hint(v))
	}
	return json.RawMessage(in), nil
}

// guard runs a call into the library, turning a panic (an assertion of
// its own about a schema or value it did not expect) into an error, so
// that no input or schema can take the operator down.
func guard(f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("the schema library failed: %v", v)
		}
	}()
	return f()
}

// plainNumbers copies a value decoded with json.Number into the form the
// library validates (it reads a json.Number as a string): int64 where the
// number is one, else float64. A number beyond float64 is a problem at
// its pointer.
func plainNumbers(v any, ptr string) (any, *Problem) {
	switch v := v.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i, nil
		}
		f, err := v.Float64()
		if err != nil {
			return nil, &Problem{Pointer: ptr, Message: fmt.Sprintf("number %s is out of range; numbers must fit a 64-bit float", v)}
		}
		return f, nil
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			y, bad := plainNumbers(x, ptr+"/"+escapeToken(k))
			if bad != nil {
				return nil, bad
			}
			out[k] = y
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			y, bad := plainNumbers(x, ptr+"/"+strconv.Itoa(i))
			if bad != nil {
				return nil, bad
			}
			out[i] = y
		}
		return out, nil
	}
	return v, nil
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

// problems lists what is wrong with input v, which the library refused
// with err.
func (s *schemaInfo) problems(v any, err error) []Problem {
	x := explainer{root: s.doc, draft7: isDraft7(s.doc)}
	x.check(s.doc, v, "")
	if len(x.out) > 0 {
		return x.out
	}
	// A keyword explain does not follow (unevaluatedProperties, a
	// $dynamicRef, a $ref by $id): the library's own words, without its
	// chain of schema locations.
	return []Problem{{Message: "the input does not match the schema: " + innermost(err), Schema: fragment(s.doc, maxFullSchema)}}
}

// innermost strips the "validating <schema>: " prefixes the library
// wraps each level's error in.
func innermost(err error) string {
	msg := err.Error()
	for {
		rest, ok := strings.CutPrefix(msg, "validating ")
		if !ok {
			return msg
		}
		_, after, ok := strings.Cut(rest, ": ")
		if !ok {
			return msg
		}
		msg = after
	}
}

// maxDepth bounds the nesting explain follows, $refs included, so that a
// recursive schema over a deep input cannot run away.
const maxDepth = 64

// explainer walks a schema document beside the input it refused and
// collects every violation, each at the JSON pointer of the offending
// value, with the schema fragment that applies. It covers the keywords
// of drafts 7 and 2020-12 that tool schemas use; the library remains
// the judge of validity.
type explainer struct {
	root   any
	draft7 bool
	depth  int
	// probe is set when only whether there is a problem matters (an
	// alternative of anyOf, say): no fragments are rendered.
	probe bool
	out   []Problem
}

// matches reports whether inst satisfies sch, as far as explain sees.
func (x *explainer) matches(sch, inst any) bool {
	sub := explainer{root: x.root, draft7: x.draft7, depth: x.depth, probe: true}
	sub.check(sch, inst, "")
	return len(sub.out) == 0
}

func (x *explainer) add(ptr, msg string, sch any) {
	if x.probe {
		x.out = append(x.out, Problem{Pointer: ptr, Message: msg})
		return
	}
	limit := maxFragment
	if ptr == "" {
		// At the root the whole schema is what the model needs.
		limit = maxFullSchema
	}
	x.out = append(x.out, Problem{Pointer: ptr, Message: msg, Schema: fragmentOrEmpty(sch, limit)})
}

// check appends to out the violations of inst, at ptr, against sch.
func (x *explainer) check(sch, inst any, ptr string) {
	if x.depth >= maxDepth {
		return
	}
	x.depth++
	defer func() { x.depth-- }()
	if b, ok := sch.(bool); ok {
		if !b {
			x.add(ptr, "no value is allowed here", nil)
		}
		return
	}
	m, ok := sch.(map[string]any)
	if !ok {
		return
	}
	if ref, ok := m["$ref"].(string); ok {
		if target, ok := x.resolve(ref); ok {
			x.check(target, inst, ptr)
		}
		if x.draft7 {
			// Draft 7 ignores the keywords beside a $ref.
			return
		}
	}
	if want, ok := typeNames(m["type"]); ok {
		got := jsonType(inst)
		if !slices.Contains(want, got) && (got != "integer" || !slices.Contains(want, "number")) {
			if got == "integer" && !slices.Contains(want, "integer") {
				// "integer" is a subtype only worth naming when it is
				// wanted: 5 where a string is wanted is a number.
				got = "number"
			}
			x.add(ptr, fmt.Sprintf("got %s, want %s", got, strings.Join(want, " or ")), m)
			// The other keywords read values of the wanted type.
			return
		}
	}
	if enum, ok := m["enum"].([]any); ok && !slices.ContainsFunc(enum, func(e any) bool { return jsonEqual(e, inst) }) {
		x.add(ptr, "value must be one of "+jsonList(enum), m)
	}
	if c, ok := m["const"]; ok && !jsonEqual(c, inst) {
		x.add(ptr, "value must be "+jsonText(c), m)
	}
	switch inst := inst.(type) {
	case json.Number:
		x.number(m, inst, ptr)
	case string:
		x.str(m, inst, ptr)
	case []any:
		x.array(m, inst, ptr)
	case map[string]any:
		x.object(m, inst, ptr)
	}
	x.logic(m, inst, ptr)
}

// logic checks allOf, anyOf, oneOf, not and if/then/else.
func (x *explainer) logic(m map[string]any, inst any, ptr string) {
	if all, ok := m["allOf"].([]any); ok {
		for _, sub := range all {
			x.check(sub, inst, ptr)
		}
	}
	if anyOf, ok := m["anyOf"].([]any); ok && !slices.ContainsFunc(anyOf, func(sub any) bool { return x.matches(sub, inst) }) {
		x.add(ptr, "matches none of the alternatives in anyOf", m)
	}
	if oneOf, ok := m["oneOf"].([]any); ok {
		var hits []int
		for i, sub := range oneOf {
			if x.matches(sub, inst) {
				hits = append(hits, i)
			}
		}
		switch {
		case len(hits) == 0:
			x.add(ptr, "matches none of the alternatives in oneOf", m)
		case len(hits) > 1:
			x.add(ptr, fmt.Sprintf("matches more than one alternative in oneOf (alternatives %d and %d); it must match exactly one", hits[0], hits[1]), m)
		}
	}
	if not, ok := m["not"]; ok && x.matches(not, inst) {
		x.add(ptr, `must not match the schema under "not"`, m)
	}
	if cond, ok := m["if"]; ok {
		branch := "else"
		if x.matches(cond, inst) {
			branch = "then"
		}
		if sub, ok := m[branch]; ok {
			x.check(sub, inst, ptr)
		}
	}
}

func (x *explainer) number(m map[string]any, n json.Number, ptr string) {
	v, ok := rat(n)
	if !ok {
		return
	}
	bound := func(key, want string, fails func(c int) bool) {
		b, ok := rat(m[key])
		if ok && fails(v.Cmp(b)) {
			x.add(ptr, fmt.Sprintf("%s: got %s, want %s %s", key, n, want, m[key]), m)
		}
	}
	bound("minimum", "at least", func(c int) bool { return c < 0 })
	bound("maximum", "at most", func(c int) bool { return c > 0 })
	bound("exclusiveMinimum", "more than", func(c int) bool { return c <= 0 })
	bound("exclusiveMaximum", "less than", func(c int) bool { return c >= 0 })
	if d, ok := rat(m["multipleOf"]); ok && d.Sign() > 0 {
		if q := new(big.Rat).Quo(v, d); !q.IsInt() {
			x.add(ptr, fmt.Sprintf("multipleOf: got %s, want a multiple of %s", n, m["multipleOf"]), m)
		}
	}
}

func (x *explainer) str(m map[string]any, s, ptr string) {
	n := utf8.RuneCountInString(s)
	if k, ok := count(m["minLength"]); ok && n < k {
		x.add(ptr, fmt.Sprintf("minLength: got %s, want at least %d", plural(n, "character"), k), m)
	}
	if k, ok := count(m["maxLength"]); ok && n > k {
		x.add(ptr, fmt.Sprintf("maxLength: got %s, want at most %d", plural(n, "character"), k), m)
	}
	if p, ok := m["pattern"].(string); ok {
		// Only on the way to an error message: the library holds the
		// compiled patterns it validates with.
		if re, err := regexp.Compile(p); err == nil && !re.MatchString(s) {
			x.add(ptr, fmt.Sprintf("pattern: the string does not match %s", strconv.Quote(p)), m)
		}
	}
}

func (x *explainer) array(m map[string]any, a []any, ptr string) {
	// The items checked by position: prefixItems (2020-12) or an array
	// under items (draft 7); the rest by items (2020-12) or
	// additionalItems (draft 7).
	prefix, _ := m["prefixItems"].([]any)
	rest, hasRest := m["items"]
	if tuple, ok := rest.([]any); ok {
		prefix = tuple
		rest, hasRest = m["additionalItems"]
	}
	for i, v := range a {
		switch {
		case i < len(prefix):
			x.check(prefix[i], v, ptr+"/"+strconv.Itoa(i))
		case hasRest:
			x.check(rest, v, ptr+"/"+strconv.Itoa(i))
		}
	}
	if c, ok := m["contains"]; ok {
		hits := 0
		for _, v := range a {
			if x.matches(c, v) {
				hits++
			}
		}
		minC, ok := count(m["minContains"])
		if !ok {
			minC = 1
		}
		if hits < minC {
			x.add(ptr, fmt.Sprintf("contains: %d items match the schema under \"contains\", want at least %d", hits, minC), m)
		}
		if maxC, ok := count(m["maxContains"]); ok && hits > maxC {
			x.add(ptr, fmt.Sprintf("maxContains: %d items match the schema under \"contains\", want at most %d", hits, maxC), m)
		}
	}
	if k, ok := count(m["minItems"]); ok && len(a) < k {
		x.add(ptr, fmt.Sprintf("minItems: got %s, want at least %d", plural(len(a), "item"), k), m)
	}
	if k, ok := count(m["maxItems"]); ok && len(a) > k {
		x.add(ptr, fmt.Sprintf("maxItems: got %s, want at most %d", plural(len(a), "item"), k), m)
	}
	if u, _ := m["uniqueItems"].(bool); u {
	dup:
		for i := range a {
			for j := range i {
				if jsonEqual(a[i], a[j]) {
					x.add(ptr, fmt.Sprintf("uniqueItems: items %d and %d are equal", j, i), m)
					break dup
				}
			}
		}
	}
}

func (x *explainer) object(m map[string]any, o map[string]any, ptr string) {
	props, _ := m["properties"].(map[string]any)
	patterns, _ := m["patternProperties"].(map[string]any)
	var extra []string
	for _, k := range sortedKeys(o) {
		at := ptr + "/" + escapeToken(k)
		sub, known := props[k]
		if known {
			x.check(sub, o[k], at)
		}
		for p, sub := range patterns {
			if re, err := regexp.Compile(p); err == nil && re.MatchString(k) {
				known = true
				x.check(sub, o[k], at)
			}
		}
		if names, ok := m["propertyNames"]; ok && !x.matches(names, k) {
			x.add(at, fmt.Sprintf("the property name %q does not match the schema under \"propertyNames\"", k), names)
		}
		if !known {
			extra = append(extra, k)
		}
	}
	if add, ok := m["additionalProperties"]; ok {
		if b, ok := add.(bool); ok && !b {
			allowed := allowedProps(m)
			for _, k := range extra {
				x.out = append(x.out, Problem{Pointer: ptr + "/" + escapeToken(k), Message: fmt.Sprintf("property %q is not allowed", k), Allowed: allowed})
			}
		} else {
			for _, k := range extra {
				x.check(add, o[k], ptr+"/"+escapeToken(k))
			}
		}
	}
	missing := func(names []any, why string) {
		for _, n := range names {
			name, ok := n.(string)
			if _, has := o[name]; !ok || has {
				continue
			}
			sub := props[name]
			x.out = append(x.out, Problem{
				Pointer: ptr + "/" + escapeToken(name),
				Message: fmt.Sprintf("missing required property %q%s", name, why),
				Schema:  fragmentOrEmpty(sub, maxFragment),
			})
		}
	}
	if req, ok := m["required"].([]any); ok {
		missing(req, "")
	}
	// dependentRequired (2020-12) and the array form of dependencies
	// (draft 7); dependentSchemas and the schema form.
	for _, key := range []string{"dependentRequired", "dependencies", "dependentSchemas"} {
		deps, _ := m[key].(map[string]any)
		for _, k := range sortedKeys(deps) {
			if _, has := o[k]; !has {
				continue
			}
			if names, ok := deps[k].([]any); ok {
				missing(names, fmt.Sprintf(" (required when %q is given)", k))
			} else {
				x.check(deps[k], o, ptr)
			}
		}
	}
	if un, ok := m["unevaluatedProperties"]; ok {
		seen := map[string]bool{}
		own := maps.Clone(m)
		delete(own, "unevaluatedProperties")
		x.evaluated(own, o, seen)
		var rest []string
		for _, k := range sortedKeys(o) {
			if !seen[k] {
				rest = append(rest, k)
			}
		}
		if b, ok := un.(bool); ok && !b {
			allowed := sortedKeys(seen)
			for _, k := range rest {
				x.out = append(x.out, Problem{Pointer: ptr + "/" + escapeToken(k), Message: fmt.Sprintf("property %q is not allowed", k), Allowed: allowed})
			}
		} else {
			for _, k := range rest {
				x.check(un, o[k], ptr+"/"+escapeToken(k))
			}
		}
	}
	if k, ok := count(m["minProperties"]); ok && len(o) < k {
		x.add(ptr, fmt.Sprintf("minProperties: got %s, want at least %d", plural(len(o), "property"), k), m)
	}
	if k, ok := count(m["maxProperties"]); ok && len(o) > k {
		x.add(ptr, fmt.Sprintf("maxProperties: got %s, want at most %d", plural(len(o), "property"), k), m)
	}
}

// evaluated adds to seen the property names that m and the subschemas
// applied in place (allOf, the matching alternatives of anyOf and oneOf,
// if/then/else, $ref, dependentSchemas) evaluate, for
// unevaluatedProperties: those named under properties, those matching
// patternProperties, and all when additionalProperties is given.
func (x *explainer) evaluated(sch any, o map[string]any, seen map[string]bool) {
	m, ok := sch.(map[string]any)
	if !ok || x.depth >= maxDepth {
		return
	}
	x.depth++
	defer func() { x.depth-- }()
	props, _ := m["properties"].(map[string]any)
	for k := range props {
		seen[k] = true
	}
	if patterns, ok := m["patternProperties"].(map[string]any); ok {
		for p := range patterns {
			if re, err := regexp.Compile(p); err == nil {
				for k := range o {
					if re.MatchString(k) {
						seen[k] = true
					}
				}
			}
		}
	}
	_, add := m["additionalProperties"]
	_, un := m["unevaluatedProperties"]
	if add || (un && len(seen) < len(o)) {
		for k := range o {
			seen[k] = true
		}
	}
	if ref, ok := m["$ref"].(string); ok {
		if target, ok := x.resolve(ref); ok {
			x.evaluated(target, o, seen)
		}
	}
	if all, ok := m["allOf"].([]any); ok {
		for _, sub := range all {
			x.evaluated(sub, o, seen)
		}
	}
	for _, key := range []string{"anyOf", "oneOf"} {
		alts, _ := m[key].([]any)
		for _, sub := range alts {
			if x.matches(sub, o) {
				x.evaluated(sub, o, seen)
			}
		}
	}
	if cond, ok := m["if"]; ok {
		branch := "else"
		if x.matches(cond, o) {
			branch = "then"
			x.evaluated(cond, o, seen)
		}
		x.evaluated(m[branch], o, seen)
	}
	if deps, ok := m["dependentSchemas"].(map[string]any); ok {
		for k, sub := range deps {
			if _, has := o[k]; has {
				x.evaluated(sub, o, seen)
			}
		}
	}
}

// resolve finds the target of a $ref within the tool's own schema: "#"
// and "#/json/pointer". Other forms ($id, anchors) are left to the
// library's message.
func (x *explainer) resolve(ref string) (any, bool) {
	rest, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, false
	}
	ptr, err := url.PathUnescape(rest)
	if err != nil || (ptr != "" && !strings.HasPrefix(ptr, "/")) {
		return nil, false
	}
	v := x.root
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

// typeNames reads a "type" keyword: one name or a list of names.
func typeNames(t any) ([]string, bool) {
	switch t := t.(type) {
	case string:
		return []string{t}, true
	case []any:
		var names []string
		for _, n := range t {
			if s, ok := n.(string); ok {
				names = append(names, s)
			}
		}
		return names, len(names) > 0
	}
	return nil, false
}

// jsonType names the JSON Schema type of a decoded value; a number with
// no fraction is an integer, as the drafts since 6 say.
func jsonType(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		if r, ok := rat(v); ok && r.IsInt() {
			return "integer"
		}
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}

// rat reads a json.Number exactly.
func rat(v any) (*big.Rat, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return nil, false
	}
	return new(big.Rat).SetString(n.String())
}

// count reads a non-negative integer keyword value.
func count(v any) (int, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(n.String())
	if err != nil {
		// A count written as 2.0 is an integer all the same.
		r, ok := rat(n)
		if !ok || !r.IsInt() || !r.Num().IsInt64() {
			return 0, false
		}
		i = int(r.Num().Int64())
	}
	return i, i >= 0
}

// jsonEqual is equality of JSON values, numbers by value (1 == 1.0).
func jsonEqual(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		ra, ok1 := rat(a)
		rb, ok2 := rat(b)
		return ok1 && ok2 && ra.Cmp(rb) == 0
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok || len(a) != len(bm) {
			return false
		}
		for k, v := range a {
			w, ok := bm[k]
			if !ok || !jsonEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		bs, ok := b.([]any)
		return ok && slices.EqualFunc(a, bs, jsonEqual)
	}
	switch b.(type) {
	case json.Number, map[string]any, []any:
		return false
	}
	return a == b
}

// jsonText renders a value as compact JSON.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// jsonList renders values as a comma-separated list of JSON.
func jsonList(vs []any) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = jsonText(v)
	}
	return strings.Join(parts, ", ")
}

// plural writes a count of things: "1 item", "2 items", "3 properties".
func plural(n int, thing string) string {
	switch {
	case n == 1:
		return "1 " + thing
	case strings.HasSuffix(thing, "y"):
		return strconv.Itoa(n) + " " + strings.TrimSuffix(thing, "y") + "ies"
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
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

// schemaURL is the base URI a tool's schema is resolved under; it appears
// in nothing the model sees.
func schemaURL(name string) string { return "mem:///tools/" + name + ".json" }

// refuseLoader refuses every external schema reference: tool schemas
// must be self-contained.
func refuseLoader(u *url.URL) (*jsonschema.Schema, error) {
	return nil, fmt.Errorf("schemas must be self-contained; %s cannot be loaded", u)
}

// Drafts the library validates, by "$schema"; a schema without one is
// read as 2020-12.
const (
	draft7URL      = "http://json-schema.org/draft-07/schema#"
	draft7URLs     = "https://json-schema.org/draft-07/schema#"
	draft202012URL = "https://json-schema.org/draft/2020-12/schema"
)

func isDraft7(doc any) bool {
	m, _ := doc.(map[string]any)
	return m["$schema"] == draft7URL || m["$schema"] == draft7URLs
}

// compileSchema checks and resolves the input schema of tool name, so
// that a bad schema is refused when the tool is registered (at start),
// never at its first call.
func compileSchema(name string, raw json.RawMessage) (*schemaInfo, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, fmt.Errorf("tool %q has no input schema: %w", name, errs.InvalidArgument)
	}
	doc, err := decodeJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("tool %q: schema is not valid JSON: %v: %w", name, err, errs.InvalidArgument)
	}
	obj, ok := doc.(map[string]any)
	if !ok || obj["type"] != "object" {
		return nil, fmt.Errorf(`tool %q: schema must be a JSON object with "type": "object": %w`, name, errs.InvalidArgument)
	}
	if d, ok := obj["$schema"]; ok && d != draft7URL && d != draft7URLs && d != draft202012URL {
		return nil, fmt.Errorf(`tool %q: schema: "$schema" %s is not supported; write draft 2020-12 (%q) or draft-07 (%q), or leave "$schema" out: %w`,
			name, jsonText(d), draft202012URL, draft7URL, errs.InvalidArgument)
	}
	if err := checkKeywords(doc, ""); err != nil {
		return nil, fmt.Errorf("tool %q: schema does not compile: %v: %w", name, err, errs.InvalidArgument)
	}
	var sch jsonschema.Schema
	if err := json.Unmarshal(raw, &sch); err != nil {
		return nil, fmt.Errorf("tool %q: schema does not compile: %v: %w", name, err, errs.InvalidArgument)
	}
	var resolved *jsonschema.Resolved
	err = guard(func() (err error) {
		resolved, err = sch.Resolve(&jsonschema.ResolveOptions{BaseURI: schemaURL(name), Loader: refuseLoader})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("tool %q: schema does not compile: %v: %w", name, err, errs.InvalidArgument)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, fmt.Errorf("tool %q: schema is not valid JSON: %v: %w", name, err, errs.InvalidArgument)
	}
	return &schemaInfo{doc: doc, resolved: resolved, compact: compact.Bytes()}, nil
}

// jsonTypes are the names "type" accepts.
var jsonTypes = []string{"array", "boolean", "integer", "null", "number", "object", "string"}

// counts are the keywords whose value is a non-negative integer.
var counts = []string{"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains"}

// checkKeywords refuses the mistakes in a schema that the library reads
// without complaint (it does not check schemas against the meta-schema):
// an unknown type name, a negative or fractional count. It walks the
// subschemas under the keywords that hold them; ptr is the schema
// location, for the message.
func checkKeywords(sch any, ptr string) error {
	m, ok := sch.(map[string]any)
	if !ok {
		return nil
	}
	at := func() string {
		if ptr == "" {
			return "the root"
		}
		return ptr
	}
	if t, ok := m["type"]; ok {
		names, ok := typeNames(t)
		if _, isList := t.([]any); !ok || (isList && len(names) != len(t.([]any))) {
			return fmt.Errorf(`at %s: "type" is %s; want a type name or a list of them`, at(), jsonText(t))
		}
		for _, n := range names {
			if !slices.Contains(jsonTypes, n) {
				return fmt.Errorf(`at %s: "type" %q is not a JSON Schema type; use one of %s`, at(), n, strings.Join(jsonTypes, ", "))
			}
		}
	}
	if p, ok := m["pattern"].(string); ok {
		if _, err := regexp.Compile(p); err != nil {
			return fmt.Errorf(`at %s: "pattern" %q: %v`, at(), p, err)
		}
	}
	if pp, ok := m["patternProperties"].(map[string]any); ok {
		for _, p := range sortedKeys(pp) {
			if _, err := regexp.Compile(p); err != nil {
				return fmt.Errorf(`at %s: "patternProperties" %q: %v`, at(), p, err)
			}
		}
	}
	for _, k := range counts {
		if v, ok := m[k]; ok {
			if _, ok := count(v); !ok {
				return fmt.Errorf(`at %s: %q is %s; want a non-negative integer`, at(), k, jsonText(v))
			}
		}
	}
	for _, k := range sortedKeys(m) {
		v := m[k]
		switch k {
		case "properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies":
			if sub, ok := v.(map[string]any); ok {
				for _, n := range sortedKeys(sub) {
					if err := checkKeywords(sub[n], ptr+"/"+k+"/"+escapeToken(n)); err != nil {
						return err
					}
				}
			}
		case "items", "prefixItems", "allOf", "anyOf", "oneOf":
			if list, ok := v.([]any); ok {
				for i, sub := range list {
					if err := checkKeywords(sub, ptr+"/"+k+"/"+strconv.Itoa(i)); err != nil {
						return err
					}
				}
				continue
			}
			fallthrough
		case "additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems", "propertyNames", "contains", "not", "if", "then", "else":
			if err := checkKeywords(v, ptr+"/"+k); err != nil {
				return err
			}
		}
	}
	return nil
}
