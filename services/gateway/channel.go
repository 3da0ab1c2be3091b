package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/a2a"
	"google.golang.org/grpc/codes"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// ChatEvent is one message that arrived on a chat channel: the gateway's
// one internal event, whatever platform it came from.
type ChatEvent struct {
	// Channel names the channel ("slack", "telegram").
	Channel string
	// ID is the platform's id of the delivery (Slack's event_id,
	// Telegram's update_id): a retried delivery carries the same one.
	ID string
	// Workspace is the Slack team; empty on Telegram.
	Workspace string
	// Conversation is where the message was written: a Slack channel id,
	// a Telegram chat id.
	Conversation string
	// User is who wrote it: a Slack user id, a Telegram user id.
	User string
	// Thread is what the answer replies to: the Slack thread's ts, the
	// Telegram message id.
	Thread string
	// Text is the message.
	Text string
}

// Session is the gateway session of the event's user in its
// conversation: their messages there run one at a time, in order, and
// the agent keeps their history.
func (ev ChatEvent) Session() string {
	var b strings.Builder
	for i, p := range []string{ev.Channel, ev.Workspace, ev.Conversation, ev.User} {
		if p == "" && i == 1 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(':')
		}
		for _, r := range p {
			if r < 128 && (r == '-' || r == '.' || r == '_' || r == '@' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				b.WriteRune(r)
			} else {
				b.WriteByte('_')
			}
		}
	}
	return clip(b.String(), 180)
}

// Deliver hands a verified, new event to the gateway. It returns quickly
// (the platforms want an answer within seconds): nil once the message is
// queued on its lane or refused with a reply to the user; an error when
// the platform should deliver it again later (the gateway could not
// reach the orchestrator).
type Deliver func(ctx context.Context, ev ChatEvent) error

// Channel is a chat platform the gateway listens on and answers through.
type Channel interface {
	// Name is the channel's name in routes and sessions.
	Name() string
	// Listen returns the webhook handler the platform posts its events
	// to; it verifies each request, drops repeated deliveries and passes
	// each message to deliver.
	Listen(deliver Deliver) http.Handler
	// Send posts text as the answer to ev (in its thread, as a reply).
	Send(ctx context.Context, ev ChatEvent, text string) error
	// Health checks the channel's credentials with the platform and
	// returns who the bot is there.
	Health(ctx context.Context) (string, error)
}

// ChannelsConfig configures the chat channels; a channel is on when its
// token is set.
type ChannelsConfig struct {
	// Routes is the route table file (YAML); empty: every message goes
	// to the gateway's default agent.
	Routes string
	// Slack is the Slack channel.
	Slack SlackConfig
	// Telegram is the Telegram channel.
	Telegram TelegramConfig

	slackSecretFile, slackTokenFile, telegramTokenFile, telegramSecretFile string
}

// BindFlags registers the channel flags on fs. Each secret is taken from
// its flag, its environment variable (NEURON_GATEWAY_SLACK_TOKEN, ...) or
// the file its -file flag names; never from a file and a value at once.
func (c *ChannelsConfig) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Routes, "routes", "", "route table (YAML): which agent answers which chat channel, conversation or user; without it every chat message goes to --default-agent")
	fs.StringVar(&c.Slack.SigningSecret, "slack-signing-secret", "", "Slack app signing secret: verifies X-Slack-Signature on POST /channels/slack/events (prefer the env variable or --slack-signing-secret-file)")
	fs.StringVar(&c.slackSecretFile, "slack-signing-secret-file", "", "file holding the Slack signing secret")
	fs.StringVar(&c.Slack.Token, "slack-token", "", "Slack bot token (xoxb-...) for chat.postMessage; turns the Slack channel on (prefer the env variable or --slack-token-file)")
	fs.StringVar(&c.slackTokenFile, "slack-token-file", "", "file holding the Slack bot token")
	fs.StringVar(&c.Slack.APIURL, "slack-api-url", "", "Slack Web API base URL (default https://slack.com/api/)")
	fs.StringVar(&c.Telegram.Token, "telegram-token", "", "Telegram bot token for sendMessage; turns the Telegram channel on (prefer the env variable or --telegram-token-file)")
	fs.StringVar(&c.telegramTokenFile, "telegram-token-file", "", "file holding the Telegram bot token")
	fs.StringVar(&c.Telegram.Secret, "telegram-secret", "", "the secret_token given to setWebhook: checked against X-Telegram-Bot-Api-Secret-Token on POST /channels/telegram/webhook")
	fs.StringVar(&c.telegramSecretFile, "telegram-secret-file", "", "file holding the Telegram webhook secret")
	fs.StringVar(&c.Telegram.APIURL, "telegram-api-url", "", "Telegram Bot API base URL (default https://api.telegram.org)")
}

// resolve reads the secrets from their files.
func (c *ChannelsConfig) resolve() error {
	for _, s := range []struct {
		flag string
		v    *string
		file string
	}{
		{"slack-signing-secret", &c.Slack.SigningSecret, c.slackSecretFile},
		{"slack-token", &c.Slack.Token, c.slackTokenFile},
		{"telegram-token", &c.Telegram.Token, c.telegramTokenFile},
		{"telegram-secret", &c.Telegram.Secret, c.telegramSecretFile},
	} {
		if s.file == "" {
			continue
		}
		if *s.v != "" {
			return fmt.Errorf("--%s and --%s-file are both set: give the secret once", s.flag, s.flag)
		}
		b, err := os.ReadFile(s.file)
		if err != nil {
			return fmt.Errorf("--%s-file: %w", s.flag, err)
		}
		if *s.v = strings.TrimSpace(string(b)); *s.v == "" {
			return fmt.Errorf("--%s-file %s is empty", s.flag, s.file)
		}
	}
	return nil
}

// Channels connects chat channels to the gateway: each event is routed to
// an agent, queued on its user's lane, and the answer is posted back.
type Channels struct {
	g      *Gateway
	routes *Routes
	list   []Channel
	seen   *seenSet
	// store, when set (durable lanes), keeps the delivery ids seen in the
	// State service too (seen.go), for every replica and restart.
	store *kv
	log   *slog.Logger

	mu      sync.Mutex
	pending map[string]string // session -> workflow waiting for an approval
}

// NewChannels connects list to g through routes.
func NewChannels(g *Gateway, routes *Routes, list []Channel, log *slog.Logger) *Channels {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Channels{g: g, routes: routes, list: list, seen: newSeenSet(seenTTL, seenMax), log: log, pending: map[string]string{}}
	if g.durable != nil {
		c.store = g.durable.kv
		g.chatSettled = c.settled
	}
	return c
}

// newChannels builds the configured channels; nil when none is on.
func newChannels(ctx context.Context, g *Gateway, cfg ChannelsConfig, defaultAgent string, log *slog.Logger) (*Channels, error) {
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	var list []Channel
	if cfg.Slack.Token != "" || cfg.Slack.SigningSecret != "" {
		s, err := NewSlack(cfg.Slack)
		if err != nil {
			return nil, err
		}
		list = append(list, s)
	}
	if cfg.Telegram.Token != "" || cfg.Telegram.Secret != "" {
		t, err := NewTelegram(cfg.Telegram)
		if err != nil {
			return nil, err
		}
		list = append(list, t)
	}
	if len(list) == 0 {
		if cfg.Routes != "" {
			return nil, errors.New("--routes is set but no chat channel is on: set --slack-token or --telegram-token")
		}
		return nil, nil
	}
	routes := &Routes{}
	if cfg.Routes != "" {
		var err error
		if routes, err = LoadRoutes(cfg.Routes); err != nil {
			return nil, err
		}
	}
	if routes.Default == "" {
		routes.Default = defaultAgent
	}
	if routes.Default == "" {
		return nil, errors.New("chat channels need an agent for messages no route names: set default: in --routes, or --default-agent")
	}
	// An agent missing from a registry file is a mistake in the table;
	// the orchestrator's agents may be defined after the gateway starts
	// (neuron up applies its demo agents then), so there it is only a
	// warning, as is an agent that cannot be looked up yet.
	for _, a := range routes.agents() {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := g.agents.Check(cctx, a.agent)
		cancel()
		switch {
		case err == nil:
		case errs.ToStatus(err).Code() == codes.NotFound && g.agents.client == nil:
			return nil, fmt.Errorf("%s: agent %q: %w", a.where, a.agent, err)
		default:
			log.Warn("route agent not checked", "agent", a.agent, "where", a.where, "err", err)
		}
	}
	c := NewChannels(g, routes, list, log)
	for _, ch := range list {
		log.Info("chat channel on", "channel", ch.Name(), "webhook", webhookPath(ch))
	}
	return c, nil
}

// webhookPath is where ch's platform posts its events.
func webhookPath(ch Channel) string {
	switch ch.Name() {
	case "slack":
		return "/channels/slack/events"
	case "telegram":
		return "/channels/telegram/webhook"
	}
	return "/channels/" + ch.Name()
}

// mount adds every channel's webhook, and GET /channels/health behind
// auth, to mux. Webhooks are not behind the bearer policy: each platform
// authenticates its requests its own way (a signature, a secret token).
func (c *Channels) mount(mux *http.ServeMux, authed func(string, http.Handler) http.Handler) {
	for _, ch := range c.list {
		mux.Handle("POST "+webhookPath(ch), ch.Listen(func(ctx context.Context, ev ChatEvent) error { return c.deliver(ctx, ch, ev) }))
	}
	mux.Handle("GET /channels/health", authed(MethodHTTPChat, http.HandlerFunc(c.health)))
}

// health reports each channel's Health.
func (c *Channels) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	out := map[string]any{}
	ok := true
	for _, ch := range c.list {
		who, err := ch.Health(ctx)
		if err != nil {
			ok = false
			out[ch.Name()] = map[string]any{"ok": false, "error": err.Error()}
			continue
		}
		out[ch.Name()] = map[string]any{"ok": true, "bot": who}
	}
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(out)
}

// submitTimeout bounds the work done before a webhook is acknowledged.
const submitTimeout = 2 * time.Second

// deliver routes ev to its agent on its user's lane. A repeated delivery
// is dropped; a full lane or an unknown agent is answered in the chat.
func (c *Channels) deliver(ctx context.Context, ch Channel, ev ChatEvent) error {
	key := ch.Name() + "/" + ev.ID
	if ev.ID != "" && !c.seen.claim(key) {
		c.log.Debug("chat delivery repeated", "channel", ch.Name(), "id", ev.ID)
		return nil
	}
	if ev.ID != "" && c.store != nil {
		sctx, cancel := context.WithTimeout(ctx, submitTimeout)
		fresh, err := c.claimSeen(sctx, key)
		cancel()
		if err != nil {
			c.seen.forget(key)
			c.log.Warn("chat delivery not checked against those seen; the platform will retry", "channel", ch.Name(), "id", ev.ID, "err", err)
			return err
		}
		if !fresh {
			c.log.Debug("chat delivery repeated", "channel", ch.Name(), "id", ev.ID)
			return nil
		}
	}
	session := ev.Session()
	if wf := c.pendingOf(session); wf != "" {
		if approve, reason, err := decisionOf(a2a.NewMessage(a2a.MessageRoleUser, a2a.TextPart{Text: ev.Text})); err == nil {
			return c.decide(ctx, ch, ev, key, wf, approve, reason)
		}
	}
	agent := c.routes.Agent(ev)
	sctx, cancel := context.WithTimeout(ctx, submitTimeout)
	defer cancel()
	acc, err := c.g.Submit(sctx, Message{Agent: agent, Session: session, Text: ev.Text, Metadata: map[string]any{
		"channel": ev.Channel, "workspace": ev.Workspace, "conversation": ev.Conversation, "user": ev.User,
		"thread": ev.Thread, "delivery": ev.ID,
	}})
	if err != nil {
		return c.refuse(ch, ev, key, agent, err)
	}
	c.doneSeen(ev, key)
	c.log.Info("chat message queued", "channel", ch.Name(), "agent", agent, "workflow_id", acc.ID)
	go func() {
		s := <-acc.Settled
		if !s.posted { // durable lanes post the answer themselves (settled)
			c.answer(ch, ev, session, s.Workflow, s.Err)
		}
	}()
	return nil
}

// refuse answers a message that could not be queued: in the chat when
// the user can act on it (a full lane, a bad message, no such agent);
// otherwise the delivery is forgotten and the platform is asked to
// retry.
func (c *Channels) refuse(ch Channel, ev ChatEvent, key, agent string, err error) error {
	st := errs.ToStatus(err)
	var text string
	switch st.Code() {
	case codes.ResourceExhausted:
		text = "Too many of your messages are waiting for an answer: this one was not taken. Send it again once an answer has come back."
	case codes.InvalidArgument:
		text = "This message cannot be sent to the agent: " + st.Message()
	case codes.NotFound:
		text = fmt.Sprintf("No agent %q answers here (the gateway's route table names it): tell whoever runs the gateway.", agent)
	default:
		c.seen.forget(key)
		c.forgetSeen(key)
		c.log.Warn("chat message not queued; the platform will retry", "channel", ch.Name(), "id", ev.ID, "err", err)
		return err
	}
	c.doneSeen(ev, key)
	c.log.Info("chat message refused", "channel", ch.Name(), "code", st.Code().String(), "reason", st.Message())
	go func() { _ = c.post(ch, ev, text) }()
	return nil
}

// decide answers the approval workflow wf waits for with ev's text and
// posts the rest of the run.
func (c *Channels) decide(ctx context.Context, ch Channel, ev ChatEvent, key, wf string, approve bool, reason string) error {
	sctx, cancel := context.WithTimeout(ctx, submitTimeout)
	defer cancel()
	seq, err := c.g.Decide(sctx, wf, approve, reason, ev.Channel+":"+ev.User)
	if err != nil {
		if errs.ToStatus(err).Code() == codes.FailedPrecondition {
			c.clearPending(ev.Session(), wf)
		}
		return c.refuse(ch, ev, key, "", err)
	}
	c.clearPending(ev.Session(), wf)
	go func() {
		w, err := c.g.Follow(c.g.ctx, wf, FollowOptions{AfterDecision: seq}, nil)
		_ = c.answer(ch, ev, ev.Session(), w, err)
	}()
	return nil
}

// answer posts where a message's workflow stopped; the error of the post.
func (c *Channels) answer(ch Channel, ev ChatEvent, session string, wf *orchestratorv1.Workflow, err error) error {
	var text string
	switch {
	case err != nil:
		st := errs.ToStatus(err)
		text = fmt.Sprintf("The agent could not answer (%s): %s", st.Code(), st.Message())
	case wf.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED:
		if text = Answer(wf); text == "" {
			text = "(the agent finished without an answer)"
		}
	case wf.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED:
		var names []string
		for _, p := range wf.GetPendingApprovals() {
			names = append(names, p.GetToolCall().GetName())
		}
		c.mu.Lock()
		c.pending[session] = wf.GetWorkflowId()
		c.mu.Unlock()
		text = fmt.Sprintf("The agent waits for your approval to run %s. Answer \"approve\" or \"reject <reason>\".", strings.Join(names, ", "))
		if a := Answer(wf); a != "" {
			text = a + "\n\n" + text
		}
	case wf.GetStatus() == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED:
		text = "The agent failed: " + wf.GetFailure().GetMessage()
	default:
		text = "The run ended " + StateName(wf.GetStatus()) + "."
	}
	return c.post(ch, ev, text)
}

// post sends text to ev's conversation, trying again a few times when
// the platform is briefly unreachable or rate-limits.
func (c *Channels) post(ch Channel, ev ChatEvent, text string) error {
	var err error
	for attempt := range 3 {
		ctx, cancel := context.WithTimeout(c.g.ctx, 30*time.Second)
		err = ch.Send(ctx, ev, text)
		cancel()
		if err == nil || c.g.ctx.Err() != nil {
			break
		}
		wait := time.Duration(attempt+1) * time.Second
		var ra interface{ RetryAfter() time.Duration }
		if errors.As(err, &ra) && ra.RetryAfter() > 0 {
			wait = min(ra.RetryAfter(), time.Minute)
		}
		select {
		case <-time.After(wait):
		case <-c.g.ctx.Done():
		}
	}
	if err != nil {
		c.log.Error("chat answer not posted", "channel", ch.Name(), "conversation", ev.Conversation, "err", err)
		return err
	}
	c.log.Debug("chat answer posted", "channel", ch.Name(), "conversation", ev.Conversation)
	return nil
}

func (c *Channels) pendingOf(session string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending[session]
}

func (c *Channels) clearPending(session, wf string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending[session] == wf {
		delete(c.pending, session)
	}
}

// seenSet remembers delivery ids for a while, to drop repeated
// deliveries (a platform retries when it thinks an ack was lost).
type seenSet struct {
	ttl   time.Duration
	max   int
	mu    sync.Mutex
	at    map[string]time.Time
	order []seenKey // oldest first
}

type seenKey struct {
	key string
	at  time.Time
}

func newSeenSet(ttl time.Duration, maxKeys int) *seenSet {
	return &seenSet{ttl: ttl, max: maxKeys, at: map[string]time.Time{}}
}

// claim records key and reports whether it was new. Keys older than the
// set's ttl, and the oldest ones beyond its size, are forgotten.
func (s *seenSet) claim(key string) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.order) > 0 && (now.Sub(s.order[0].at) >= s.ttl || len(s.order) >= s.max) {
		old := s.order[0]
		s.order = s.order[1:]
		if t, ok := s.at[old.key]; ok && t.Equal(old.at) {
			delete(s.at, old.key)
		}
	}
	if _, ok := s.at[key]; ok {
		return false
	}
	s.at[key] = now
	s.order = append(s.order, seenKey{key, now})
	return true
}

// forget drops key: its next delivery is handled.
func (s *seenSet) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.at, key)
}

// splitText cuts text into pieces of at most n bytes, at a line or a
// space when there is one in the second half of a piece, never inside a
// UTF-8 sequence.
func splitText(text string, n int) []string {
	var out []string
	for len(text) > n {
		cut := n
		for cut > 0 && !utf8Start(text[cut]) {
			cut--
		}
		if i := strings.LastIndexAny(text[:cut], "\n "); i > n/2 {
			cut = i + 1
		}
		out = append(out, text[:cut])
		text = text[cut:]
	}
	return append(out, text)
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }
