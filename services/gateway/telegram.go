package gateway

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// TelegramConfig configures the Telegram channel (a bot whose webhook,
// set with setWebhook and a secret_token, is the gateway).
type TelegramConfig struct {
	// Token is the bot token (sendMessage, getMe).
	Token string
	// Secret is the secret_token given to setWebhook: Telegram sends it
	// in X-Telegram-Bot-Api-Secret-Token with every update.
	Secret string
	// APIURL is the Bot API's base URL; empty: https://api.telegram.org.
	APIURL string
}

// telegramMaxText is the most text one sendMessage carries (4096
// characters; counted here in bytes, which is never more).
const telegramMaxText = 4096

// Telegram is the Telegram channel: it takes updates on a webhook and
// answers with sendMessage, as a reply to the message. It speaks the Bot
// API over net/http.
type Telegram struct {
	secret string
	token  string
	base   string
	client *http.Client
}

// NewTelegram returns the Telegram channel of cfg.
func NewTelegram(cfg TelegramConfig) (*Telegram, error) {
	if cfg.Token == "" {
		return nil, errors.New("the Telegram channel needs --telegram-token (the bot's token) to answer")
	}
	if cfg.Secret == "" {
		return nil, errors.New("the Telegram channel needs --telegram-secret (the secret_token given to setWebhook): without it anyone could post updates")
	}
	for _, r := range cfg.Secret {
		if !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') || len(cfg.Secret) > 256 {
			return nil, errors.New("--telegram-secret: Telegram allows 1 to 256 characters A-Z, a-z, 0-9, _ and -")
		}
	}
	base := strings.TrimSuffix(cfg.APIURL, "/")
	if base == "" {
		base = "https://api.telegram.org"
	}
	return &Telegram{secret: cfg.Secret, token: cfg.Token, base: base, client: &http.Client{Timeout: 30 * time.Second}}, nil
}

// Name is "telegram".
func (*Telegram) Name() string { return "telegram" }

// telegramUpdate is the part of an Update the gateway reads.
type telegramUpdate struct {
	UpdateID int64            `json:"update_id"`
	Message  *telegramMessage `json:"message"`
}

type telegramMessage struct {
	MessageID int64 `json:"message_id"`
	From      *struct {
		ID    int64 `json:"id"`
		IsBot bool  `json:"is_bot"`
	} `json:"from"`
	Chat struct {
		ID int64 `json:"id"`
	} `json:"chat"`
	Text string `json:"text"`
}

// Listen serves the bot's webhook: it checks the secret token, drops
// updates it has seen (by update_id; Telegram repeats an update until
// it is acknowledged) and passes each text message on.
func (t *Telegram) Listen(deliver Deliver) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("X-Telegram-Bot-Api-Secret-Token")
		if subtle.ConstantTimeCompare([]byte(got), []byte(t.secret)) != 1 {
			http.Error(w, "X-Telegram-Bot-Api-Secret-Token does not match the webhook's secret (--telegram-secret)", http.StatusUnauthorized)
			return
		}
		var u telegramUpdate
		if err := json.NewDecoder(io.LimitReader(r.Body, maxWebhookBody)).Decode(&u); err != nil {
			http.Error(w, "not a Telegram Update: "+err.Error(), http.StatusBadRequest)
			return
		}
		m := u.Message
		if m == nil || m.From == nil || m.From.IsBot || strings.TrimSpace(m.Text) == "" {
			w.WriteHeader(http.StatusOK) // edits, channel posts, stickers...: nothing to answer
			return
		}
		ev := ChatEvent{
			Channel:      "telegram",
			ID:           strconv.FormatInt(u.UpdateID, 10),
			Conversation: strconv.FormatInt(m.Chat.ID, 10),
			User:         strconv.FormatInt(m.From.ID, 10),
			Thread:       strconv.FormatInt(m.MessageID, 10),
			Text:         strings.TrimSpace(m.Text),
		}
		if err := deliver(r.Context(), ev); err != nil {
			http.Error(w, "the gateway cannot take the update now; retry", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}

// Send answers ev with sendMessage, replying to its message (long text
// in several messages).
func (t *Telegram) Send(ctx context.Context, ev ChatEvent, text string) error {
	for _, part := range splitText(text, telegramMaxText) {
		req := map[string]any{"chat_id": ev.Conversation, "text": part}
		if id, err := strconv.ParseInt(ev.Thread, 10, 64); err == nil {
			req["reply_parameters"] = map[string]any{"message_id": id, "allow_sending_without_reply": true}
		}
		if err := t.call(ctx, "sendMessage", req, nil); err != nil {
			return err
		}
	}
	return nil
}

// Health calls getMe: the token works, and names the bot.
func (t *Telegram) Health(ctx context.Context) (string, error) {
	var me struct {
		Username string `json:"username"`
		ID       int64  `json:"id"`
	}
	if err := t.call(ctx, "getMe", map[string]any{}, &me); err != nil {
		return "", err
	}
	return fmt.Sprintf("@%s (%d)", me.Username, me.ID), nil
}

// call calls Bot API method with req as JSON and decodes its result into
// out. Its errors never carry the URL: the token is part of it.
func (t *Telegram) call(ctx context.Context, method string, req, out any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, t.base+"/bot"+t.token+"/"+method, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("telegram %s: bad --telegram-api-url", method)
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(hr)
	if err != nil {
		var ue interface{ Unwrap() error }
		if errors.As(err, &ue) && ue.Unwrap() != nil {
			err = ue.Unwrap() // *url.Error's inner error, without the URL
		}
		return fmt.Errorf("telegram %s: %s", method, t.scrub(err.Error()))
	}
	defer resp.Body.Close()
	var r struct {
		OK          bool            `json:"ok"`
		Result      json.RawMessage `json:"result"`
		ErrorCode   int             `json:"error_code"`
		Description string          `json:"description"`
		Parameters  struct {
			RetryAfter int `json:"retry_after"`
		} `json:"parameters"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxWebhookBody)).Decode(&r); err != nil {
		return fmt.Errorf("telegram %s: HTTP %d, not a Bot API answer: %v", method, resp.StatusCode, err)
	}
	if !r.OK {
		err := fmt.Errorf("telegram %s: %d %s", method, r.ErrorCode, t.scrub(r.Description))
		if r.Parameters.RetryAfter > 0 {
			return retryAfterError{err, time.Duration(r.Parameters.RetryAfter) * time.Second}
		}
		return err
	}
	if out != nil {
		if err := json.Unmarshal(r.Result, out); err != nil {
			return fmt.Errorf("telegram %s: its result: %v", method, err)
		}
	}
	return nil
}

// scrub removes the token from s.
func (t *Telegram) scrub(s string) string { return strings.ReplaceAll(s, t.token, "<token>") }
