package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
)

// Redacted replaces every exact secret value, every encoding of one, and
// every pattern match.
const Redacted = "[REDACTED]"

// MinSecretLen is the length from which a secret's encodings (base64,
// hex, URL escaping, JSON escaping) are replaced as well as the value
// itself. A shorter encoded form would too often occur in ordinary text.
// Shorter secrets are still replaced verbatim, wherever they occur.
const MinSecretLen = 8

// minFragmentLen is the shortest line of a multi-line secret that is
// replaced on its own (see New).
const minFragmentLen = 16

// Scrubber replaces credentials in text and messages. It is immutable
// after New and safe for concurrent use.
type Scrubber struct {
	exact    *matcher
	defaults bool
	extra    []pattern
	patterns []pattern
	// keywords finds, in one pass, which of the first 64 patterns can
	// match: bit i stands for patterns[i].
	keywords *matcher
}

// Option configures a Scrubber.
type Option func(*Scrubber)

// WithoutPatterns turns the default pattern set off: only the exact
// secret values (and their encodings) and patterns given with
// WithPatterns are replaced.
func WithoutPatterns() Option {
	return func(s *Scrubber) { s.defaults = false }
}

// WithPatterns adds patterns, applied after the default ones (and also
// with WithoutPatterns). If a pattern has capture groups named "secret",
// only the first of them that took part in a match is replaced, and the
// rest of the match is kept; otherwise the whole match is replaced. Nil
// patterns are ignored.
func WithPatterns(p ...*regexp.Regexp) Option {
	return func(s *Scrubber) {
		for _, re := range p {
			if re != nil {
				s.extra = append(s.extra, newPattern("custom "+re.String(), re, nil, nil))
			}
		}
	}
}

// New returns a Scrubber that replaces each of secrets and, unless
// WithoutPatterns is given, anything that looks like a credential (API
// keys of the common providers, JWTs, Authorization and x-api-key
// headers, PEM private keys, password=/token=/secret=/api_key= values).
//
// For a secret of at least MinSecretLen bytes these forms are replaced
// too: standard and URL base64 with and without padding, base64 of the
// secret inside a longer base64 text (at each of the three alignments,
// e.g. "Basic " auth of "user:secret" or `echo $KEY | base64`), lower-
// and upper-case hex, URL query and path escaping and JSON string
// escaping. Each line of at least 16 bytes of a multi-line secret (a PEM
// key, a service-account JSON) is also replaced on its own, so that the
// line-based Writer catches it. A secret with leading or trailing white
// space (a value read from a file with its newline) is also replaced
// trimmed, with all its forms. Empty secrets are skipped.
//
// All exact forms are found in one pass by an Aho–Corasick automaton
// (chosen over strings.Replacer, which neither counts replacements nor
// lets overlaps be resolved other than first-listed-wins). Overlapping
// matches are merged into one replacement, so when one secret is a prefix
// of another, or two overlap, the whole run is replaced and no fragment
// of either is left. Exact values are replaced before the patterns run.
func New(secrets []string, opts ...Option) *Scrubber {
	s := &Scrubber{defaults: true}
	for _, o := range opts {
		o(s)
	}
	seen := map[string]bool{}
	var forms []string
	for _, secret := range secrets {
		vs := variants(secret)
		if t := strings.TrimSpace(secret); t != secret {
			vs = append(vs, variants(t)...)
		}
		for _, v := range vs {
			if v != "" && !seen[v] {
				seen[v] = true
				forms = append(forms, v)
			}
		}
	}
	s.exact = newMatcher(forms)
	if s.defaults {
		s.patterns = append(s.patterns, defaultPatterns()...)
	}
	s.patterns = append(s.patterns, s.extra...)
	var kws []string
	var masks []uint64
	for i, p := range s.patterns[:min(len(s.patterns), 64)] {
		for _, k := range p.keywords {
			kws = append(kws, k)
			masks = append(masks, 1<<i)
		}
	}
	s.keywords = newKeywordMatcher(kws, masks)
	return s
}

// variants returns the forms of secret to replace.
func variants(secret string) []string {
	if secret == "" {
		return nil
	}
	vs := []string{secret}
	if len(secret) < MinSecretLen {
		return vs
	}
	b := []byte(secret)
	for _, enc := range []*base64.Encoding{
		base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding,
	} {
		vs = append(vs, enc.EncodeToString(b))
	}
	// Inside a longer base64 text the secret starts at one of three
	// offsets within a 3-byte group. Keep only the characters that
	// depend on nothing but the secret's bytes: drop the first group when
	// it mixes in preceding bytes, and the last partial group.
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for k := range 3 {
			shifted := append(make([]byte, k), b...)
			e := enc.EncodeToString(shifted)
			start, end := 0, 4*(len(shifted)/3)
			if k > 0 {
				start = 4
			}
			if end-start >= MinSecretLen {
				vs = append(vs, e[start:end])
			}
		}
	}
	vs = append(vs,
		hex.EncodeToString(b),
		strings.ToUpper(hex.EncodeToString(b)),
		url.QueryEscape(secret),
		url.PathEscape(secret),
	)
	for _, html := range []bool{false, true} {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(html)
		if enc.Encode(secret) == nil {
			q := bytes.TrimSpace(buf.Bytes())
			vs = append(vs, string(q[1:len(q)-1]))
		}
	}
	if strings.ContainsAny(secret, "\r\n") {
		for line := range strings.FieldsFuncSeq(secret, func(r rune) bool { return r == '\n' || r == '\r' }) {
			if line = strings.TrimSpace(line); len(line) >= minFragmentLen {
				vs = append(vs, line)
			}
		}
	}
	return vs
}

// String returns in with every secret and pattern match replaced by
// Redacted.
func (s *Scrubber) String(in string) string {
	out, _ := s.scrub(in)
	return out
}

// Bytes is String for a byte slice. It returns in itself when nothing was
// replaced, else a new slice.
func (s *Scrubber) Bytes(in []byte) []byte {
	if len(in) == 0 {
		return in
	}
	out, n := s.scrub(string(in))
	if n == 0 {
		return in
	}
	return []byte(out)
}

// scrub returns in scrubbed and the number of replacements. When nothing
// is replaced it returns in itself.
func (s *Scrubber) scrub(in string) (string, int) {
	if in == "" {
		return in, 0
	}
	total := 0
	if spans := s.exact.find(in); spans != nil {
		var b strings.Builder
		b.Grow(len(in))
		last := 0
		for _, sp := range spans {
			b.WriteString(in[last:sp.start])
			b.WriteString(Redacted)
			last = sp.end
		}
		b.WriteString(in[last:])
		in = b.String()
		total = len(spans)
	}
	if len(s.patterns) == 0 {
		return in, total
	}
	// The prefilter runs on the text after the exact pass; pattern
	// replacements only insert Redacted, which holds no keyword, so the
	// set of candidate patterns cannot grow.
	hit := s.keywords.any(in)
	for i := range s.patterns {
		p := &s.patterns[i]
		if i < 64 && len(p.keywords) > 0 && hit&(1<<i) == 0 {
			continue
		}
		out, n := p.apply(in)
		in = out
		total += n
	}
	return in, total
}
