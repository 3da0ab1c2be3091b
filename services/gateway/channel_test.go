package gateway_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/services/gateway"
)

// chatPost is an answer a fake platform received.
type chatPost struct {
	Conversation, Text, Thread string
}

// fakePlatform collects the answers posted to a fake chat API.
type fakePlatform struct {
	*httptest.Server
	posts chan chatPost
	mu    sync.Mutex
	all   []chatPost
}

func (f *fakePlatform) record(p chatPost) {
	f.mu.Lock()
	f.all = append(f.all, p)
	f.mu.Unlock()
	f.posts <- p
}

// next waits for the next answer posted.
func (f *fakePlatform) next(t *testing.T) chatPost {
	t.Helper()
	select {
	case p := <-f.posts:
		return p
	case <-time.After(60 * time.Second):
		t.Fatal("no answer was posted")
		return chatPost{}
	}
}

func (f *fakePlatform) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.all)
}

// newFakeSlack serves the two Web API methods the gateway calls, as
// slack.com/api does: form-encoded requests with the bot token as a
// bearer token, JSON answers with "ok".
func newFakeSlack(t *testing.T, token string) *fakePlatform {
	return newFakePlatform(t, func(f *fakePlatform, mux *http.ServeMux) {
		slackAPI(f, mux, token)
	})
}

// newFakePlatform serves the API that routes sets up on mux, until the
// test ends.
func newFakePlatform(t *testing.T, routes func(f *fakePlatform, mux *http.ServeMux)) *fakePlatform {
	f := &fakePlatform{posts: make(chan chatPost, 100)}
	mux := http.NewServeMux()
	routes(f, mux)
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

// slackAPI is slack.com/api's chat.postMessage and auth.test.
func slackAPI(f *fakePlatform, mux *http.ServeMux, token string) {
	authed := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer "+token && r.FormValue("token") != token {
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error": "invalid_auth"})
			return false
		}
		return true
	}
	mux.HandleFunc("POST /api/chat.postMessage", func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || !authed(w, r) {
			return
		}
		if r.PostForm.Get("channel") == "" || r.PostForm.Get("text") == "" {
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error": "no_text"})
			return
		}
		f.record(chatPost{Conversation: r.PostForm.Get("channel"), Text: r.PostForm.Get("text"), Thread: r.PostForm.Get("thread_ts")})
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "channel": r.PostForm.Get("channel"), "ts": fmt.Sprint(time.Now().UnixNano())})
	})
	mux.HandleFunc("POST /api/auth.test", func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || !authed(w, r) {
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "user": "neuron", "user_id": "UBOT", "team": "Test", "team_id": "T1"})
	})
}

// newFakeTelegram serves the Bot API methods the gateway calls, as
// api.telegram.org does: /bot<token>/<method>, JSON in and out.
func newFakeTelegram(t *testing.T, token string) *fakePlatform {
	return newFakePlatform(t, func(f *fakePlatform, mux *http.ServeMux) { telegramAPI(f, mux, token) })
}

// telegramAPI is api.telegram.org's getMe and sendMessage.
func telegramAPI(f *fakePlatform, mux *http.ServeMux, token string) {
	mux.HandleFunc("POST /{bot}/{method}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("bot") != "bot"+token {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error_code": 401, "description": "Unauthorized"})
			return
		}
		var req struct {
			ChatID          json.RawMessage `json:"chat_id"`
			Text            string          `json:"text"`
			ReplyParameters *struct {
				MessageID int64 `json:"message_id"`
			} `json:"reply_parameters"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: " + err.Error()})
			return
		}
		switch r.PathValue("method") {
		case "getMe":
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "result": map[string]any{"id": 7, "is_bot": true, "username": "neuron_bot"}})
		case "sendMessage":
			if len(req.ChatID) == 0 || req.Text == "" {
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: message text is empty"})
				return
			}
			var chat string
			if err := json.Unmarshal(req.ChatID, &chat); err != nil {
				chat = string(req.ChatID)
			}
			p := chatPost{Conversation: chat, Text: req.Text}
			if req.ReplyParameters != nil {
				p.Thread = fmt.Sprint(req.ReplyParameters.MessageID)
			}
			f.record(p)
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "result": map[string]any{"message_id": 1000}})
		default:
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error_code": 404, "description": "Not Found"})
		}
	})
}

// Secrets of the tests' chat channels.
const (
	slackSecret    = "8f742231b10e8888abcd99yyyzzz85a5"
	slackToken     = "xoxb-test-token-123"
	telegramToken  = "123456:ABC-test-token"
	telegramSecret = "hook-secret_42"
)

// syncBuffer is a log sink tests read after the fact.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// chatStack is a stack whose gateway has both chat channels on, each
// talking to its fake platform, and logs at debug level into log.
type chatStack struct {
	*stack
	slack, telegram *fakePlatform
	log             *syncBuffer
	// opts starts the gateway: another one (replica) is started with it.
	opts stackOptions
	// stop stops the gateway.
	stop func()
}

// replica starts another gateway in front of c's services, with the same
// channels and platforms; it answers on its own addresses.
func (c *chatStack) replica(t *testing.T) *chatStack {
	t.Helper()
	s := *c.stack
	r := *c
	r.stack = &s
	r.stop = s.startGateway(t, c.opts)
	return &r
}

func startChatStack(t *testing.T, o stackOptions, routes string, agents ...agent) *chatStack {
	t.Helper()
	c := &chatStack{slack: newFakeSlack(t, slackToken), telegram: newFakeTelegram(t, telegramToken), log: &syncBuffer{}}
	adjust := o.gateway
	o.gateway = func(cfg *gateway.Config) {
		cfg.DefaultAgent = "echo"
		cfg.Channels = gateway.ChannelsConfig{
			Routes:   routes,
			Slack:    gateway.SlackConfig{SigningSecret: slackSecret, Token: slackToken, APIURL: c.slack.URL + "/api/"},
			Telegram: gateway.TelegramConfig{Token: telegramToken, Secret: telegramSecret, APIURL: c.telegram.URL},
		}
		cfg.Log = slog.New(slog.NewJSONHandler(c.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		if adjust != nil {
			adjust(cfg)
		}
	}
	o.noGateway, c.opts = true, o
	c.stack = startStack(t, o, agents...)
	c.stop = c.startGateway(t, o)
	t.Cleanup(func() {
		for _, s := range []string{slackSecret, slackToken, telegramToken, telegramSecret} {
			if strings.Contains(c.log.String(), s) {
				t.Errorf("the gateway logged a secret (%s...)", s[:6])
			}
		}
	})
	return c
}

// slackSign returns the v0 signature of body at ts with secret, as Slack
// computes it.
func slackSign(secret, ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(m, "v0:%s:", ts)
	m.Write(body)
	return "v0=" + hex.EncodeToString(m.Sum(nil))
}

// postSlack posts body to the gateway's Events API URL, signed with
// secret at time at; header adds or overrides headers ("" deletes).
//
// Like Slack, it delivers again (X-Slack-Retry-Num) a request answered
// 503, which the gateway does when it could not queue the message in
// time (on a loaded machine, the State service's lane write).
func postSlack(t *testing.T, c *chatStack, secret string, at time.Time, body string, header map[string]string) (int, string) {
	t.Helper()
	return redeliver(func(retry int) (int, string) {
		h := map[string]string{}
		for k, v := range header {
			h[k] = v
		}
		if retry > 0 {
			h["X-Slack-Retry-Num"] = fmt.Sprint(retry)
			h["X-Slack-Retry-Reason"] = "http_error"
		}
		return postSlackOnce(t, c, secret, at, body, h)
	})
}

// redeliver calls post (with the retry's number) again, a second apart,
// while it is answered 503, as the platforms do, up to 5 retries.
func redeliver(post func(retry int) (int, string)) (int, string) {
	for retry := 0; ; retry++ {
		code, resp := post(retry)
		if code != http.StatusServiceUnavailable || retry == 5 {
			return code, resp
		}
		time.Sleep(time.Second)
	}
}

func postSlackOnce(t *testing.T, c *chatStack, secret string, at time.Time, body string, header map[string]string) (int, string) {
	t.Helper()
	ts := fmt.Sprint(at.Unix())
	req, err := http.NewRequestWithContext(ctxFor(t, 30*time.Second), http.MethodPost, c.httpURL+"/channels/slack/events", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Slack-Request-Timestamp", ts)
	req.Header.Set("X-Slack-Signature", slackSign(secret, ts, []byte(body)))
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// slackEvent is an event_callback for one inner event.
func slackEvent(id string, inner map[string]any) string {
	b, _ := json.Marshal(map[string]any{
		"token": "legacy-verification-token", "team_id": "T1", "api_app_id": "A1", "type": "event_callback",
		"event_id": id, "event_time": time.Now().Unix(), "event": inner,
	})
	return string(b)
}

// mention is an app_mention of the bot by user in channel.
func mention(user, channel, ts, text string) map[string]any {
	return map[string]any{"type": "app_mention", "user": user, "text": "<@UBOT> " + text, "ts": ts, "channel": channel, "event_ts": ts}
}

// directMessage is a message to the bot in a DM.
func directMessage(user, channel, ts, text string) map[string]any {
	return map[string]any{"type": "message", "channel_type": "im", "user": user, "text": text, "ts": ts, "channel": channel, "event_ts": ts}
}

// postTelegram posts an update to the gateway's webhook with secret
// ("" sends no secret header).
// Like Telegram, it delivers again an update answered 503.
func postTelegram(t *testing.T, c *chatStack, secret string, update map[string]any) (int, string) {
	t.Helper()
	return redeliver(func(int) (int, string) { return postTelegramOnce(t, c, secret, update) })
}

func postTelegramOnce(t *testing.T, c *chatStack, secret string, update map[string]any) (int, string) {
	t.Helper()
	b, _ := json.Marshal(update)
	req, err := http.NewRequestWithContext(ctxFor(t, 30*time.Second), http.MethodPost, c.httpURL+"/channels/telegram/webhook", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if secret != "" {
		req.Header.Set("X-Telegram-Bot-Api-Secret-Token", secret)
	}
	return do(t, req)
}

// telegramUpdate is an update with a text message from user in chat.
func telegramUpdate(id, msgID, user, chat int64, text string) map[string]any {
	return map[string]any{"update_id": id, "message": map[string]any{
		"message_id": msgID, "date": time.Now().Unix(), "text": text,
		"from": map[string]any{"id": user, "is_bot": false, "first_name": "Ada"},
		"chat": map[string]any{"id": chat, "type": "private"},
	}}
}

// workflowsOf counts the orchestrator's workflows of session.
func workflowsOf(t *testing.T, s *stack, session string) int {
	t.Helper()
	resp, err := s.orch.ListWorkflows(ctxFor(t, 10*time.Second), &orchestratorv1.ListWorkflowsRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, w := range resp.GetWorkflows() {
		if gateway.SessionOf(w.GetWorkflowId()) == session {
			n++
		}
	}
	return n
}

// A Slack mention and a direct message reach the agent through the
// orchestrator, and the answers are posted in their threads; the
// url_verification challenge is answered; bots' messages (the gateway's
// own answers among them) are not.
func TestSlackMessage(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{}, "", echoAgent("echo"))
	now := time.Now()

	code, body := postSlack(t, c, slackSecret, now, `{"token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}`, nil)
	if code != http.StatusOK || body != "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P" {
		t.Fatalf("url_verification: %d %q", code, body)
	}

	if code, body := postSlack(t, c, slackSecret, now, slackEvent("Ev1", mention("U1", "C1", "1700000000.000100", "hello there")), nil); code != http.StatusOK {
		t.Fatalf("app_mention: %d %s", code, body)
	}
	p := c.slack.next(t)
	if p != (chatPost{Conversation: "C1", Thread: "1700000000.000100", Text: "[scripted model] You said: hello there"}) {
		t.Fatalf("posted %+v", p)
	}

	// A bot's message in the same DM (the gateway's own answer looks like
	// this) is not taken: had it been, it would be answered before the
	// user's next message on the same lane.
	bot := directMessage("U2", "D2", "1700000001.000200", "I am a bot")
	bot["bot_id"] = "B1"
	if code, _ := postSlack(t, c, slackSecret, now, slackEvent("Ev2", bot), nil); code != http.StatusOK {
		t.Fatalf("bot message: %d", code)
	}
	// A message in a thread is answered in that thread.
	dm := directMessage("U2", "D2", "1700000002.000300", "in a thread")
	dm["thread_ts"] = "1700000000.999999"
	if code, _ := postSlack(t, c, slackSecret, now, slackEvent("Ev3", dm), nil); code != http.StatusOK {
		t.Fatalf("dm: %d", code)
	}
	p = c.slack.next(t)
	if p != (chatPost{Conversation: "D2", Thread: "1700000000.999999", Text: "[scripted model] You said: in a thread"}) {
		t.Fatalf("posted %+v", p)
	}
	if n := c.slack.count(); n != 2 {
		t.Fatalf("%d answers posted, want 2", n)
	}
	if n := workflowsOf(t, c.stack, "slack:T1:D2:U2"); n != 1 {
		t.Fatalf("%d workflows in the DM's session, want 1", n)
	}

	// The health endpoint asks Slack (auth.test) who the bot is.
	req, _ := http.NewRequest(http.MethodGet, c.httpURL+"/channels/health", nil)
	if code, body := do(t, req); code != http.StatusOK || !strings.Contains(body, "UBOT") || !strings.Contains(body, "neuron_bot") {
		t.Fatalf("health: %d %s", code, body)
	}
}

// Requests not signed with the signing secret, and signed requests
// replayed after five minutes, are refused: no agent runs.
func TestSlackRefusesUnsigned(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{}, "", echoAgent("echo"))
	now := time.Now()
	ev := slackEvent("EvBad", mention("U9", "C9", "1700000000.000900", "run this"))
	for _, tc := range []struct {
		name   string
		secret string
		at     time.Time
		header map[string]string
		want   string
	}{
		{"wrong secret", "not-the-secret", now, nil, "X-Slack-Signature does not match"},
		{"stale timestamp", slackSecret, now.Add(-6 * time.Minute), nil, "more than five minutes"},
		{"future timestamp", slackSecret, now.Add(6 * time.Minute), nil, "more than five minutes"},
		{"no signature", slackSecret, now, map[string]string{"X-Slack-Signature": ""}, "missing X-Slack-Signature"},
		{"no timestamp", slackSecret, now, map[string]string{"X-Slack-Request-Timestamp": ""}, "missing"},
		{"body changed", slackSecret, now, map[string]string{"X-Slack-Signature": slackSign(slackSecret, fmt.Sprint(now.Unix()), []byte(ev+" "))}, "does not match"},
	} {
		code, body := postSlack(t, c, tc.secret, tc.at, ev, tc.header)
		if code != http.StatusUnauthorized || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %q, want 401 %q", tc.name, code, body, tc.want)
		}
	}
	// The same event, properly signed, is then the first one taken.
	if code, _ := postSlack(t, c, slackSecret, now, ev, nil); code != http.StatusOK {
		t.Fatalf("signed: %d", code)
	}
	if p := c.slack.next(t); p.Text != "[scripted model] You said: run this" {
		t.Fatalf("posted %+v", p)
	}
	if n := workflowsOf(t, c.stack, "slack:T1:C9:U9"); n != 1 {
		t.Fatalf("%d workflows, want 1: a refused request ran the agent", n)
	}
}

// Slack retries an event it thinks was not acknowledged (same event_id,
// X-Slack-Retry-Num): the agent runs once.
func TestSlackRetries(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{}, "", echoAgent("echo"))
	now := time.Now()
	ev := slackEvent("EvRetry", mention("U3", "C3", "1700000003.000100", "only once"))
	for i, h := range []map[string]string{nil, {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}, {"X-Slack-Retry-Num": "2", "X-Slack-Retry-Reason": "http_timeout"}} {
		if code, body := postSlack(t, c, slackSecret, now, ev, h); code != http.StatusOK {
			t.Fatalf("delivery %d: %d %s", i, code, body)
		}
	}
	// A later message of the same user runs after any retry taken (one
	// lane per user): when its answer is posted, a duplicate would have
	// been posted before it.
	if code, _ := postSlack(t, c, slackSecret, now, slackEvent("EvNext", mention("U3", "C3", "1700000004.000100", "and then")), nil); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.slack.next(t); p.Text != "[scripted model] You said: only once" {
		t.Fatalf("first answer %+v", p)
	}
	if p := c.slack.next(t); p.Text != "[scripted model] You said: and then" {
		t.Fatalf("second answer %+v: the retry ran the agent again", p)
	}
	if n := workflowsOf(t, c.stack, "slack:T1:C3:U3"); n != 2 {
		t.Fatalf("%d workflows, want 2", n)
	}
}

// A user whose lane is full is told so in the thread, not dropped.
func TestSlackLaneFull(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{laneDepth: 1}, "", scriptedAgent("echo", map[string]any{"text": "late", "delay": "1h"}))
	now := time.Now()
	for i := range 3 {
		ts := fmt.Sprintf("1700000010.00%d", i)
		if code, _ := postSlack(t, c, slackSecret, now, slackEvent(fmt.Sprint("EvFull", i), mention("U4", "C4", ts, "busy")), nil); code != http.StatusOK {
			t.Fatalf("message %d: %d", i, code)
		}
	}
	p := c.slack.next(t)
	if p.Thread != "1700000010.002" || !strings.Contains(p.Text, "Too many of your messages are waiting") {
		t.Fatalf("posted %+v", p)
	}
}

// A Telegram update reaches the agent, and the answer is sent as a reply
// in the chat; a repeated update_id runs nothing twice.
func TestTelegramMessage(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{}, "", echoAgent("echo"))
	for range 2 { // Telegram repeats an update it saw no 200 for
		if code, body := postTelegram(t, c, telegramSecret, telegramUpdate(500, 11, 42, 42, "hi bot")); code != http.StatusOK {
			t.Fatalf("update: %d %s", code, body)
		}
	}
	if code, _ := postTelegram(t, c, telegramSecret, telegramUpdate(501, 12, 42, 42, "again")); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.telegram.next(t); p != (chatPost{Conversation: "42", Thread: "11", Text: "[scripted model] You said: hi bot"}) {
		t.Fatalf("sent %+v", p)
	}
	if p := c.telegram.next(t); p != (chatPost{Conversation: "42", Thread: "12", Text: "[scripted model] You said: again"}) {
		t.Fatalf("sent %+v: the repeated update ran the agent again", p)
	}
	if n := workflowsOf(t, c.stack, "telegram:42:42"); n != 2 {
		t.Fatalf("%d workflows, want 2", n)
	}
}

// Updates without the webhook's secret token are refused: no agent runs.
func TestTelegramRefusesWrongSecret(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{}, "", echoAgent("echo"))
	for _, secret := range []string{"", "wrong", telegramSecret + "x", strings.ToUpper(telegramSecret)} {
		code, body := postTelegram(t, c, secret, telegramUpdate(600, 1, 77, 77, "let me in"))
		if code != http.StatusUnauthorized || !strings.Contains(body, "X-Telegram-Bot-Api-Secret-Token") {
			t.Errorf("secret %q: %d %q, want 401", secret, code, body)
		}
	}
	if code, _ := postTelegram(t, c, telegramSecret, telegramUpdate(601, 2, 77, 77, "with the secret")); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.telegram.next(t); p.Text != "[scripted model] You said: with the secret" {
		t.Fatalf("sent %+v", p)
	}
	if n := workflowsOf(t, c.stack, "telegram:77:77"); n != 1 {
		t.Fatalf("%d workflows, want 1: a refused update ran the agent", n)
	}
}

// A run that waits for a tool approval asks in the chat; the user's
// "approve" is the decision, and the rest of the run is posted.
func TestTelegramApproval(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{}, "", carefulAgent("echo"))
	if code, _ := postTelegram(t, c, telegramSecret, telegramUpdate(700, 1, 5, 5, "keep notes")); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.telegram.next(t); !strings.Contains(p.Text, "waits for your approval to run write") {
		t.Fatalf("sent %+v", p)
	}
	if code, _ := postTelegram(t, c, telegramSecret, telegramUpdate(701, 2, 5, 5, "approve")); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.telegram.next(t); p.Text != "The notes are written." || p.Thread != "2" {
		t.Fatalf("sent %+v", p)
	}
	b, err := os.ReadFile(filepath.Join(c.workspace, "notes.md"))
	if err != nil || string(b) != "hello notes" {
		t.Fatalf("notes.md: %q %v", b, err)
	}
}

// The route table sends each channel, conversation or user to its agent,
// and the rest to the default.
func TestChatRoutes(t *testing.T) {
	t.Parallel()
	routes := writeTemp(t, "routes.yaml", `
default: echo
routes:
  - channel: slack
    conversation: COPS
    agent: ops
  - channel: telegram
    user: 42
    agent: personal
`)
	c := startChatStack(t, stackOptions{}, routes, echoAgent("echo"),
		scriptedAgent("ops", map[string]any{"text": "ops here"}), scriptedAgent("personal", map[string]any{"text": "personal here"}))
	now := time.Now()
	if code, _ := postSlack(t, c, slackSecret, now, slackEvent("EvOps", mention("U1", "COPS", "1.1", "status?")), nil); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.slack.next(t); p.Text != "ops here" {
		t.Fatalf("ops channel: %+v", p)
	}
	if code, _ := postSlack(t, c, slackSecret, now, slackEvent("EvGen", mention("U1", "CGENERAL", "1.2", "status?")), nil); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.slack.next(t); p.Text != "[scripted model] You said: status?" {
		t.Fatalf("other channel: %+v", p)
	}
	if code, _ := postTelegram(t, c, telegramSecret, telegramUpdate(1, 1, 42, 1000, "me")); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.telegram.next(t); p.Text != "personal here" {
		t.Fatalf("user 42: %+v", p)
	}
	if code, _ := postTelegram(t, c, telegramSecret, telegramUpdate(2, 1, 43, 1000, "me")); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.telegram.next(t); p.Text != "[scripted model] You said: me" {
		t.Fatalf("user 43: %+v", p)
	}
}

// A route table naming an agent that does not exist stops the gateway
// at start, naming the line.
func TestChatRoutesUnknownAgent(t *testing.T) {
	t.Parallel()
	routes := writeTemp(t, "routes.yaml", "default: echo\nroutes:\n  - channel: slack\n    agent: nobody\n")
	s := startStack(t, stackOptions{}, echoAgent("echo"))
	cfg := gateway.Config{}
	cfg.Server.Dev = true
	cfg.Server.Addr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.Orchestrator.Target = s.orchAddr
	cfg.Agents = s.registry
	cfg.Channels = gateway.ChannelsConfig{Routes: routes, Telegram: gateway.TelegramConfig{Token: telegramToken, Secret: telegramSecret}}
	err := gateway.Run(ctxFor(t, 30*time.Second), cfg)
	if err == nil || !strings.Contains(err.Error(), "routes.yaml:3: route 1") || !strings.Contains(err.Error(), "nobody") {
		t.Fatalf("Run: %v", err)
	}
}

// Errors from the Telegram API never carry the bot token (it is part of
// every method's URL).
func TestTelegramErrorsHideToken(t *testing.T) {
	t.Parallel()
	tg, err := gateway.NewTelegram(gateway.TelegramConfig{Token: telegramToken, Secret: telegramSecret, APIURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = tg.Health(ctxFor(t, 10*time.Second))
	if err == nil || strings.Contains(err.Error(), telegramToken) {
		t.Fatalf("Health: %v", err)
	}
	srv := newFakeTelegram(t, "another:token")
	tg, _ = gateway.NewTelegram(gateway.TelegramConfig{Token: telegramToken, Secret: telegramSecret, APIURL: srv.URL})
	err = tg.Send(context.Background(), gateway.ChatEvent{Conversation: "1"}, "hi")
	if err == nil || !strings.Contains(err.Error(), "401 Unauthorized") || strings.Contains(err.Error(), telegramToken) {
		t.Fatalf("Send: %v", err)
	}
}

// writeTemp writes text to a new file named name and returns its path.
func writeTemp(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
