package logging

import (
	"regexp"
	"strings"
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

// secretValue matches credential shapes inside free text.
var secretValue = regexp.MustCompile(strings.Join([]string{
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

// RedactString replaces every credential-looking part of s.
func RedactString(s string) string {
	if s == "" {
		return s
	}
	return secretValue.ReplaceAllString(s, Redacted)
}
