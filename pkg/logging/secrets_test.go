package logging

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode"
)

// caseMixes returns s in several mixes of ASCII case: as it is, upper,
// lower, and alternating both ways.
func caseMixes(s string) []string {
	alt := func(odd bool) string {
		b := []rune(s)
		for i, r := range b {
			if (i%2 == 1) == odd {
				b[i] = unicode.ToUpper(r)
			} else {
				b[i] = unicode.ToLower(r)
			}
		}
		return string(b)
	}
	return []string{s, strings.ToUpper(s), strings.ToLower(s), alt(true), alt(false)}
}

// The pre-filter in front of the expression lets every secret through
// to it: each shape the expression knows, in any mix of case (the
// expression ignores case throughout) and with the Unicode letters that
// fold to ASCII ones
// (the Kelvin sign for k, the long s for s), at the start, the end and
// the middle of longer text, and after punctuation. Each is redacted
// whole, and nothing of the secret remains.
func TestPrefilterLetsEverySecretThrough(t *testing.T) {
	type shape struct{ name, secret string }
	shapes := []shape{
		{"bearer", "Bearer abcdefgh12345678"},
		{"bearer tab", "bearer\tabc.def~ghi+jk/l="},
		{"openai", "sk-abcdefghijklmnop1234"},
		{"anthropic", "sk-ant-api03-abcdefghijklmnopqrst"},
		{"google", "AIzaSyA1234567890abcdefghijklmnopqrstu"},
		{"aws akia", "AKIAABCDEFGHIJKLMNOP"},
		{"aws asia", "ASIA1234567890ABCDEF"},
		{"github pat", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"},
		{"github oauth", "gho_abcdefghijklmnopqrstuvwxyz0123456789"},
		{"github server", "ghs_abcdefghijklmnopqrstuvwxyz0123456789"},
		{"slack", "xoxb-1234567890-abcdefghij"},
		{"pem", "-----BEGIN RSA PRIVATE KEY-----"},
		{"pem bare", "-----BEGIN PRIVATE KEY-----"},
		{"jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcdefghijklmnop"},
		{"password", "password=hunter22"},
		{"passwd", "passwd: hunter22"},
		{"secret", "secret=s3cr3tvalue"},
		{"token", "token:abc"},
		{"token short", "token=x"},
		{"api_key", "api_key=abc123"},
		{"api-key", "api-key = abc123"},
		{"apikey", "apikey:abc123"},
	}
	var cases []string
	var secrets []string
	for _, s := range shapes {
		for _, v := range caseMixes(s.secret) {
			cases = append(cases, v)
			secrets = append(secrets, v)
		}
	}
	// Unicode case folding of the expression's (?i) alternatives.
	for _, v := range []string{"to\u212Aen=abc123", "a\u017Fecret=abc123", "pa\u017F\u017Fword=hunter22", "api\u212Aey=abc123", "api_\u212Aey: abc123"} {
		cases = append(cases, v)
		secrets = append(secrets, v)
	}
	for i, secret := range secrets {
		for _, ctx := range []struct{ before, after string }{
			{"", ""},
			{"workflow wf-0123456789ab-00112233 failed: ", ""},
			{"", " (retrying in 2s)"},
			{"call to 127.0.0.1:7071 with ", " and more text after it"},
			{"\"", "\","},
			{"x=1 ", " y=2"},
		} {
			s := ctx.before + secret + ctx.after
			if !secretValue().MatchString(s) {
				t.Fatalf("case %d: the expression itself does not match %q: fix the test", i, s)
			}
			if !mayHoldSecret(s) {
				t.Errorf("the pre-filter skips %q, which holds a secret", s)
			}
			red := RedactString(s)
			if !strings.Contains(red, Redacted) {
				t.Errorf("RedactString(%q) = %q: not redacted", s, red)
			}
			if tail := secret[len(secret)-4:]; strings.Contains(red, tail) && !strings.Contains(ctx.before+ctx.after, tail) {
				t.Errorf("RedactString(%q) = %q: part of the secret remains", s, red)
			}
		}
	}
}

// Whatever the pre-filter skips, the expression would not have matched:
// random strings built from fragments of every shape, case-mixed and
// cut short, never match the expression while the pre-filter says no.
func TestPrefilterIsASuperset(t *testing.T) {
	frags := []string{
		"bearer ", "BEARER\t", "Bearer", "sk-", "AIza", "AKIA", "ASIA", "gh", "ghp_", "p_", "xox", "xoxb-", "-----BEGIN ", "PRIVATE KEY-----",
		"eyJ", ".", "password", "passwd", "secret", "token", "api", "_", "-", "key", "KEY", "=", ":", " ", "\t",
		"abcdefgh", "ABCDEFGH", "01234567", "wf-", "#1", "\u212A", "\u017F", "é", "x",
	}
	rng := rand.New(rand.NewPCG(19, 7))
	matched := 0
	for range 30000 {
		var b strings.Builder
		for range 1 + rng.IntN(8) {
			f := frags[rng.IntN(len(frags))]
			if rng.IntN(4) == 0 {
				f = caseMixes(f)[rng.IntN(5)]
			}
			b.WriteString(f)
		}
		s := b.String()
		if !secretValue().MatchString(s) {
			continue
		}
		matched++
		if !mayHoldSecret(s) {
			t.Fatalf("the pre-filter skips %q, which the expression matches", s)
		}
	}
	if matched < 300 {
		t.Fatalf("only %d of the random strings held a secret: the test proves little", matched)
	}
}

// What a log line is mostly made of never reaches the expression.
func TestPrefilterSkipsIdentifiers(t *testing.T) {
	for _, s := range []string{
		"wf-19a2b3c4d5e-00112233445566778899", "wf-19a2b3c4d5e-00112233445566778899#12", "127.0.0.1:7071", "passthrough:///127.0.0.1:7071",
		"OK", "EXIT_KIND_COMPLETE", "0.0012", "echo", "planner", "/layer0.operator.v1.OperatorService/Execute", "dispatch",
		"workflow_id", "dispatch_id", "duration_ms", "idempotency_key", "resume_token", "session/abc",
	} {
		if mayHoldSecret(s) {
			t.Errorf("the pre-filter sends %q to the expression", s)
		}
		if RedactString(s) != s {
			t.Errorf("RedactString(%q) changed it", s)
		}
	}
}

func BenchmarkRedactString(b *testing.B) {
	for _, s := range []string{"wf-19a2b3c4d5e-00112233445566778899#1", "call failed: connection refused to 127.0.0.1:7071", "sent Bearer abcdefgh12345678"} {
		b.Run(s[:8], func(b *testing.B) {
			for range b.N {
				_ = RedactString(s)
			}
		})
	}
}
