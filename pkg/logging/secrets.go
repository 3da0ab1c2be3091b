package logging

import (
	"regexp"
	"strings"
	"sync"
	"unicode/utf8"
)

// secretKeyParts are substrings of attribute or field names whose values
// are always secret.
var secretKeyParts = []string{
	"password", "passwd", "secret", "token", "api_key", "apikey", "api-key",
	"authorization", "credential", "private_key", "cookie",
}

// SecretKey reports whether a field named key holds a secret.
func SecretKey(key string) bool {
	k := strings.ToLower(key)
	for _, p := range secretKeyParts {
		if strings.Contains(k, p) {
			return true
		}
	}
	return false
}

// secretValue matches credential shapes inside free text, in any case
// (the first (?i) holds for every alternative). mayHoldSecret must stay
// a superset of it: change both together. It is compiled on first use:
// its counted repetitions make a large program (50 KB, a fifth of a
// millisecond) that a process whose logs hold nothing like a secret never
// needs.
var secretValue = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(strings.Join([]string{
		`(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}`,                         // HTTP bearer tokens
		`\bsk-[A-Za-z0-9_-]{16,}`,                                       // OpenAI / Anthropic style keys
		`\bAIza[0-9A-Za-z_-]{30,}`,                                      // Google API keys
		`\b(AKIA|ASIA)[0-9A-Z]{16}\b`,                                   // AWS access key ids
		`\bgh[pousr]_[A-Za-z0-9]{30,}`,                                  // GitHub tokens
		`\bxox[abprs]-[A-Za-z0-9-]{10,}`,                                // Slack tokens
		`-----BEGIN [A-Z ]*PRIVATE KEY-----`,                            // PEM private keys
		`\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`,  // JWTs
		`(?i)\b(password|passwd|secret|token|api[_-]?key)\s*[=:]\s*\S+`, // key=value pairs
	}, "|"))
})

// RedactString replaces every credential-looking part of s.
func RedactString(s string) string {
	if !mayHoldSecret(s) {
		return s
	}
	return secretValue().ReplaceAllString(s, Redacted)
}

// mayHoldSecret is a cheap test that secretValue cannot match s, so that
// identifiers, addresses and codes (most of what a log line holds) never
// reach the regular expression. It says yes to every string secretValue
// matches: each alternative of secretValue contains one of the
// substrings tested here. The expression is case-insensitive throughout
// (its first alternative's (?i) holds for the rest of the group), so the
// substrings are looked for in any mix of ASCII case; and strings with a
// byte outside ASCII always go to the expression, since its case folding
// is Unicode's (K, the Kelvin sign, matches k, and ſ, the long s,
// matches s).
func mayHoldSecret(s string) bool {
	if len(s) < minSecretLen {
		return false
	}
	// One pass: at each byte, the substrings that can start there.
	var sep, underscore, gh, name, api, key bool
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf {
			return true
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		switch c {
		case '=', ':':
			sep = true
		case '_':
			underscore = true
		case '-':
			if foldAt(s, i, "-----begin ") {
				return true
			}
		case 'a':
			if foldAt(s, i, "aiza") || foldAt(s, i, "akia") || foldAt(s, i, "asia") {
				return true
			}
			api = api || foldAt(s, i, "api")
		case 'b':
			if foldAt(s, i, "bearer") {
				return true
			}
		case 'e':
			if foldAt(s, i, "eyj") {
				return true
			}
		case 'g':
			gh = gh || foldAt(s, i, "gh")
		case 'k':
			key = key || foldAt(s, i, "key")
		case 'p':
			name = name || foldAt(s, i, "passw")
		case 's':
			if foldAt(s, i, "sk-") {
				return true
			}
			name = name || foldAt(s, i, "secret")
		case 't':
			name = name || foldAt(s, i, "token")
		case 'x':
			if foldAt(s, i, "xox") {
				return true
			}
		}
	}
	// GitHub tokens: gh, a letter, then _; key=value pairs: a name,
	// then = or :.
	return gh && underscore || sep && (name || api && key)
}

// minSecretLen is the length of the shortest string secretValue matches
// ("token=x").
const minSecretLen = 7

// foldAt reports whether s holds sub at i, sub being ASCII in lower
// case, with its letters in any case (its other bytes as they are).
func foldAt(s string, i int, sub string) bool {
	if len(s)-i < len(sub) {
		return false
	}
	for j := 0; j < len(sub); j++ {
		c, want := s[i+j], sub[j]
		if c != want && !('a' <= want && want <= 'z' && c|0x20 == want) {
			return false
		}
	}
	return true
}
