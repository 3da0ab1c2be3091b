package scrub

import (
	"unicode"
	"unicode/utf8"
)

// The normalized stream.
//
// Besides its exact forms, a secret of at least MinSecretLen bytes is
// looked for in a normalized view of the text, in which
//
//   - letters and digits are units, ASCII letters folded to lower case
//     (other letters by unicode.ToLower, each byte of the UTF-8 of the
//     folded rune a unit);
//   - everything else (white space and line breaks, punctuation,
//     symbols, control and zero-width characters) separates units and is
//     dropped, so "s-k-_-l-i-v-e", "S K L I V E" and a value folded over
//     several lines all read "sklive";
//   - base64 and base32 padding ("=") right after a match is replaced
//     with it;
//   - escapes are decoded first: %hh (URL escaping of any subset of the
//     bytes), \xhh and \uhhhh (C, Python and JSON escapes); \n, \r, \t
//     and \\ are separators; a % or \ that starts no escape is a
//     separator.
//
// A run of more than maxGap separator bytes ends any match in progress,
// so unrelated words far apart are never joined.
//
// The secret's forms are normalized the same way, so a form occurs in the
// normalized text whenever it occurs in the text with any case, any
// separators between its characters and any of its bytes escaped.

// maxGap is the longest run of separator bytes a match may span.
const maxGap = 64

// Byte kinds of the normalizer.
const (
	kindSep  = iota // dropped
	kindLit         // a unit: ASCII letter or digit
	kindPct         // '%': maybe an escape
	kindBsl         // '\\': maybe an escape
	kindHigh        // a byte >= 0x80: part of a UTF-8 sequence
	kindPad         // '=': a separator that joins a match it follows
)

var byteKind, lowerByte = func() (kind, lower [256]uint8) {
	for c := range 256 {
		lower[c] = uint8(c)
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
			kind[c] = kindLit
		case 'A' <= c && c <= 'Z':
			kind[c] = kindLit
			lower[c] = uint8(c + 'a' - 'A')
		case c == '%':
			kind[c] = kindPct
		case c == '\\':
			kind[c] = kindBsl
		case c == '=':
			kind[c] = kindPad
		case c >= 0x80:
			kind[c] = kindHigh
		default:
			kind[c] = kindSep
		}
	}
	return kind, lower
}()

// text is what the normalizer reads.
type text interface{ ~string | ~[]byte }

// token is one step of the normalizer: n bytes of input that give the
// units u[:nu] (none for a separator), esc set when they were an escape.
type token struct {
	n   int
	u   [utf8.UTFMax]byte
	nu  int
	esc bool
}

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// hexRun decodes the k hex digits at data[i:]; avail reports whether
// the bytes present (fewer than k when the input ends early) are all
// hex digits.
func hexRun[T text](data T, i, k int) (v rune, ok, avail bool) {
	for j := range k {
		if i+j >= len(data) {
			return 0, false, true
		}
		h, isHex := hexVal(data[i+j])
		if !isHex {
			return 0, false, false
		}
		v = v<<4 | rune(h)
	}
	return v, true, true
}

// next reads the token at data[i]. When the bytes there could start an
// escape or a UTF-8 sequence that the input ends too early to tell,
// it returns wait unless final, in which case the incomplete start is
// read as it stands.
func next[T text](data T, i int, final bool) (t token, wait bool) {
	c := data[i]
	switch byteKind[c] {
	case kindLit:
		t.n, t.nu, t.u[0] = 1, 1, lowerByte[c]
		return t, false
	case kindSep, kindPad:
		t.n = 1
		return t, false
	case kindPct:
		v, ok, avail := hexRun(data, i+1, 2)
		if ok {
			return byteToken(byte(v), 3), false
		}
		if avail && !final {
			return t, true
		}
		t.n = 1
		return t, false
	case kindBsl:
		if i+1 >= len(data) {
			if !final {
				return t, true
			}
			t.n = 1
			return t, false
		}
		switch data[i+1] {
		case 'x':
			v, ok, avail := hexRun(data, i+2, 2)
			if ok {
				return byteToken(byte(v), 4), false
			}
			if avail && !final {
				return t, true
			}
		case 'u':
			v, ok, avail := hexRun(data, i+2, 4)
			if ok && !(0xd800 <= v && v < 0xe000) {
				return runeToken(v, 6, true), false
			}
			if !ok && avail && !final {
				return t, true
			}
		case 'n', 'r', 't', '\\':
			t.n, t.esc = 2, true
			return t, false
		}
		t.n = 1
		return t, false
	}
	// A UTF-8 sequence.
	k := 1
	switch {
	case c >= 0xf0:
		k = 4
	case c >= 0xe0:
		k = 3
	case c >= 0xc0:
		k = 2
	}
	if i+k > len(data) && !final {
		// Wait only while what there is can still become a rune.
		complete := true
		for j := i + 1; j < len(data); j++ {
			if data[j]&0xc0 != 0x80 {
				complete = false
			}
		}
		if complete {
			return t, true
		}
	}
	var buf [utf8.UTFMax]byte
	n := 0
	for ; n < k && i+n < len(data); n++ {
		buf[n] = data[i+n]
	}
	r, size := utf8.DecodeRune(buf[:n])
	if r == utf8.RuneError && size <= 1 {
		// Not UTF-8: the byte is a unit of its own.
		t.n, t.nu, t.u[0] = 1, 1, c
		return t, false
	}
	t = runeToken(r, size, false)
	return t, false
}

// byteToken is the token of an escaped byte (%hh, \xhh) read from n
// bytes: an ASCII letter or digit is a unit, other ASCII a separator,
// and a byte of a UTF-8 sequence a unit as it is.
func byteToken(b byte, n int) token {
	if b < 0x80 {
		return runeToken(rune(b), n, true)
	}
	return token{n: n, esc: true, nu: 1, u: [utf8.UTFMax]byte{b}}
}

// runeToken is the token of rune r read from n bytes.
func runeToken(r rune, n int, esc bool) token {
	t := token{n: n, esc: esc}
	switch {
	case r < 0x80:
		if byteKind[r] == kindLit {
			t.nu, t.u[0] = 1, lowerByte[r]
		}
	case unicode.IsLetter(r) || unicode.IsNumber(r):
		t.nu = utf8.EncodeRune(t.u[:], unicode.ToLower(r))
	}
	return t
}

// unitPos is a unit of the normalized form of a string, with the bytes
// of the string it came from.
type unitPos struct {
	b          byte
	start, end int
}

// normalize returns the units of s, as the scanner would read them in a
// text that is s alone.
func normalize(s string) []unitPos {
	var out []unitPos
	gap := 0
	for i := 0; i < len(s); {
		t, _ := next(s, i, true)
		if t.nu == 0 {
			gap += t.n
			if gap > maxGap {
				// A match cannot span this gap; only what follows it
				// is a usable form.
				out = out[:0]
			}
		} else {
			gap = 0
		}
		for j := range t.nu {
			out = append(out, unitPos{t.u[j], i, i + t.n})
		}
		i += t.n
	}
	return out
}

// absorbable returns how many bytes at the start of a form, and at its
// end, the text around it can swallow into an escape of its own: "%"
// before "41..." reads as the escape %41; "...%4" before "1" reads as
// %41. Only the units of the form outside those bytes are read the same
// whatever surrounds it.
func absorbable(s string) (head, tail int) {
	isHex := func(i int) bool {
		if i >= len(s) {
			return false
		}
		_, ok := hexVal(s[i])
		return ok
	}
	// Head: the text ends in "%", "%h", "\x", "\xh", "\u", "\uh"...
	lead := 0
	for lead < 4 && isHex(lead) {
		lead++
	}
	head = lead // up to 4 hex digits complete a "\u" (2 a "%" or "\x")
	if len(s) > 0 {
		switch s[0] {
		case 'x':
			if isHex(1) && isHex(2) {
				head = max(head, 3) // "\" + "x41"
			}
		case 'u':
			if isHex(1) && isHex(2) && isHex(3) && isHex(4) {
				head = max(head, 5) // "\" + "u0041"
			}
		case 'n', 'r', 't', '\\':
			head = max(head, 1) // "\" + "n"
		}
	}
	// Tail: the form ends in an unfinished escape.
	for k := 1; k <= 5 && k <= len(s); k++ {
		if escapePrefix(s[len(s)-k:]) {
			tail = k
		}
	}
	return head, tail
}

// escapePrefix reports whether s is a proper prefix of an escape.
func escapePrefix(s string) bool {
	hexes := func(t string) bool {
		for i := 0; i < len(t); i++ {
			if _, ok := hexVal(t[i]); !ok {
				return false
			}
		}
		return true
	}
	switch {
	case s == "%" || s == "\\":
		return true
	case s[0] == '%':
		return len(s) < 3 && hexes(s[1:])
	case len(s) >= 2 && s[0] == '\\' && s[1] == 'x':
		return len(s) < 4 && hexes(s[2:])
	case len(s) >= 2 && s[0] == '\\' && s[1] == 'u':
		return len(s) < 6 && hexes(s[2:])
	}
	return false
}
