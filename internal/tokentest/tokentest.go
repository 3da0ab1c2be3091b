// Package tokentest helps test that a page token is taken only exactly as
// issued.
package tokentest

import "strings"

// Uncanonical returns forms of token that decode to the same bytes with
// a lenient base64 decoder but are not the token as issued.
func Uncanonical(token string) map[string]string {
	mid := len(token) / 2
	out := map[string]string{
		"line feed inside":       token[:mid] + "\n" + token[mid:],
		"crlf inside":            token[:mid] + "\r\n" + token[mid:],
		"line feed at the end":   token + "\n",
		"line feed at the start": "\n" + token,
		"padding added":          token + strings.Repeat("=", (4-len(token)%4)%4),
		"too much padding":       token + "====",
	}
	// A last character whose unused low bits are set decodes to the
	// same bytes (when the length leaves unused bits).
	if len(token)%4 != 0 {
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
		last := strings.IndexByte(alphabet, token[len(token)-1])
		unused := map[int]int{2: 4, 3: 2}[len(token)%4]
		out["unused bits set"] = token[:len(token)-1] + string(alphabet[last|(1<<unused-1)])
	}
	return out
}
