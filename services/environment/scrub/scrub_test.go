package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// fake returns a deterministic token body of n mixed-case letters and
// digits. Test credentials are assembled at run time so the source holds
// nothing a secret scanner would flag.
func fake(n int) string {
	const chars = "aB3xK9mQ7tZ2wR5pL8cV4nH6"
	var b strings.Builder
	for i := range n {
		b.WriteByte(chars[(i*7+i/len(chars))%len(chars)])
	}
	return b.String()
}

func TestPatterns(t *testing.T) {
	jwt := "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9" + "." +
		"eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0" + "." +
		"SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	awsSecret := "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
	pem := "-----BEGIN RSA PRIVATE KEY-----\n" +
		"MIIEowIBAAKCAQEA" + fake(48) + "\n" +
		fake(64) + "\n" +
		"-----END RSA PRIVATE KEY-----"
	tests := []struct {
		name, in, want string
	}{
		{"anthropic key", "using sk-ant-" + "api03-" + fake(80) + "AA now", "using [REDACTED] now"},
		{"openai legacy key", "OpenAI sk-" + fake(48), "OpenAI [REDACTED]"},
		{"openai project key", "(sk-" + "proj-" + fake(60) + ").", "([REDACTED])."},
		{"google api key", "maps AIza" + fake(35) + " end", "maps [REDACTED] end"},
		{"github ghp", "ghp_" + fake(36), "[REDACTED]"},
		{"github gho", "token gho_" + fake(36) + "\n", "token [REDACTED]\n"},
		{"github ghs in url", "https://x-access-token:ghs_" + fake(36) + "@github.com/o/r", "https://x-access-token:[REDACTED]@github.com/o/r"},
		{"github fine-grained", "github_pat_" + fake(22) + "_" + fake(59), "[REDACTED]"},
		{"slack bot", "xoxb-" + "1234567890-" + fake(24), "[REDACTED]"},
		{"slack user", "SLACK xoxp-" + fake(30) + " ok", "SLACK [REDACTED] ok"},
		{"aws access key id", "id AKIA" + "IOSFODNN7EXAMPLE,", "id [REDACTED],"},
		{"aws session key id", "ASIA" + "ABCDEFGHIJ234567", "[REDACTED]"},
		{"aws secret env", "AWS_SECRET_ACCESS_KEY=" + awsSecret, "AWS_SECRET_ACCESS_KEY=[REDACTED]"},
		{"aws secret ini", "aws_secret_access_key = " + awsSecret + "\n", "aws_secret_access_key = [REDACTED]\n"},
		{"aws secret json", `{"aws_secret_access_key": "` + awsSecret + `"}`, `{"aws_secret_access_key": "[REDACTED]"}`},
		{"stripe secret key", "sk_" + "live_" + fake(24), "[REDACTED]"},
		{"stripe restricted key", "key rk_" + "live_" + fake(24) + ".", "key [REDACTED]."},
		{"jwt", "session=" + "x; jwt " + jwt + " end", "session=x; jwt [REDACTED] end"},
		{"authorization bearer", "Authorization: Bearer abc123def456", "Authorization: Bearer [REDACTED]"},
		{"authorization bearer jwt", "Authorization: Bearer " + jwt, "Authorization: Bearer [REDACTED]"},
		{"authorization basic", "authorization: Basic dXNlcjpwYXNzd29yZA==", "authorization: Basic [REDACTED]"},
		{"authorization json", `{"Authorization": "Bearer abcdefgh"}`, `{"Authorization": "Bearer [REDACTED]"}`},
		{"authorization without scheme", "Authorization: Zm9vYmFyMTIz", "Authorization: [REDACTED]"},
		{"bearer in prose", "curl with Bearer 4f9a8b7c6d5e4f3a2b1c now", "curl with Bearer [REDACTED] now"},
		{"x-api-key header", "x-api-key: k3y-0123456789", "x-api-key: [REDACTED]"},
		{"x-api-key go header dump", "map[X-Api-Key:[abc123xyz789]]", "map[X-Api-Key:[[REDACTED]]]"},
		{"x-goog-api-key", "X-Goog-Api-Key: Q1w2E3r4T5y6", "X-Goog-Api-Key: [REDACTED]"},
		{"pem private key", "before\n" + pem + "\nafter", "before\n[REDACTED]\nafter"},
		{"pem ec private key", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE" + fake(40) + "\n-----END EC PRIVATE KEY-----", "[REDACTED]"},
		{"pem unterminated", "key:\n-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg" + fake(50) + "\n", "key:\n[REDACTED]"},
		{"pem json escaped", `{"private_key": "-----BEGIN PRIVATE KEY-----\nMIIE` + fake(40) + `\n-----END PRIVATE KEY-----\n"}`, `{"private_key": "[REDACTED]\n"}`},
		{"password assignment", "password=hunter2", "password=[REDACTED]"},
		{"env password", "export DB_PASSWORD=correcthorse", "export DB_PASSWORD=[REDACTED]"},
		{"query token", "GET /cb?code=1&token=abc123&page=2", "GET /cb?code=1&token=[REDACTED]&page=2"},
		{"secret assignment", "client.secret=xyz", "client.secret=[REDACTED]"},
		{"api_key assignment", "API_KEY=plain", "API_KEY=[REDACTED]"},
		{"quoted value with spaces", `client_secret = "my secret value"`, `client_secret = "[REDACTED]"`},
		{"go short assignment", `apiKey := "abc"`, `apiKey := "[REDACTED]"`},
		{"json api_key", `{"api_key": "abc", "n": 1}`, `{"api_key": "[REDACTED]", "n": 1}`},
		{"json escaped quote", `{"password": "a\"b"}`, `{"password": "[REDACTED]"}`},
		{"python dict", `{'GITHUB_TOKEN': 'xyz'}`, `{'GITHUB_TOKEN': '[REDACTED]'}`},
		{"url userinfo", "git clone https://bot:pa55word@git.example.com/r.git", "git clone https://bot:[REDACTED]@git.example.com/r.git"},
		{"several in one text", "a=1 password=x b=2 token=y", "a=1 password=[REDACTED] b=2 token=[REDACTED]"},
	}
	s := New(nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, n := s.scrub(tt.in)
			if got != tt.want {
				t.Fatalf("String(%q)\n got %q\nwant %q", tt.in, got, tt.want)
			}
			if want := strings.Count(tt.want, Redacted); n != want {
				t.Errorf("count = %d, want %d", n, want)
			}
			again, n := s.scrub(got)
			if again != got || n != 0 {
				t.Errorf("second pass changed %q to %q (%d replacements)", got, again, n)
			}
		})
	}
}

func TestPatternsLeaveOrdinaryText(t *testing.T) {
	tests := []struct{ name, in string }{
		{"git commit", "commit 3f786850e387550fdab836ed7e6dc881de23001b (HEAD -> main)"},
		{"short git sha", "fixed in a1b2c3d, see 3f78685"},
		{"sha256 digest", "image@sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"uuid", "dispatch 123e4567-e89b-12d3-a456-426614174000 done"},
		{"upper uuid", "ID 550E8400-E29B-41D4-A716-446655440000"},
		{"token in prose", "The model used 1500 tokens; the token limit is 4096 and each token costs."},
		{"token counts", "max_tokens=4096 tokens_in=120 cache_read_tokens=0 tokenizer=cl100k"},
		{"token count json", `{"input_tokens": 12, "token_count": "7", "tokens": 5}`},
		{"sk in task-list", "see task-list-for-the-quarterly-planning-meeting-2024 and risk-assessment-v2-final-draft-copy"},
		{"sk- short", "pip install sk-learn; sk-12"},
		{"bearer prose", "the bearer of bad news; Bearer authentication-is-required-for-this"},
		{"authorization prose", "authorization: we use OAuth for this"},
		{"api-key prose", "x-api-key: see below"},
		{"empty assignment", "a token= flag, token = 5, password reset link, secret sauce"},
		{"secret_santa", "secret_santa=bob"},
		{"urls", "http://localhost:8080/path and mail bob@example.com, https://example.com:443/@user"},
		{"public key", "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----"},
		{"certificate", "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBa\n-----END CERTIFICATE-----"},
		{"short prefixes", "AKIA123 AIzaShort ghp_short xoxo hugs gh_pages github_pat_x sk_live_x"},
		{"jwt header alone", "eyJhbGciOiJIUzI1NiJ9 is just a header"},
		{"base64 image", "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="},
		{"go code", "tok := scanner.Token() // next token"},
		{"redacted marker", "password=[REDACTED] Bearer [REDACTED] " + Redacted},
	}
	s := New(nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, n := s.scrub(tt.in); got != tt.in || n != 0 {
				t.Errorf("String(%q) = %q (%d replacements), want it unchanged", tt.in, got, n)
			}
		})
	}
}

func TestExactVariants(t *testing.T) {
	const secret = "s3cr3t+V@lue/with&chars?=ü"
	b := []byte(secret)
	tests := []struct{ name, form string }{
		{"raw", secret},
		{"base64 std", base64.StdEncoding.EncodeToString(b)},
		{"base64 std raw", base64.RawStdEncoding.EncodeToString(b)},
		{"base64 url", base64.URLEncoding.EncodeToString(b)},
		{"base64 url raw", base64.RawURLEncoding.EncodeToString(b)},
		{"hex lower", hex.EncodeToString(b)},
		{"hex upper", strings.ToUpper(hex.EncodeToString(b))},
		{"query escape", url.QueryEscape(secret)},
		{"path escape", url.PathEscape(secret)},
		{"json html escape", `s3cr3t+V@lue/with\u0026chars?=ü`},
	}
	s := New([]string{secret}, WithoutPatterns())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := "pre " + tt.form + " post"
			got, n := s.scrub(in)
			if got != "pre [REDACTED] post" || n != 1 {
				t.Errorf("String(%q) = %q (%d replacements)", in, got, n)
			}
		})
	}
}

func TestExactBase64InsideLongerText(t *testing.T) {
	const secret = "Zx9-credential-Value-0042"
	s := New([]string{secret}, WithoutPatterns())
	for _, plain := range []string{
		"user:" + secret,       // HTTP Basic auth
		secret + "\n",          // echo $KEY | base64
		"a" + secret + "bc",    // offset 1
		"ab" + secret + "\x00", // offset 2
		"{\"key\":\"" + secret + "\",\"n\":1}",
	} {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			in := enc.EncodeToString([]byte(plain))
			got := s.String(in)
			if !strings.Contains(got, Redacted) {
				t.Errorf("base64 of %q: %q not redacted", plain, in)
			}
			// What is left must not decode to any 8 bytes of the secret.
			for _, part := range strings.Split(got, Redacted) {
				dec, _ := enc.DecodeString(strings.TrimRight(part, "="))
				for i := 0; i+8 <= len(secret); i++ {
					if bytes.Contains(dec, []byte(secret[i:i+8])) {
						t.Errorf("base64 of %q: %q left %q", plain, got, secret[i:i+8])
					}
				}
			}
		}
	}
}

func TestShortAndEmptySecrets(t *testing.T) {
	s := New([]string{"", "abc", ""}, WithoutPatterns())
	tests := []struct{ in, want string }{
		{"xabcx", "x[REDACTED]x"},
		{"YWJj 616263", "YWJj 616263"}, // encodings of a short secret stay
		{"", ""},
		{"nothing", "nothing"},
	}
	for _, tt := range tests {
		if got := s.String(tt.in); got != tt.want {
			t.Errorf("String(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := New(nil, WithoutPatterns()).String("sk-ant-" + fake(40)); got != "sk-ant-"+fake(40) {
		t.Errorf("scrubber without secrets or patterns changed %q", got)
	}
}

func TestOverlappingSecrets(t *testing.T) {
	tests := []struct {
		name    string
		secrets []string
		in      string
		want    string
		n       int
	}{
		{"prefix", []string{"abcdefgh", "abcdefghijkl"}, "xx abcdefghijkl yy", "xx [REDACTED] yy", 1},
		{"prefix listed last", []string{"abcdefghijkl", "abcdefgh"}, "abcdefghijkl", "[REDACTED]", 1},
		{"suffix", []string{"efghijkl", "abcdefghijkl"}, "-abcdefghijkl-", "-[REDACTED]-", 1},
		{"inside", []string{"defghijk", "abcdefghijklmn"}, "abcdefghijklmn", "[REDACTED]", 1},
		{"overlap", []string{"abcdefgh", "efghijkl"}, "abcdefghijkl", "[REDACTED]", 1},
		{"adjacent", []string{"abcdefgh"}, "abcdefghabcdefgh", "[REDACTED][REDACTED]", 2},
		{"shorter alone", []string{"abcdefgh", "abcdefghijkl"}, "abcdefghXijkl", "[REDACTED]Xijkl", 1},
		// A separator between its characters does not hide the longer one.
		{"longer with a separator", []string{"abcdefgh", "abcdefghijkl"}, "abcdefgh-ijkl", "[REDACTED]", 1},
		{"repeated", []string{"aaaaaaaa"}, "aaaaaaaaaaaa", "[REDACTED]", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, n := New(tt.secrets, WithoutPatterns()).scrub(tt.in)
			if got != tt.want || n != tt.n {
				t.Errorf("got %q (%d), want %q (%d)", got, n, tt.want, tt.n)
			}
		})
	}
}

// TestMatcherAgainstNaive compares the automaton, run by the scanner,
// with a brute-force search on random inputs over a small alphabet,
// where overlaps abound.
func TestMatcherAgainstNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "abc"[r.IntN(3)]
		}
		return string(b)
	}
	for iter := range 2000 {
		pats := make([]string, 1+r.IntN(5))
		for i := range pats {
			pats[i] = word(1 + r.IntN(5))
		}
		text := word(r.IntN(40))
		sc := newScanner(newMatcher(pats), nil)
		feed(sc, text, 0, true)
		got := sc.spans
		want := naiveFind(pats, text)
		if !slices.Equal(got, want) {
			t.Fatalf("iteration %d: patterns %q text %q: got %v, want %v", iter, pats, text, got, want)
		}
	}
}

func naiveFind(pats []string, text string) []span {
	covered := make([]bool, len(text))
	starts := map[int]bool{}
	for i := range text {
		for _, p := range pats {
			if strings.HasPrefix(text[i:], p) {
				starts[i] = true
				for j := i; j < i+len(p); j++ {
					covered[j] = true
				}
			}
		}
	}
	// Merge runs of covered bytes; a match starting right where the
	// previous run ended begins a new span (adjacent matches stay
	// separate) unless a match overlapping that boundary joins them.
	var out []span
	for i := 0; i < len(text); {
		if !covered[i] {
			i++
			continue
		}
		j := i
		for j < len(text) && covered[j] {
			j++
		}
		out = append(out, splitAdjacent(pats, text, i, j)...)
		i = j
	}
	return out
}

// splitAdjacent splits the covered run [i, j) where no match crosses a
// boundary.
func splitAdjacent(pats []string, text string, i, j int) []span {
	crossed := make([]bool, j-i+1)
	for k := i; k < j; k++ {
		for _, p := range pats {
			if strings.HasPrefix(text[k:], p) {
				for c := k + 1; c < k+len(p); c++ {
					crossed[c-i] = true
				}
			}
		}
	}
	var out []span
	start := i
	for c := i + 1; c < j; c++ {
		if !crossed[c-i] {
			out = append(out, span{start, c})
			start = c
		}
	}
	return append(out, span{start, j})
}

func TestBytes(t *testing.T) {
	s := New([]string{"Zx9-credential-Value-0042"})
	if got := s.Bytes(nil); got != nil {
		t.Errorf("Bytes(nil) = %q", got)
	}
	if got := s.Bytes([]byte{}); len(got) != 0 {
		t.Errorf("Bytes(empty) = %q", got)
	}
	in := []byte("k=Zx9-credential-Value-0042 and password=pw")
	if got := string(s.Bytes(in)); got != "k=[REDACTED] and password=[REDACTED]" {
		t.Errorf("Bytes = %q", got)
	}
	clean := []byte("nothing to see")
	if got := s.Bytes(clean); &got[0] != &clean[0] {
		t.Error("Bytes copied a slice without matches")
	}
}

func TestOptions(t *testing.T) {
	custom := regexp.MustCompile(`internal-id=(?P<secret>\w+)`)
	whole := regexp.MustCompile(`CORP-[0-9]{6}`)
	anthropic := "sk-ant-" + fake(40)
	in := "internal-id=abc CORP-123456 " + anthropic
	tests := []struct {
		name string
		opts []Option
		want string
	}{
		{"defaults", nil, "internal-id=abc CORP-123456 [REDACTED]"},
		{"extra patterns", []Option{WithPatterns(custom, nil, whole)}, "internal-id=[REDACTED] [REDACTED] [REDACTED]"},
		{"without defaults", []Option{WithoutPatterns()}, in},
		{"only extras", []Option{WithoutPatterns(), WithPatterns(custom)}, "internal-id=[REDACTED] CORP-123456 " + anthropic},
		{"order does not matter", []Option{WithPatterns(custom), WithoutPatterns()}, "internal-id=[REDACTED] CORP-123456 " + anthropic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := New(nil, tt.opts...).String(in); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestConcurrentUse(t *testing.T) {
	s := New([]string{"Zx9-credential-Value-0042"})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if got := s.String("a Zx9-credential-Value-0042 b"); got != "a [REDACTED] b" {
					t.Errorf("got %q", got)
					return
				}
			}
		})
	}
	wg.Wait()
}

// testSecret is the injected credential of the Message tests. It matches
// no default pattern, so only the exact match can catch it.
const testSecret = "Zx9-credential-Value-0042"

func strValue(v string) *structpb.Value { return structpb.NewStringValue(v) }

func structOf(fields map[string]*structpb.Value) *structpb.Struct {
	return &structpb.Struct{Fields: fields}
}

func listOf(vs ...*structpb.Value) *structpb.Value {
	return structpb.NewListValue(&structpb.ListValue{Values: vs})
}

// leakyOutput is an OperatorOutput with testSecret in 22 places: content
// text, tool input and results, effect payloads, metadata and
// annotations, nested lists and structs, a map key and bytes.
func leakyOutput() *operatorv1.OperatorOutput {
	b64 := base64.StdEncoding.EncodeToString([]byte(testSecret))
	return &operatorv1.OperatorOutput{
		Message: &typesv1.Content{Blocks: []*typesv1.ContentBlock{
			{Block: &typesv1.ContentBlock_Text{Text: &typesv1.TextBlock{Text: "here is the key: " + testSecret + " and again " + testSecret}}}, // 2
			{Block: &typesv1.ContentBlock_ToolUse{ToolUse: &typesv1.ToolUseBlock{
				Id: "call_1", Name: "http_get",
				Input: structpb.NewStructValue(structOf(map[string]*structpb.Value{
					"url":     strValue("https://api.example.com/?k=" + testSecret),     // 3
					"headers": listOf(strValue("X-Key: "+b64), strValue("Accept: */*")), // 4
				})),
			}}},
			{Block: &typesv1.ContentBlock_ToolResult{ToolResult: &typesv1.ToolResultBlock{ToolUseId: "call_1", Content: "echo " + testSecret}}}, // 5
			{Block: &typesv1.ContentBlock_Image{Image: &typesv1.ImageBlock{
				Source:    &typesv1.ImageBlock_Data{Data: []byte("text as bytes " + testSecret)}, // 6
				MediaType: "text/plain",
			}}},
			{Block: &typesv1.ContentBlock_Custom{Custom: &typesv1.CustomBlock{ContentType: "acme.note/v1", Data: strValue(testSecret)}}}, // 7
		}},
		ExitReason: &operatorv1.ExitReason{
			Kind:    operatorv1.ExitKind_EXIT_KIND_SUSPENDED,
			Message: "failed with key " + testSecret, // 8
			Suspension: &operatorv1.Suspension{
				ResumeToken: "r1",
				Prompt:      "approve " + testSecret + "?",                                                              // 9
				Pending:     structpb.NewStructValue(structOf(map[string]*structpb.Value{"arg": strValue(testSecret)})), // 10
			},
		},
		Metadata: &operatorv1.OperatorMetadata{
			TokensIn: 10, Model: "claude-sonnet-4-5", Provider: "anthropic",
			Cost:     &typesv1.Money{Amount: "0.01"},
			Duration: durationpb.New(3),
			SubDispatches: []*operatorv1.SubDispatchRecord{
				{Name: "http_get", Success: true},
				{Name: "shell", Error: "exit 1: " + testSecret}, // 11
			},
		},
		Effects: []*typesv1.Effect{
			{IdempotencyKey: "d/0", Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{
				Scope: &typesv1.Scope{Kind: &typesv1.Scope_Session{Session: &typesv1.SessionScope{SessionId: "s1"}}},
				Key:   "creds",
				Value: listOf(strValue("a"), listOf(strValue(testSecret)), structpb.NewStructValue(structOf(map[string]*structpb.Value{"k": strValue(testSecret)}))), // 12, 13
			}}},
			{IdempotencyKey: "d/1", Kind: &typesv1.Effect_Signal{Signal: &typesv1.SignalEffect{
				WorkflowId: "wf", Payload: &typesv1.SignalPayload{SignalType: "note", Data: strValue(testSecret)}, // 14
			}}},
			{IdempotencyKey: "d/2", Kind: &typesv1.Effect_Delegate{Delegate: &typesv1.Delegate{
				AgentId: "child",
				Message: &typesv1.Content{Blocks: []*typesv1.ContentBlock{{Block: &typesv1.ContentBlock_Text{Text: &typesv1.TextBlock{Text: "use " + testSecret}}}}}, // 15
				Metadata: structOf(map[string]*structpb.Value{
					"nested": structpb.NewStructValue(structOf(map[string]*structpb.Value{
						"deep": listOf(structpb.NewNumberValue(1), strValue("x "+testSecret)), // 16
					})),
				}),
			}}},
			{IdempotencyKey: "d/3", Kind: &typesv1.Effect_Handoff{Handoff: &typesv1.Handoff{AgentId: "next", State: strValue(testSecret)}}}, // 17
			{IdempotencyKey: "d/4", Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{
				Level: typesv1.LogLevel_LOG_LEVEL_INFO, Message: "log " + testSecret, // 18
				Data: structpb.NewBoolValue(true),
			}}},
			{IdempotencyKey: "d/5", Kind: &typesv1.Effect_Custom{Custom: &typesv1.CustomEffect{EffectType: "acme.email/v1", Data: strValue(testSecret)}}}, // 19
		},
		Annotations: structOf(map[string]*structpb.Value{
			testSecret: strValue("a secret as a key"),                                                                // 20
			"list":     listOf(strValue(testSecret), structpb.NewNullValue()),                                        // 21
			"struct":   structpb.NewStructValue(structOf(map[string]*structpb.Value{"inner": strValue(testSecret)})), // 22
		}),
	}
}

// assertNoSecret fails if m, as protojson, still holds testSecret in
// plain, base64 (how protojson writes bytes fields) or as a fragment.
func assertNoSecret(t *testing.T, m proto.Message) {
	t.Helper()
	js, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, form := range []string{
		testSecret,
		base64.StdEncoding.EncodeToString([]byte(testSecret)),
		testSecret[:12], testSecret[12:],
	} {
		if bytes.Contains(js, []byte(form)) {
			t.Errorf("%q still in %s", form, js)
		}
	}
}

func TestMessage(t *testing.T) {
	s := New([]string{testSecret})
	out := leakyOutput()
	if n := s.Message(out); n != 22 {
		t.Errorf("Message = %d replacements, want 22", n)
	}
	assertNoSecret(t, out)

	// Spot checks: values replaced in place, everything else intact.
	if got := out.GetMessage().GetBlocks()[0].GetText().GetText(); got != "here is the key: [REDACTED] and again [REDACTED]" {
		t.Errorf("text = %q", got)
	}
	if got := string(out.GetMessage().GetBlocks()[3].GetImage().GetData()); got != "text as bytes [REDACTED]" {
		t.Errorf("bytes = %q", got)
	}
	ann := out.GetAnnotations().GetFields()
	if got := ann[Redacted].GetStringValue(); got != "a secret as a key" {
		t.Errorf("annotations[%q] = %q; annotations = %v", Redacted, got, ann)
	}
	if got := out.GetMetadata().GetModel(); got != "claude-sonnet-4-5" {
		t.Errorf("model = %q", got)
	}
	if got := out.GetEffects()[0].GetWriteMemory().GetKey(); got != "creds" {
		t.Errorf("key = %q", got)
	}
	if n := s.Message(out); n != 0 {
		t.Errorf("second Message = %d replacements, want 0", n)
	}
}

func TestMessagePatterns(t *testing.T) {
	key := "sk-ant-" + fake(50)
	out := &operatorv1.OperatorOutput{
		ExitReason: &operatorv1.ExitReason{Message: "401 for key " + key},
		Annotations: structOf(map[string]*structpb.Value{
			"env": strValue("GITHUB_TOKEN=ghp_" + fake(36)),
		}),
	}
	if n := New(nil).Message(out); n != 2 {
		t.Errorf("Message = %d, want 2", n)
	}
	if got := out.GetExitReason().GetMessage(); got != "401 for key [REDACTED]" {
		t.Errorf("message = %q", got)
	}
	if got := out.GetAnnotations().GetFields()["env"].GetStringValue(); got != "GITHUB_TOKEN=[REDACTED]" {
		t.Errorf("env = %q", got)
	}
}

func TestMessageMaps(t *testing.T) {
	s := New([]string{testSecret, "Other-secret-value-77"}, WithoutPatterns())
	st := &typesv1.Status{
		Code:    16,
		Message: "bad key " + testSecret,
		Metadata: map[string]string{
			"key":                   testSecret,
			testSecret:              "by key",
			"Other-secret-value-77": "collides",
			"plain":                 "value",
		},
	}
	if n := s.Message(st); n != 4 {
		t.Errorf("Message = %d, want 4", n)
	}
	want := map[string]string{
		"key":           Redacted,
		Redacted:        "collides", // "Other-..." sorts before "Zx9-..."
		Redacted + "#2": "by key",
		"plain":         "value",
	}
	if !mapsEqual(st.GetMetadata(), want) {
		t.Errorf("metadata = %v, want %v", st.GetMetadata(), want)
	}
	assertNoSecret(t, st)

	in := &operatorv1.OperatorInput{
		Dispatch: &operatorv1.DispatchContext{TraceContext: map[string]string{"traceparent": "00-" + testSecret}},
		Metadata: structOf(map[string]*structpb.Value{Redacted: strValue("existing"), testSecret: strValue("moved")}),
	}
	if n := s.Message(in); n != 2 {
		t.Errorf("Message = %d, want 2", n)
	}
	if got := in.GetDispatch().GetTraceContext()["traceparent"]; got != "00-"+Redacted {
		t.Errorf("traceparent = %q", got)
	}
	md := in.GetMetadata().GetFields()
	if md[Redacted].GetStringValue() != "existing" || md[Redacted+"#2"].GetStringValue() != "moved" || len(md) != 2 {
		t.Errorf("metadata = %v", md)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestMessageEdgeCases(t *testing.T) {
	s := New([]string{testSecret})

	t.Run("nil", func(t *testing.T) {
		if n := s.Message(nil); n != 0 {
			t.Errorf("Message(nil) = %d", n)
		}
		if n := s.Message((*operatorv1.OperatorOutput)(nil)); n != 0 {
			t.Errorf("Message(typed nil) = %d", n)
		}
		if n := s.Message(&operatorv1.OperatorOutput{}); n != 0 {
			t.Errorf("Message(empty) = %d", n)
		}
	})

	t.Run("binary bytes kept", func(t *testing.T) {
		data := append([]byte{0xff, 0xfe}, testSecret...)
		img := &typesv1.ImageBlock{Source: &typesv1.ImageBlock_Data{Data: data}, MediaType: "image/png"}
		if n := s.Message(img); n != 0 || !bytes.Equal(img.GetData(), data) {
			t.Errorf("Message changed invalid UTF-8 bytes: %d, %q", n, img.GetData())
		}
	})

	t.Run("any not decoded", func(t *testing.T) {
		a, err := anypb.New(strValue(testSecret))
		if err != nil {
			t.Fatal(err)
		}
		before := proto.Clone(a)
		if n := s.Message(a); n != 0 || !proto.Equal(a, before) {
			t.Errorf("Message changed an Any: %d", n)
		}
	})

	t.Run("unknown fields", func(t *testing.T) {
		leaky := &typesv1.TextBlock{Text: "ok"}
		leaky.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "x "+testSecret))
		if n := s.Message(leaky); n != 1 || len(leaky.ProtoReflect().GetUnknown()) != 0 {
			t.Errorf("leaky unknown fields: %d replacements, %d bytes left", n, len(leaky.ProtoReflect().GetUnknown()))
		}
		benign := &typesv1.TextBlock{Text: "ok"}
		raw := protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "harmless")
		benign.ProtoReflect().SetUnknown(raw)
		if n := s.Message(benign); n != 0 || !bytes.Equal(benign.ProtoReflect().GetUnknown(), raw) {
			t.Errorf("benign unknown fields changed: %d", n)
		}
	})
}

func TestWriter(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"split within a line", []string{"abc Zx9-cred", "ential-Val", "ue-0042 def\n"}, "abc [REDACTED] def\n"},
		{"split across lines", []string{"one " + testSecret + "\ntwo Zx9-", "credential-Value-0042\nthree\n"}, "one [REDACTED]\ntwo [REDACTED]\nthree\n"},
		{"byte at a time", strings.Split("k="+testSecret+"\n", ""), "k=[REDACTED]\n"},
		{"last line without newline", []string{"tail " + testSecret}, "tail [REDACTED]"},
		{"pattern split", []string{"Authorization: Bea", "rer abc123\n"}, "Authorization: Bearer [REDACTED]\n"},
		{"crlf", []string{"x " + testSecret + "\r\n"}, "x [REDACTED]\r\n"},
		{"empty writes", []string{"", "a\n", ""}, "a\n"},
		{"nothing", nil, ""},
		{"pem across writes", []string{
			"start\nkey: -----BEGIN OPENSSH PRIVATE KEY-----\n",
			"b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ" + "\n",
			fake(64) + "\n-----END OPENSSH ",
			"PRIVATE KEY----- trailing\nend\n",
		}, "start\nkey: [REDACTED] trailing\nend\n"},
		{"pem never ends", []string{"-----BEGIN PRIVATE KEY-----\n", fake(64) + "\n", fake(10)}, "[REDACTED]"},
	}
	s := New([]string{testSecret})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := s.Writer(&buf)
			for _, p := range tt.writes {
				n, err := w.Write([]byte(p))
				if err != nil || n != len(p) {
					t.Fatalf("Write(%q) = %d, %v", p, n, err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if got := buf.String(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestWriterHoldsPartialLines(t *testing.T) {
	var buf bytes.Buffer
	w := New([]string{testSecret}).Writer(&buf)
	if _, err := w.Write([]byte("done\npartial Zx9-cred")); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); got != "done\n" {
		t.Errorf("before the newline: %q", got)
	}
	if _, err := w.Write([]byte("ential-Value-0042\n")); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); got != "done\npartial [REDACTED]\n" {
		t.Errorf("after the newline: %q", got)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := w.Write([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
}

func TestWriterMultiLineSecret(t *testing.T) {
	secret := "-----BEGIN TEST KEY-----\n" + fake(40) + "\n" + fake(33) + "\n-----END TEST KEY-----"
	var buf bytes.Buffer
	w := New([]string{secret}, WithoutPatterns()).Writer(&buf)
	io.WriteString(w, "cat key\n"+secret+"\ndone\n")
	w.Close()
	if strings.Contains(buf.String(), fake(33)) {
		t.Errorf("a line of the secret leaked: %q", buf.String())
	}
	if !strings.HasPrefix(buf.String(), "cat key\n") || !strings.HasSuffix(buf.String(), "\ndone\n") {
		t.Errorf("surrounding lines changed: %q", buf.String())
	}
}

func TestWriterLongLine(t *testing.T) {
	var buf bytes.Buffer
	w := New([]string{testSecret}).Writer(&buf).(*lineWriter)
	w.max = 64
	var in strings.Builder
	for i := range 20 {
		fmt.Fprintf(&in, "word%d %s ", i, testSecret)
	}
	line := in.String()
	for i := 0; i < len(line); i += 7 {
		w.Write([]byte(line[i:min(i+7, len(line))]))
	}
	if buf.Len() == 0 {
		t.Error("nothing written before the newline of a long line")
	}
	w.Write([]byte("\n"))
	w.Close()
	want := strings.ReplaceAll(line, testSecret, Redacted) + "\n"
	if got := buf.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestWriterOversizedPEM(t *testing.T) {
	var buf bytes.Buffer
	w := New(nil).Writer(&buf).(*lineWriter)
	w.max = 100
	io.WriteString(w, "a\n-----BEGIN PRIVATE KEY-----\n")
	for range 5 {
		io.WriteString(w, fake(64)+"\n")
	}
	io.WriteString(w, "-----END PRIVATE KEY----- b\nc\n")
	w.Close()
	if got := buf.String(); got != "a\n[REDACTED]\n b\nc\n" {
		t.Errorf("got %q", got)
	}
}

type failWriter struct{ calls int }

func (f *failWriter) Write(p []byte) (int, error) {
	f.calls++
	return 0, errors.New("disk full")
}

func TestWriterError(t *testing.T) {
	f := &failWriter{}
	w := New(nil).Writer(f)
	if n, err := w.Write([]byte("a\n")); err == nil || n != 0 {
		t.Fatalf("Write = %d, %v; want the underlying error", n, err)
	}
	if _, err := w.Write([]byte("b\n")); err == nil || err.Error() != "disk full" {
		t.Errorf("second Write = %v", err)
	}
	if err := w.Close(); err == nil || err.Error() != "disk full" {
		t.Errorf("Close = %v", err)
	}
	if f.calls != 1 {
		t.Errorf("underlying Write called %d times after failing", f.calls)
	}
}

func TestWriterConcurrent(t *testing.T) {
	var buf bytes.Buffer
	w := New([]string{testSecret}).Writer(&buf)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				fmt.Fprintf(w, "g%d line %d %s\n", g, i, testSecret)
			}
		})
	}
	wg.Wait()
	w.Close()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 200 {
		t.Fatalf("%d lines, want 200", len(lines))
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, " "+Redacted) {
			t.Errorf("line %q", l)
		}
	}
}

func BenchmarkMessage(b *testing.B) {
	s := New([]string{testSecret, "another-injected-key-123456"})
	out := &operatorv1.OperatorOutput{Message: &typesv1.Content{}, Annotations: structOf(map[string]*structpb.Value{})}
	para := "The deployment finished; 3 services restarted, the cache was warmed and the logs show no errors at all. "
	for i := 0; proto.Size(out) < 64<<10; i++ {
		text := para + para + para
		if i%50 == 0 {
			text += testSecret
		}
		out.Message.Blocks = append(out.Message.Blocks, &typesv1.ContentBlock{Block: &typesv1.ContentBlock_Text{Text: &typesv1.TextBlock{Text: text}}})
		out.Annotations.Fields[fmt.Sprintf("k%d", i)] = listOf(strValue(para), structpb.NewNumberValue(float64(i)))
	}
	b.SetBytes(int64(proto.Size(out)))
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		m := proto.Clone(out)
		b.StartTimer()
		if s.Message(m) == 0 {
			b.Fatal("no replacements")
		}
	}
}

func TestKeywordMatcherAgainstNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	word := func(n int, alphabet string) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	for iter := range 2000 {
		kws := make([]string, 1+r.IntN(6))
		masks := make([]uint64, len(kws))
		for i := range kws {
			kws[i] = word(1+r.IntN(4), "ab-")
			masks[i] = 1 << r.IntN(8)
		}
		text := word(r.IntN(30), "abAB-_")
		var want uint64
		for i, k := range kws {
			if strings.Contains(strings.ToLower(text), k) {
				want |= masks[i]
			}
		}
		if got := newKeywordMatcher(kws, masks).any(text); got != want {
			t.Fatalf("iteration %d: keywords %q text %q: got %b, want %b", iter, kws, text, got, want)
		}
	}
}

func TestDefaultPatternKeywords(t *testing.T) {
	for _, p := range defaultPatterns() {
		if len(p.keywords) == 0 {
			t.Errorf("pattern %q has no keywords", p.name)
		}
		for _, k := range p.keywords {
			if k == "" || k != strings.ToLower(k) {
				t.Errorf("pattern %q: keyword %q must be non-empty lower case", p.name, k)
			}
		}
	}
	if n := len(defaultPatterns()); n > 64 {
		t.Errorf("%d default patterns; the keyword prefilter covers 64", n)
	}
}

func TestSecretWithWhitespace(t *testing.T) {
	s := New([]string{"Zx9-credential-Value-0042\n"}, WithoutPatterns())
	if got := s.String("key Zx9-credential-Value-0042 end"); got != "key [REDACTED] end" {
		t.Errorf("got %q", got)
	}
	b64 := base64.StdEncoding.EncodeToString([]byte("Zx9-credential-Value-0042"))
	if got := s.String(b64); got != Redacted {
		t.Errorf("base64 of the trimmed secret: got %q", got)
	}
}
