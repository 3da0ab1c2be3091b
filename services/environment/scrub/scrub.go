package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
	"sync"
)

// Redacted replaces every exact secret value, every encoding of one, and
// every pattern match.
const Redacted = "[REDACTED]"

// MinSecretLen is the length from which a secret is also found
// transformed (any case, separators and line breaks between its
// characters, escaped bytes) and encoded (base64, base32, hex), as well
// as verbatim. A shorter secret's transforms would too often occur in
// ordinary text (a 5-letter value case-insensitively, with any
// punctuation between its letters), so a shorter secret is replaced
// verbatim only, wherever it occurs; so is any form with fewer than
// MinSecretLen letters and digits.
const MinSecretLen = 8

// minFragmentLen is the shortest line of a multi-line secret that is
// replaced on its own (see New).
const minFragmentLen = 16

// Scrubber replaces credentials in text and messages. It is immutable
// after New and safe for concurrent use.
type Scrubber struct {
	// exact finds the exact forms byte for byte, norm the normalized
	// forms in the normalized text (see normalize.go).
	exact, norm *matcher
	scanners    sync.Pool
	defaults    bool
	extra       []pattern
	patterns    []pattern
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
// A secret of at least MinSecretLen bytes is also found transformed and
// encoded, in a normalized view of the text (see normalize.go) where
// only letters and digits count, ASCII case folded, and escapes are
// decoded. So the secret is found
//
//   - in any case ("SK_LIVE_...", "sk_live_..." for "sk_Live_...");
//   - split over lines, with any white space, punctuation or zero-width
//     characters between its characters ("s-k-_-l-i-v-e", "s k l",
//     "['s', 'k', ...]"), up to 64 bytes of them at a time;
//   - with any of its bytes escaped: %hh (URL escaping, whole or in
//     part), \xhh and \uhhhh (C, Python, JSON);
//   - as hex, plain or separated ("736b5f", "73:6b:5f", "73 6B",
//     "\x73\x6b", "%73%6B", "0x73, 0x6b"), and as decimal bytes
//     ("115, 107, 95");
//   - as base64 (standard and URL alphabets) and base32 (standard and
//     extended-hex alphabets), padded or not, in any case, wrapped over
//     lines, alone or inside a longer encoded text at any alignment (the
//     "Basic " auth of "user:secret", `echo $KEY | base64`): there only
//     the characters that depend on the secret alone are looked for,
//     and padding right after a match is replaced with it;
//   - each line of at least 16 bytes of a multi-line secret (a PEM key,
//     a service-account JSON) on its own, as printed alone.
//
// An escape just before or after a form can swallow its first or last
// bytes ("%" before "ab12..." reads as the escape %ab); a form is also
// looked for without those bytes, and such a match widened over the
// escapes next to it. A secret with leading or trailing white space (a
// value read from a file with its newline) is also replaced trimmed.
// Empty secrets are skipped. Transforms of transforms (the hex of the
// upper-cased secret, the base64 of its hex) are not looked for.
//
// The forms are found in one pass over the text, in time linear in its
// length whatever the number of secrets: the normalized forms by an
// Aho–Corasick automaton run over the normalized text as it is read,
// and the few forms it cannot be sure to find (those of a short secret)
// by a second automaton over the raw bytes (chosen over
// strings.Replacer, which neither counts replacements nor lets overlaps
// be resolved other than first-listed-wins). Overlapping matches are
// merged into one replacement, so when one secret is a prefix of
// another, or two overlap, the whole run is replaced and no fragment of
// either is left; the separators inside a match are replaced with it.
// Exact values are replaced before the patterns run.
func New(secrets []string, opts ...Option) *Scrubber {
	s := &Scrubber{defaults: true}
	for _, o := range opts {
		o(s)
	}
	forms, norms, exts := compile(secrets)
	s.exact = newMatcher(forms)
	s.norm = newNormMatcher(norms, exts)
	s.scanners.New = func() any { return newScanner(s.exact, s.norm) }
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

// compile returns the exact forms of secrets and their normalized forms
// with the extent of each, without duplicates.
func compile(secrets []string) (forms, norms []string, exts []extent) {
	seen := map[string]bool{}
	normSeen := map[string]int{}
	addNorm := func(f string, e extent) {
		if i, dup := normSeen[f]; dup {
			exts[i].back = max(exts[i].back, e.back)
			exts[i].fwd = max(exts[i].fwd, e.fwd)
			return
		}
		normSeen[f] = len(norms)
		norms = append(norms, f)
		exts = append(exts, e)
	}
	for _, secret := range secrets {
		vs := variants(secret)
		if t := strings.TrimSpace(secret); t != secret {
			vs = append(vs, variants(t)...)
		}
		for _, v := range vs {
			if v == "" || seen[v] {
				continue
			}
			seen[v] = true
			// A form the normalized pass is sure to find is not also
			// looked for byte for byte. A short secret is only looked
			// for byte for byte.
			if len(secret) >= MinSecretLen && len(v) >= MinSecretLen && normForms(v, addNorm) {
				continue
			}
			forms = append(forms, v)
		}
		for _, f := range normVariants(secret) {
			normForms(f, addNorm)
		}
	}
	return forms, norms, exts
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
	in, total := s.exactPass(in)
	out, n := s.patternPass(in)
	return out, total + n
}

// exactPass replaces the exact and normalized forms of the secrets.
func (s *Scrubber) exactPass(in string) (string, int) {
	if s.exact == nil && s.norm == nil {
		return in, 0
	}
	sc := s.scanners.Get().(*scanner)
	defer s.scanners.Put(sc)
	sc.reset()
	feed(sc, in, 0, true)
	if len(sc.spans) == 0 {
		return in, 0
	}
	out := take(sc, make([]byte, 0, len(in)+len(sc.spans)*len(Redacted)), in, 0, len(in))
	return string(out), sc.taken
}

// patternPass applies the patterns.
func (s *Scrubber) patternPass(in string) (string, int) {
	total := 0
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
