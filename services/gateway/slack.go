package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/slack-go/slack"
	"github.com/slack-go/slack/slackevents"
)

// SlackConfig configures the Slack channel (an app with the Events API
// and a bot token).
type SlackConfig struct {
	// SigningSecret verifies the requests Slack posts (X-Slack-Signature).
	SigningSecret string
	// Token is the bot token chat.postMessage is called with.
	Token string
	// APIURL is the Web API's base URL; empty: https://slack.com/api/.
	APIURL string
}

// slackMaxText is how much text one chat.postMessage carries (Slack
// truncates a message past 40,000 characters).
const slackMaxText = 39_000

// maxWebhookBody bounds a webhook request.
const maxWebhookBody = 1 << 20

// Slack is the Slack channel: it listens on the Events API (a request
// URL Slack posts events to) and answers with chat.postMessage, in the
// thread of the message. It takes app_mention events anywhere and
// message events in direct messages; messages of bots (its own answers
// among them) and edits are ignored.
type Slack struct {
	secret string
	api    *slack.Client
}

// NewSlack returns the Slack channel of cfg.
func NewSlack(cfg SlackConfig) (*Slack, error) {
	if cfg.SigningSecret == "" {
		return nil, errors.New("the Slack channel needs --slack-signing-secret (the app's signing secret) to verify what Slack posts")
	}
	if cfg.Token == "" {
		return nil, errors.New("the Slack channel needs --slack-token (the bot token, xoxb-...) to post answers")
	}
	var opts []slack.Option
	if cfg.APIURL != "" {
		opts = append(opts, slack.OptionAPIURL(strings.TrimSuffix(cfg.APIURL, "/")+"/"))
	}
	opts = append(opts, slack.OptionHTTPClient(&http.Client{Timeout: 30 * time.Second}))
	return &Slack{secret: cfg.SigningSecret, api: slack.New(cfg.Token, opts...)}, nil
}

// Name is "slack".
func (*Slack) Name() string { return "slack" }

// mentionPrefix is a leading mention of the bot (<@U123>) in an
// app_mention's text.
var mentionPrefix = regexp.MustCompile(`^\s*<@[A-Z0-9]+(\|[^>]*)?>[\s,:]*`)

// Listen serves Slack's Events API request URL: it verifies the
// signature and the timestamp (at most five minutes old), answers the
// url_verification challenge, drops retried events (by event_id) and
// acknowledges within Slack's three seconds; the answer is posted later.
func (s *Slack) Listen(deliver Deliver) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxWebhookBody+1))
		if err != nil {
			http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(body) > maxWebhookBody {
			http.Error(w, "the body is over 1 MiB", http.StatusRequestEntityTooLarge)
			return
		}
		if err := s.verify(r.Header, body); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		ev, err := slackevents.ParseEvent(json.RawMessage(body), slackevents.OptionNoVerifyToken())
		if err != nil {
			http.Error(w, "not an Events API payload: "+err.Error(), http.StatusBadRequest)
			return
		}
		switch ev.Type {
		case slackevents.URLVerification:
			v, ok := ev.Data.(*slackevents.EventsAPIURLVerificationEvent)
			if !ok {
				http.Error(w, "url_verification without a challenge", http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, v.Challenge)
			return
		case slackevents.CallbackEvent:
		default:
			w.WriteHeader(http.StatusOK) // app_rate_limited and the like: nothing to do
			return
		}
		cb, ok := ev.Data.(*slackevents.EventsAPICallbackEvent)
		if !ok {
			w.WriteHeader(http.StatusOK)
			return
		}
		ce, ok := s.event(ev, cb)
		if !ok {
			w.WriteHeader(http.StatusOK)
			return
		}
		if err := deliver(r.Context(), ce); err != nil {
			// Slack delivers it again (X-Slack-Retry-Num) a little later.
			http.Error(w, "the gateway cannot take the message now; retry", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}

// verify checks the request's signature with the signing secret, and
// that its timestamp is within five minutes of now (a replayed request
// is refused).
func (s *Slack) verify(h http.Header, body []byte) error {
	if h.Get("X-Slack-Signature") == "" || h.Get("X-Slack-Request-Timestamp") == "" {
		return errors.New("missing X-Slack-Signature or X-Slack-Request-Timestamp: requests must come from Slack, signed with the app's signing secret")
	}
	sv, err := slack.NewSecretsVerifier(h, s.secret)
	if errors.Is(err, slack.ErrExpiredTimestamp) {
		return errors.New("X-Slack-Request-Timestamp is more than five minutes from now: a replayed or delayed request (check the clock)")
	}
	if errors.Is(err, slack.ErrInvalidSignature) {
		return errors.New("X-Slack-Signature is not a v0 signature of the body with the signing secret (--slack-signing-secret)")
	}
	if err != nil {
		return fmt.Errorf("bad Slack signature headers: %v", err)
	}
	_, _ = sv.Write(body)
	if err := sv.Ensure(); err != nil {
		return errors.New("X-Slack-Signature does not match the body signed with the signing secret (--slack-signing-secret)")
	}
	return nil
}

// event turns a callback into a chat event, or reports that it is not a
// message for an agent.
func (s *Slack) event(ev slackevents.EventsAPIEvent, cb *slackevents.EventsAPICallbackEvent) (ChatEvent, bool) {
	ce := ChatEvent{Channel: "slack", ID: cb.EventID, Workspace: cb.TeamID}
	switch in := ev.InnerEvent.Data.(type) {
	case *slackevents.AppMentionEvent:
		if in.BotID != "" || in.User == "" {
			return ce, false
		}
		ce.Conversation, ce.User, ce.Text = in.Channel, in.User, mentionPrefix.ReplaceAllString(in.Text, "")
		ce.Thread = in.ThreadTimeStamp
		if ce.Thread == "" {
			ce.Thread = in.TimeStamp
		}
	case *slackevents.MessageEvent:
		// In channels the bot answers when mentioned (app_mention): a
		// message event there would be the same message again.
		if in.ChannelType != "im" || in.SubType != "" || in.BotID != "" || in.User == "" {
			return ce, false
		}
		ce.Conversation, ce.User, ce.Text = in.Channel, in.User, in.Text
		ce.Thread = in.ThreadTimeStamp
		if ce.Thread == "" {
			ce.Thread = in.TimeStamp
		}
	default:
		return ce, false
	}
	if ce.ID == "" {
		ce.ID = ce.Conversation + "/" + ce.Thread
	}
	ce.Text = strings.TrimSpace(ce.Text)
	return ce, ce.Text != ""
}

// Send posts text in ev's thread with chat.postMessage (long text in
// several messages).
func (s *Slack) Send(ctx context.Context, ev ChatEvent, text string) error {
	for _, part := range splitText(text, slackMaxText) {
		opts := []slack.MsgOption{slack.MsgOptionText(part, false)}
		if ev.Thread != "" {
			opts = append(opts, slack.MsgOptionTS(ev.Thread))
		}
		if _, _, err := s.api.PostMessageContext(ctx, ev.Conversation, opts...); err != nil {
			return slackError("chat.postMessage", err)
		}
	}
	return nil
}

// Health calls auth.test: the bot token works, and names the bot.
func (s *Slack) Health(ctx context.Context) (string, error) {
	r, err := s.api.AuthTestContext(ctx)
	if err != nil {
		return "", slackError("auth.test", err)
	}
	return fmt.Sprintf("%s (%s) in %s", r.User, r.UserID, r.Team), nil
}

// slackError names the method; a rate limit keeps its wait.
func slackError(method string, err error) error {
	var rl *slack.RateLimitedError
	if errors.As(err, &rl) {
		return retryAfterError{fmt.Errorf("slack %s: rate limited for %s", method, rl.RetryAfter), rl.RetryAfter}
	}
	return fmt.Errorf("slack %s: %w", method, err)
}

// retryAfterError is an error after which the platform asks to wait.
type retryAfterError struct {
	error
	after time.Duration
}

func (e retryAfterError) RetryAfter() time.Duration { return e.after }
func (e retryAfterError) Unwrap() error             { return e.error }
