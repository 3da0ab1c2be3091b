package tool

import (
	"fmt"
	"unicode/utf8"
)

// truncate cuts s to at most limit bytes, at a rune boundary, and appends
// a notice with the bytes shown and orig, the size of the whole output.
// It reports whether it cut.
func truncate(s string, limit, orig int) (string, bool) {
	if len(s) <= limit {
		return s, false
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("\n[output truncated: showing first %d of %d bytes]", cut, orig), true
}
