package gateway

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Secrets come from their flag, their env variable or their file, never
// from two at once.
func TestChannelSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("xoxb-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) (ChannelsConfig, error) {
		var c ChannelsConfig
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.BindFlags(fs)
		if err := fs.Parse(args); err != nil {
			return c, err
		}
		return c, c.resolve()
	}
	c, err := parse("--slack-token-file", file, "--telegram-secret", "s3")
	if err != nil || c.Slack.Token != "xoxb-from-file" || c.Telegram.Secret != "s3" {
		t.Fatalf("%+v %v", c, err)
	}
	if _, err := parse("--slack-token-file", file, "--slack-token", "x"); err == nil || !strings.Contains(err.Error(), "both set") {
		t.Fatalf("both: %v", err)
	}
	if _, err := parse("--telegram-token-file", filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "--telegram-token-file") {
		t.Fatalf("missing: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	if _, err := parse("--slack-signing-secret-file", empty); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty: %v", err)
	}
	// A channel half configured says what is missing.
	if _, err := NewSlack(SlackConfig{Token: "x"}); err == nil || !strings.Contains(err.Error(), "--slack-signing-secret") {
		t.Fatalf("slack: %v", err)
	}
	if _, err := NewTelegram(TelegramConfig{Token: "x"}); err == nil || !strings.Contains(err.Error(), "--telegram-secret") {
		t.Fatalf("telegram: %v", err)
	}
	if _, err := NewTelegram(TelegramConfig{Token: "x", Secret: "has space"}); err == nil {
		t.Fatal("a secret Telegram refuses was taken")
	}
}

// Delivery ids are remembered for the ttl, up to a bound.
func TestSeenSet(t *testing.T) {
	t.Parallel()
	s := newSeenSet(time.Hour, 3)
	if !s.claim("a") || s.claim("a") || !s.claim("b") {
		t.Fatal("a repeated id was taken again")
	}
	s.forget("a")
	if !s.claim("a") || s.claim("a") {
		t.Fatal("a forgotten id was not taken once")
	}
	for _, k := range []string{"c", "d", "e"} {
		s.claim(k)
	}
	if len(s.at) > 3 || len(s.order) > 3 {
		t.Fatalf("%d ids kept, bound 3", len(s.at))
	}
	short := newSeenSet(time.Nanosecond, 10)
	short.claim("x")
	time.Sleep(time.Millisecond)
	if !short.claim("x") {
		t.Fatal("an expired id was still refused")
	}
}

func TestSplitText(t *testing.T) {
	t.Parallel()
	text := strings.Repeat("héllo wörld ", 100)
	parts := splitText(text, 50)
	if strings.Join(parts, "") != text {
		t.Fatal("the parts do not add up to the text")
	}
	for _, p := range parts {
		if len(p) > 50 || !utf8.ValidString(p) {
			t.Fatalf("part %q", p)
		}
	}
	if p := splitText("short", 50); len(p) != 1 || p[0] != "short" {
		t.Fatalf("%q", p)
	}
}

func TestChatEventSession(t *testing.T) {
	t.Parallel()
	for ev, want := range map[ChatEvent]string{
		{Channel: "slack", Workspace: "T1", Conversation: "C1", User: "U1"}: "slack:T1:C1:U1",
		{Channel: "telegram", Conversation: "-1001", User: "42"}:            "telegram:-1001:42",
		{Channel: "x", Conversation: "a b/c", User: "ü"}:                    "x:a_b_c:_",
	} {
		got := ev.Session()
		if got != want || !sessionPattern.MatchString(got) {
			t.Errorf("%+v: %q, want %q", ev, got, want)
		}
	}
}
