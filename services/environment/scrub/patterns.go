package scrub

import (
	"regexp"
	"strings"
	"sync"
)

// secretGroup is the capture group name that marks the part of a pattern
// match to redact. A pattern may use it in several alternatives; the
// first one that took part in the match is redacted. Without such a
// group the whole match is redacted.
const secretGroup = "secret"

// pattern is one compiled redaction rule.
type pattern struct {
	name string
	re   *regexp.Regexp
	// keywords are lower-case strings of which at least one occurs,
	// ignoring ASCII case, in any text the pattern can match; the regexp
	// runs only on text that has one. Empty means it always runs.
	keywords []string
	// groups are the indexes of the capture groups named secretGroup.
	groups []int
	// valid, when set, must accept the text to redact.
	valid func(string) bool
}

func newPattern(name string, re *regexp.Regexp, keywords []string, valid func(string) bool) pattern {
	p := pattern{name: name, re: re, keywords: keywords, valid: valid}
	for i, n := range re.SubexpNames() {
		if n == secretGroup {
			p.groups = append(p.groups, i)
		}
	}
	return p
}

// apply replaces each match (or its secret group) in in by Redacted. Text
// that already is Redacted, or that valid refuses, is left as it is.
func (p *pattern) apply(in string) (string, int) {
	locs := p.re.FindAllStringSubmatchIndex(in, -1)
	if locs == nil {
		return in, 0
	}
	var b strings.Builder
	last, n := 0, 0
	for _, loc := range locs {
		start, end := loc[0], loc[1]
		if len(p.groups) > 0 {
			start = -1
			for _, g := range p.groups {
				if loc[2*g] >= 0 {
					start, end = loc[2*g], loc[2*g+1]
					break
				}
			}
		}
		if start < last || start == end {
			continue
		}
		val := in[start:end]
		if val == Redacted || (p.valid != nil && !p.valid(val)) {
			continue
		}
		if n == 0 {
			b.Grow(len(in))
		}
		b.WriteString(in[last:start])
		b.WriteString(Redacted)
		last = end
		n++
	}
	if n == 0 {
		return in, 0
	}
	b.WriteString(in[last:])
	return b.String(), n
}

// Building blocks of the default patterns.
const (
	// keyName is an identifier ending in a credential word, such as
	// password, DB_PASSWORD, client_secret, GITHUB_TOKEN or x-api-key.
	// The word must end the identifier, so "tokens_in" and "max_tokens"
	// are not credential names.
	keyName = `(?:[a-z0-9]+[_.-])*(?:passw(?:or)?d|secret|token|api[_-]?key)`
	// bareValue is an unquoted value: it ends at white space, a quote,
	// a separator or '&' (the next query parameter).
	bareValue = `[^\s&"',;<>]+`
)

// defaultPatterns are the patterns every Scrubber uses unless
// WithoutPatterns is given, compiled once. The slice is never modified.
var defaultPatterns = sync.OnceValue(func() []pattern {
	mk := func(name, expr string, keywords []string, valid func(string) bool) pattern {
		return newPattern(name, regexp.MustCompile(expr), keywords, valid)
	}
	// Token formats first: they redact whole tokens, so the context
	// rules after them see Redacted rather than a half-redacted value.
	return []pattern{
		// PEM private keys, BEGIN line through END line. A block that is
		// never closed (truncated output) is redacted to the end.
		mk("pem private key",
			`-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY-----|[\s\S]*)`,
			[]string{"private key-----"}, nil),
		mk("anthropic key", `\bsk-ant-[A-Za-z0-9_-]{20,}`, []string{"sk-ant-"}, nil),
		// Also sk-proj-, sk-svcacct-, sk-admin-. The first character after
		// "sk-" must be alphanumeric; \b keeps "task-..." and "risk-..." out.
		mk("openai key", `\bsk-[A-Za-z0-9][A-Za-z0-9_-]{19,}`, []string{"sk-"}, nil),
		mk("google api key", `\bAIza[0-9A-Za-z_-]{35}`, []string{"aiza"}, nil),
		mk("github token", `\bgh[pousr]_[A-Za-z0-9]{36,}`,
			[]string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_"}, nil),
		mk("github fine-grained token", `\bgithub_pat_[A-Za-z0-9_]{22,}`, []string{"github_pat_"}, nil),
		mk("slack token", `\bxox[abprs]-[A-Za-z0-9-]{10,}`, []string{"xox"}, nil),
		mk("aws access key id", `\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`, []string{"akia", "asia"}, nil),
		mk("stripe key", `\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}`, []string{"_live_", "_test_"}, nil),
		mk("jwt", `\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}`, []string{"eyj"}, nil),

		// Context rules: only the value is redacted.
		mk("aws secret access key",
			`(?i)\baws_?secret_?access_?key["']?\s*[:=]\s*["']?(?P<secret>[a-z0-9/+]{40})`,
			[]string{"secret"}, nil),
		// An Authorization header or field with a scheme; the scheme word
		// (Bearer, Basic, ...) is kept.
		mk("authorization header",
			`(?i)\bauthorization["']?\s*[:=]\s*["']?(?:bearer|basic|token|bot|digest)\s+(?P<secret>[^\s"',;]+)`,
			[]string{"authorization"}, nil),
		// An Authorization header without a scheme word. The value must
		// look random, so "authorization: we use OAuth" stays.
		mk("authorization value",
			`(?i)\bauthorization["']?\s*[:=]\s*["']?(?P<secret>[^\s"',;]+)`,
			[]string{"authorization"}, func(v string) bool { return notScheme(v) && looksRandom(v) }),
		// A bare "Bearer <token>" outside a header. The token must be
		// long and look random, so "the bearer of bad news" stays.
		mk("bearer token",
			`(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)`,
			[]string{"bearer"}, looksRandom),
		// x-api-key / x-goog-api-key / api-key headers (also as logged
		// by Go: "X-Api-Key:[...]"). The value must look random, so
		// "the api-key: see below" stays.
		mk("api key header",
			`(?i)\b(?:x-goog-|x-)?api-key["']?\s*[:=]\s*["'\[]?(?P<secret>[^\s"',;\[\]]+)`,
			[]string{"api-key"}, looksRandom),
		// "api_key": "..." and 'api_key': '...' (JSON, Python dicts).
		mk("quoted assignment",
			`(?i)"`+keyName+`"\s*:\s*"(?P<secret>(?:[^"\\\n]|\\.)+)"|'`+keyName+`'\s*:\s*'(?P<secret>[^'\n]+)'`,
			[]string{"passw", "secret", "token", "api_key", "api-key", "apikey"}, nil),
		// key=value: a quoted value may have spaces around '=' (and ':='),
		// a bare one may not, so "token = 5" in prose is left alone.
		mk("assignment",
			`(?i)\b`+keyName+`(?:\s*:?=\s*(?:"(?P<secret>[^"\n]+)"|'(?P<secret>[^'\n]+)')|=(?P<secret>`+bareValue+`))`,
			[]string{"passw", "secret", "token", "api_key", "api-key", "apikey"}, nil),
		// The password in a URL's user info: scheme://user:password@host.
		mk("url password",
			`(?i)\b[a-z][a-z0-9+.-]*://[^\s:/@]+:(?P<secret>[^\s/@]+)@`,
			[]string{"://"}, nil),
	}
})

// notScheme refuses a bare authorization scheme word taken for a value
// ("Authorization: Bearer" with nothing after it).
func notScheme(v string) bool {
	for _, w := range []string{"bearer", "basic", "token", "bot", "digest"} {
		if strings.EqualFold(v, w) {
			return false
		}
	}
	return true
}

// looksRandom reports whether v has a digit, or both upper- and
// lower-case letters: true of nearly every generated token, false of
// nearly every English word.
func looksRandom(v string) bool {
	var digit, upper, lower bool
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case '0' <= c && c <= '9':
			digit = true
		case 'A' <= c && c <= 'Z':
			upper = true
		case 'a' <= c && c <= 'z':
			lower = true
		}
	}
	return digit || (upper && lower)
}

// pemBegin and pemEnd find the delimiters of a PEM private key block, for
// the line-based Writer.
var (
	pemBegin = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----`)
	})
	pemEnd = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`-----END[A-Z0-9 ]*PRIVATE KEY-----`)
	})
)
