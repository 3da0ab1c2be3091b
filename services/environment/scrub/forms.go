package scrub

import (
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"
)

// normVariants returns the texts whose normalized forms are looked for in
// the normalized text, for a secret of at least MinSecretLen bytes (none
// for a shorter one, which is only replaced verbatim):
//
//   - the secret itself (so any case, separators between its characters,
//     line breaks, and escaping of any of its bytes: %hh, \xhh, \uhhhh);
//   - its hex, also as 0x-prefixed bytes ("0x73, 0x6b") and as decimal
//     bytes ("115 107 ..."); hex with separators ("73:6b", "73 6b",
//     "\x73\x6b", "%73%6B") normalizes to the plain hex;
//   - its base64 (standard and URL alphabets normalize alike) and base32
//     (standard and extended-hex alphabets), whole and at every
//     alignment inside a longer encoded text;
//   - each line of at least 16 bytes of a multi-line secret.
func normVariants(secret string) []string {
	if len(secret) < MinSecretLen {
		return nil
	}
	vs := []string{secret}
	if t := strings.TrimSpace(secret); t != secret && t != "" {
		vs = append(vs, t)
	}
	b := []byte(secret)
	vs = append(vs, hex.EncodeToString(b))
	var ox, dec strings.Builder
	for _, c := range b {
		ox.WriteString("0x")
		ox.WriteString(hex.EncodeToString([]byte{c}))
		ox.WriteByte(' ')
		dec.WriteString(strconv.Itoa(int(c)))
		dec.WriteByte(' ')
	}
	vs = append(vs, ox.String(), dec.String())
	vs = append(vs, base64.StdEncoding.EncodeToString(b))
	vs = append(vs, aligned(b, 6, func(p []byte) string { return base64.RawStdEncoding.EncodeToString(p) })...)
	for _, enc := range []*base32.Encoding{base32.StdEncoding, base32.HexEncoding} {
		vs = append(vs, enc.EncodeToString(b))
		raw := enc.WithPadding(base32.NoPadding)
		vs = append(vs, aligned(b, 5, raw.EncodeToString)...)
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

// aligned returns, for each offset k at which b can start inside a longer
// text encoded with bits bits per character, the characters of that
// encoding that depend on b's bytes alone.
func aligned(b []byte, bits int, encode func([]byte) string) []string {
	var out []string
	for k := 0; k*8 < lcm(8, bits); k++ {
		e := encode(append(make([]byte, k), b...))
		lo := (8*k + bits - 1) / bits
		hi := 8 * (k + len(b)) / bits
		if hi-lo >= MinSecretLen {
			out = append(out, e[lo:hi])
		}
	}
	return out
}

func lcm(a, b int) int {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

// normForms normalizes form f and passes to add the patterns to look for:
// its normalized form and, when text around f could read some of its
// first or last bytes into an escape of its own (see absorbable), its
// core without the units of those bytes, whose matches are widened over
// the escapes next to them. Patterns shorter than MinSecretLen units are
// dropped.
//
// It reports whether those patterns find f wherever it occurs verbatim,
// whatever surrounds it (replacing at least its letters, digits and
// escapes), so that f need not be looked for byte for byte too.
func normForms(f string, add func(string, extent)) (covers bool) {
	units := normalize(f)
	if len(units) < MinSecretLen {
		return false
	}
	add(unitString(units), extent{})
	// A run of separators too long to span dropped the units before
	// it; text that is not UTF-8 may join a rune with what precedes.
	covers = units[0].start == firstUnit(f) && utf8.ValidString(f)
	head, tail := absorbable(f)
	if head == 0 && tail == 0 {
		return covers
	}
	lo, hi := 0, len(units)
	for lo < hi && units[lo].start < head {
		lo++
	}
	for hi > lo && units[hi-1].end > len(f)-tail {
		hi--
	}
	if hi-lo < MinSecretLen || lo > 255 || len(units)-hi > 255 {
		return false
	}
	add(unitString(units[lo:hi]), extent{back: uint8(lo), fwd: uint8(len(units) - hi)})
	return covers
}

// firstUnit is the offset of the first unit of f.
func firstUnit(f string) int {
	for i := 0; i < len(f); {
		t, _ := next(f, i, true)
		if t.nu > 0 {
			return i
		}
		i += t.n
	}
	return len(f)
}

func unitString(u []unitPos) string {
	b := make([]byte, len(u))
	for i, x := range u {
		b[i] = x.b
	}
	return string(b)
}
