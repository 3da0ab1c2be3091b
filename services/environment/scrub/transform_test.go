package scrub

import (
	"bytes"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// transformSecret is the credential of the transform tests: it starts
// with hex digits, so an escape before it can swallow its first bytes.
var transformSecret = "ab3_live_" + fake(24)

func joinChars(s, sep string) string { return strings.Join(strings.Split(s, ""), sep) }

func percentAll(s string, upper bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		h := hex.EncodeToString([]byte{s[i]})
		if upper {
			h = strings.ToUpper(h)
		}
		b.WriteString("%" + h)
	}
	return b.String()
}

// percentSome escapes every other byte.
func percentSome(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if i%2 == 1 {
			fmt.Fprintf(&b, "%%%02X", s[i])
		} else {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

func hexSep(s, prefix, sep string) string {
	parts := make([]string, len(s))
	for i := range parts {
		parts[i] = prefix + hex.EncodeToString([]byte{s[i]})
	}
	return strings.Join(parts, sep)
}

func foldLines(s string, width int, eol string) string {
	var b strings.Builder
	for i := 0; i < len(s); i += width {
		if i > 0 {
			b.WriteString(eol)
		}
		b.WriteString(s[i:min(i+width, len(s))])
	}
	return b.String()
}

func flipCase(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z' && i%2 == 0:
			b[i] = c - 32
		case 'A' <= c && c <= 'Z':
			b[i] = c + 32
		}
	}
	return string(b)
}

// transforms are the trivial transforms of a secret the exact pass must
// see through, whole: each must be replaced by one Redacted.
func transforms(secret string) []struct{ name, form string } {
	b := []byte(secret)
	b32 := base32.StdEncoding.EncodeToString(b)
	b32hex := base32.HexEncoding.EncodeToString(b)
	b64 := base64.StdEncoding.EncodeToString(b)
	var chars []string
	for _, c := range secret {
		chars = append(chars, "'"+string(c)+"'")
	}
	var decimal []string
	for _, c := range b {
		decimal = append(decimal, fmt.Sprint(c))
	}
	return []struct{ name, form string }{
		{"upper case", strings.ToUpper(secret)},
		{"lower case", strings.ToLower(secret)},
		{"mixed case", flipCase(secret)},
		{"split across lines", foldLines(secret, 7, "\n")},
		{"split across crlf lines with indentation", foldLines(secret, 5, "\r\n    ")},
		{"dashes between characters", joinChars(secret, "-")},
		{"spaces between characters", joinChars(secret, " ")},
		{"dots between characters", joinChars(secret, ".")},
		{"colons between characters", joinChars(secret, ":")},
		{"zero-width spaces between characters", joinChars(secret, "\u200b")},
		{"python list of characters", "[" + strings.Join(chars, ", ") + "]"},
		{"upper case with separators", joinChars(strings.ToUpper(secret), "_")},
		{"every byte percent-encoded", percentAll(secret, true)},
		{"every byte percent-encoded lower hex", percentAll(secret, false)},
		{"some bytes percent-encoded", percentSome(secret)},
		{"json unicode escapes", hexSep(secret, `\u00`, "")},
		{"hex", hex.EncodeToString(b)},
		{"upper hex", strings.ToUpper(hex.EncodeToString(b))},
		{"hex with colons", hexSep(secret, "", ":")},
		{"hex with spaces", hexSep(secret, "", " ")},
		{"hex escapes", hexSep(secret, `\x`, "")},
		{"0x bytes", hexSep(secret, "0x", ", ")},
		{"hex split across lines", foldLines(hex.EncodeToString(b), 16, "\n")},
		{"decimal bytes", strings.Join(decimal, ", ")},
		{"base64", b64},
		{"base64 lower case", strings.ToLower(b64)},
		{"base64 wrapped", foldLines(b64, 10, "\n")},
		{"base32", b32},
		{"base32 unpadded lower case", strings.ToLower(strings.TrimRight(b32, "="))},
		{"base32 hex alphabet", b32hex},
		{"base32 wrapped", foldLines(b32, 8, "\n")},
		// An escape just before the value swallows its first bytes
		// ("%ab" is one escape), and the rest is upper case.
		{"escape swallowing the start", "%" + strings.ToUpper(secret)},
		{"unicode escape swallowing the start", `\u00` + strings.ToUpper(secret)},
	}
}

// normalized is the units of s as a string.
func normalized(s string) string { return unitString(normalize(s)) }

// leftover reports a run of 8 units of the normalized secret that the
// normalized text still holds.
func leftover(text, secret string) string {
	n, sec := normalized(text), normalized(secret)
	for i := 0; i+8 <= len(sec); i++ {
		if strings.Contains(n, sec[i:i+8]) {
			return sec[i : i+8]
		}
	}
	return ""
}

func TestTransforms(t *testing.T) {
	s := New([]string{transformSecret}, WithoutPatterns())
	for _, tt := range transforms(transformSecret) {
		t.Run(tt.name, func(t *testing.T) {
			in := "pre " + tt.form + " post"
			got, n := s.scrub(in)
			// One replacement, and nothing but separators (quotes,
			// brackets, padding) left around it.
			if n != 1 || normalized(strings.Replace(got, Redacted, " ", 1)) != "prepost" {
				t.Errorf("String(%q)\n = %q (%d replacements)", in, got, n)
			}
			if l := leftover(got, transformSecret); l != "" {
				t.Errorf("%q left %q of the secret", got, l)
			}
		})
	}
}

// TestTransformsInsideEncodedText: the base64 and base32 of a text that
// holds the secret anywhere are caught, and what is left decodes to no 8
// bytes of the secret.
func TestTransformsInsideEncodedText(t *testing.T) {
	s := New([]string{transformSecret}, WithoutPatterns())
	for k := range 5 {
		plain := []byte(strings.Repeat("u", k) + transformSecret + "\n")
		for _, enc := range []struct {
			name   string
			encode func([]byte) string
			decode func(string) ([]byte, error)
		}{
			{"base64", base64.StdEncoding.EncodeToString, base64.RawStdEncoding.DecodeString},
			{"base64url", base64.URLEncoding.EncodeToString, base64.RawURLEncoding.DecodeString},
			{"base32", base32.StdEncoding.EncodeToString, base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString},
			{"base32hex", base32.HexEncoding.EncodeToString, base32.HexEncoding.WithPadding(base32.NoPadding).DecodeString},
		} {
			in := enc.encode(plain)
			got := s.String(in)
			if !strings.Contains(got, Redacted) {
				t.Errorf("%s at offset %d: %q not redacted", enc.name, k, in)
				continue
			}
			for _, part := range strings.Split(got, Redacted) {
				part = strings.TrimRight(part, "=")
				for cut := 0; cut < len(part); cut++ {
					dec, err := enc.decode(part[cut:])
					if err != nil {
						continue
					}
					for i := 0; i+8 <= len(transformSecret); i++ {
						if bytes.Contains(dec, []byte(transformSecret[i:i+8])) {
							t.Errorf("%s at offset %d: %q left %q", enc.name, k, got, transformSecret[i:i+8])
						}
					}
				}
			}
		}
	}
}

// TestShortSecretsStayVerbatim: a secret shorter than MinSecretLen is
// only replaced as it is, so its transforms, which would match ordinary
// text, stay.
func TestShortSecretsStayVerbatim(t *testing.T) {
	s := New([]string{"ab12cd"}, WithoutPatterns())
	for in, want := range map[string]string{
		"x ab12cd y":       "x [REDACTED] y",
		"AB12CD":           "AB12CD",
		"a-b-1-2-c-d":      "a-b-1-2-c-d",
		"%61%62%31%32cd":   "%61%62%31%32cd",
		"616231326364":     "616231326364",
		"the ab 12 cd run": "the ab 12 cd run",
	} {
		if got := s.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	// A long secret with few letters and digits: its own normalized form
	// is too short to look for, its encodings are not.
	s = New([]string{"!!--ab--!!--cd--!!"}, WithoutPatterns())
	if got := s.String("ab cd, AB-CD"); got != "ab cd, AB-CD" {
		t.Errorf("normalized form of a secret with 4 letters matched: %q", got)
	}
	if got := s.String(hex.EncodeToString([]byte("!!--ab--!!--cd--!!"))); got != Redacted {
		t.Errorf("hex of it: %q", got)
	}
}

// TestTransformsLeaveOrdinaryText: with secrets injected, ordinary text
// (the pattern corpus, code, hashes, base64 blobs, prose) is unchanged.
func TestTransformsLeaveOrdinaryText(t *testing.T) {
	s := New([]string{transformSecret, testSecret, "password", "0123456789"}, WithoutPatterns())
	for _, in := range []string{
		"commit 3f786850e387550fdab836ed7e6dc881de23001b (HEAD -> main)",
		"image@sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		"dispatch 123e4567-e89b-12d3-a456-426614174000 done",
		"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEUVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
		"The deployment finished; 3 services restarted, the cache was warmed and the logs show no errors at all.",
		"func main() {\n\tfmt.Println(\"hello, world\") // 100% done\n}\n",
		`{"path": "C:\\temp\\new", "escaped": "\u00e9t\u00e9", "url": "https://example.com/a%20b?q=%3D"}`,
		"the live ab3 run",
		"passing words, pass-port word", // a secret of one word matches only that word
		"0 1 2 3 4 5 6 7 8",
	} {
		if got := s.String(in); got != in {
			t.Errorf("String(%q) = %q", in, got)
		}
	}
	if got := s.String("PassWord and p.a.s.s.w.o.r.d, pass word"); got != "[REDACTED] and [REDACTED], [REDACTED]" {
		t.Errorf("a word-like secret is still found in any case: %q", got)
	}
}

// TestWriterTransformsAcrossChunks: the Writer finds every transform
// whatever the Write calls split it into, and the newlines inside it.
func TestWriterTransformsAcrossChunks(t *testing.T) {
	s := New([]string{transformSecret}, WithoutPatterns())
	for _, tt := range transforms(transformSecret) {
		in := "line one\npre " + tt.form + " post\nlast line\n"
		want := s.String(in)
		for cut := 1; cut < len(in); cut++ {
			var buf bytes.Buffer
			w := s.Writer(&buf)
			io := []string{in[:cut], in[cut:]}
			for _, p := range io {
				if _, err := w.Write([]byte(p)); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			got := buf.String()
			if l := leftover(got, transformSecret); l != "" || !strings.Contains(got, Redacted) {
				t.Fatalf("%s, cut at %d: %q (left %q)", tt.name, cut, got, l)
			}
			if strings.ReplaceAll(got, Redacted+Redacted, Redacted) != want {
				t.Errorf("%s, cut at %d:\n got %q\nwant %q", tt.name, cut, got, want)
			}
		}
		// Byte by byte.
		var buf bytes.Buffer
		w := s.Writer(&buf)
		for i := 0; i < len(in); i++ {
			w.Write([]byte{in[i]})
		}
		w.Close()
		if got := strings.ReplaceAll(buf.String(), Redacted+Redacted, Redacted); got != want {
			t.Errorf("%s, byte by byte:\n got %q\nwant %q", tt.name, got, want)
		}
	}
}

// TestWriterReleasesLines: a complete line is written as soon as nothing
// in it could begin a form that continues on the next, and what could is
// held only until it cannot.
func TestWriterReleasesLines(t *testing.T) {
	s := New([]string{transformSecret}, WithoutPatterns())
	var buf bytes.Buffer
	w := s.Writer(&buf)
	io := func(p string) { w.Write([]byte(p)) }
	io("hello world\n")
	if got := buf.String(); got != "hello world\n" {
		t.Errorf("a line nothing continues was held: %q", got)
	}
	sec := strings.ToUpper(transformSecret)
	io("key: " + sec[:10] + "\n")
	if strings.Contains(buf.String(), sec[:10]) || strings.Contains(buf.String(), "key") {
		t.Errorf("the start of a secret split over two lines was written: %q", buf.String())
	}
	io("  " + sec[10:] + "\nnext\n")
	if got := buf.String(); got != "hello world\nkey: [REDACTED]\nnext\n" {
		t.Errorf("got %q", got)
	}
	w.Close()
}

// TestScannerAgainstNaive compares the scanner, in one piece and fed in
// random pieces, with a brute-force search of the same forms over random
// texts rich in escapes, separators and pieces of the secrets.
func TestScannerAgainstNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const alphabet = "ab1fAB%\\xu0-_ \n"
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	for iter := range 1500 {
		secrets := []string{word(8 + r.IntN(6))}
		if r.IntN(3) == 0 {
			secrets = append(secrets, word(3+r.IntN(10)))
		}
		forms, norms, exts := compile(secrets)
		raw, norm := newMatcher(forms), newNormMatcher(norms, exts)
		var in strings.Builder
		for range 1 + r.IntN(4) {
			in.WriteString(word(r.IntN(12)))
			sec := secrets[r.IntN(len(secrets))]
			switch r.IntN(4) {
			case 0:
				in.WriteString(sec)
			case 1:
				in.WriteString(strings.ToUpper(sec))
			case 2:
				in.WriteString(percentSome(sec))
			case 3:
				in.WriteString(joinChars(sec, " "))
			}
		}
		text := in.String()
		want := naiveMask(forms, norms, exts, text)

		sc := newScanner(raw, norm)
		feed(sc, text, 0, true)
		got := maskOf(sc.spans, len(text))
		if !slices.Equal(got, want) {
			t.Fatalf("iteration %d: secrets %q text %q:\n got %v\nwant %v", iter, secrets, text, sc.spans, spansOf(want))
		}

		// In random pieces, releasing what is safe after each.
		sc = newScanner(raw, norm)
		var held []byte
		base := 0
		var released []span
		for pos := 0; pos < len(text); {
			n := 1 + r.IntN(5)
			held = append(held, text[pos:min(pos+n, len(text))]...)
			pos = min(pos+n, len(text))
			final := pos == len(text)
			feed(sc, held, base, final)
			upto := base + len(held)
			if !final {
				upto = sc.safe()
			}
			released = append(released, sc.spans[:countBefore(sc.spans, upto)]...)
			take(sc, nil, held, base, upto)
			held = append(held[:0], held[upto-base:]...)
			base = upto
		}
		// Released in pieces, a span may end before plain separators
		// that a later match would have covered: they are released
		// (they carry nothing of the secret) and the later match
		// clipped. Every byte of a unit or escape is covered exactly
		// as in one piece, and nothing more.
		got = maskOf(released, len(text))
		sig := significant(text)
		for i := range got {
			if got[i] && !want[i] || sig[i] && got[i] != want[i] {
				t.Fatalf("iteration %d, streamed: secrets %q text %q: byte %d:\n got %v\nwant %v", iter, secrets, text, i, released, spansOf(want))
			}
		}
	}
}

// significant marks the bytes of text that are not plain separators.
func significant(text string) []bool {
	m := make([]bool, len(text))
	for i := 0; i < len(text); {
		t, _ := next(text, i, true)
		for j := i; j < i+t.n; j++ {
			m[j] = t.nu > 0 || t.esc
		}
		i += t.n
	}
	return m
}

func countBefore(spans []span, upto int) int {
	n := 0
	for n < len(spans) && spans[n].end <= upto {
		n++
	}
	return n
}

func maskOf(spans []span, n int) []bool {
	m := make([]bool, n)
	for _, sp := range spans {
		for i := sp.start; i < sp.end; i++ {
			m[i] = true
		}
	}
	return m
}

func spansOf(m []bool) []span {
	var out []span
	for i := 0; i < len(m); {
		if !m[i] {
			i++
			continue
		}
		j := i
		for j < len(m) && m[j] {
			j++
		}
		out = append(out, span{i, j})
		i = j
	}
	return out
}

// naiveMask marks the bytes of text that the raw forms and the
// normalized forms (with their extents) cover, by brute force.
func naiveMask(forms, norms []string, exts []extent, text string) []bool {
	mask := make([]bool, len(text))
	for _, f := range forms {
		for i := 0; i+len(f) <= len(text); i++ {
			if text[i:i+len(f)] == f {
				for j := i; j < i+len(f); j++ {
					mask[j] = true
				}
			}
		}
	}
	// The tokens of the text.
	type tok struct {
		start, end int
		unit       byte
		isUnit     bool
		esc        bool
	}
	var toks []tok
	for i := 0; i < len(text); {
		t, _ := next(text, i, true)
		if t.nu == 0 {
			toks = append(toks, tok{start: i, end: i + t.n, esc: t.esc})
		}
		for j := range t.nu {
			toks = append(toks, tok{start: i, end: i + t.n, unit: t.u[j], isUnit: true, esc: t.esc})
		}
		i += t.n
	}
	var units []int // indexes into toks
	for i, t := range toks {
		if t.isUnit {
			units = append(units, i)
		}
	}
	for pi, p := range norms {
		for u := 0; u+len(p) <= len(units); u++ {
			ok := true
			for k := 0; k < len(p) && ok; k++ {
				ok = toks[units[u+k]].unit == p[k]
				if k > 0 && ok {
					// The separator bytes between two units.
					gap := 0
					for ti := units[u+k-1] + 1; ti < units[u+k]; ti++ {
						gap += toks[ti].end - toks[ti].start
					}
					ok = gap <= maxGap
				}
			}
			if !ok {
				continue
			}
			first, last := units[u], units[u+len(p)-1]
			start, end := toks[first].start, toks[last].end
			// Widened back over escapes from the back-th unit before.
			from := 0
			if b := int(exts[pi].back); u-b > 0 {
				from = units[u-b-1] + 1
			}
			if exts[pi].back > 0 {
				for ti := from; ti <= first; ti++ {
					if toks[ti].esc {
						start = min(start, toks[ti].start)
					}
				}
			}
			// Widened forward over escapes up to the fwd-th unit after.
			if f := int(exts[pi].fwd); f > 0 {
				to := len(toks)
				if u+len(p)-1+f < len(units) {
					to = units[u+len(p)-1+f] + 1
				}
				for ti := last + 1; ti < to; ti++ {
					if toks[ti].esc {
						end = max(end, toks[ti].end)
					}
				}
			}
			for j := start; j < end; j++ {
				mask[j] = true
			}
		}
	}
	return mask
}

func BenchmarkScrub(b *testing.B) {
	secrets := []string{testSecret, "sk-ant-api03-" + fake(80), "ghp_" + fake(36), transformSecret}
	para := "The deployment finished; 3 services restarted, the cache was warmed and the logs show no errors at all.\n"
	clean := strings.Repeat(para, 640) // 64 KiB
	leaky := strings.Repeat(para, 100) + joinChars(strings.ToUpper(testSecret), "-") + "\n" + strings.Repeat(para, 100) + percentSome(transformSecret) + strings.Repeat(para, 440)
	for _, bc := range []struct {
		name string
		s    *Scrubber
		in   string
	}{
		{"clean/exact only", New(secrets, WithoutPatterns()), clean},
		{"clean/with patterns", New(secrets), clean},
		{"leaky/exact only", New(secrets, WithoutPatterns()), leaky},
		{"clean/no secrets", New(nil, WithoutPatterns()), clean},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.in)))
			b.ReportAllocs()
			for b.Loop() {
				bc.s.String(bc.in)
			}
		})
	}
	b.Run("writer/exact only", func(b *testing.B) {
		s := New(secrets, WithoutPatterns())
		b.SetBytes(int64(len(leaky)))
		b.ReportAllocs()
		for b.Loop() {
			w := s.Writer(discard{})
			for i := 0; i < len(leaky); i += 4096 {
				w.Write([]byte(leaky[i:min(i+4096, len(leaky))]))
			}
			w.Close()
		}
	})
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			New(secrets)
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
