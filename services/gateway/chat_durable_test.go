package gateway_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/a2a"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/gateway"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A platform's retry of a delivery that reaches another replica, or a
// restarted gateway, does not run the agent again: the delivery ids seen
// are kept in the State service.
func TestChatDeliveryOnceAcrossReplicas(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{}, "", echoAgent("echo"))
	now := time.Now()
	ev := slackEvent("EvDurable", mention("U5", "C5", "1700000005.000100", "only once"))
	if code, body := postSlack(t, c, slackSecret, now, ev, nil); code != http.StatusOK {
		t.Fatalf("delivery: %d %s", code, body)
	}
	if p := c.slack.next(t); p.Text != "[scripted model] You said: only once" {
		t.Fatalf("answer %+v", p)
	}
	upd := telegramUpdate(9001, 51, 55, 55, "just the once")
	if code, body := postTelegram(t, c, telegramSecret, upd); code != http.StatusOK {
		t.Fatalf("update: %d %s", code, body)
	}
	if p := c.telegram.next(t); p.Text != "[scripted model] You said: just the once" {
		t.Fatalf("answer %+v", p)
	}

	// The retries reach another replica, then a gateway started after
	// both stopped.
	r := c.replica(t)
	retry := map[string]string{"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
	if code, body := postSlack(t, r, slackSecret, now, ev, retry); code != http.StatusOK {
		t.Fatalf("retry on a replica: %d %s", code, body)
	}
	if code, body := postTelegram(t, r, telegramSecret, upd); code != http.StatusOK {
		t.Fatalf("update again on a replica: %d %s", code, body)
	}
	c.stop()
	r.stop()
	r2 := c.replica(t)
	retry["X-Slack-Retry-Num"] = "2"
	if code, body := postSlack(t, r2, slackSecret, now, ev, retry); code != http.StatusOK {
		t.Fatalf("retry after a restart: %d %s", code, body)
	}
	if code, body := postTelegram(t, r2, telegramSecret, upd); code != http.StatusOK {
		t.Fatalf("update again after a restart: %d %s", code, body)
	}
	// A later message of each user runs after any retry taken (one lane
	// per user, kept in the State service): a duplicate answer would be
	// posted before it.
	if code, _ := postSlack(t, r2, slackSecret, now, slackEvent("EvDurable2", mention("U5", "C5", "1700000006.000100", "and then")), nil); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.slack.next(t); p.Text != "[scripted model] You said: and then" {
		t.Fatalf("after the retries, Slack got %+v; want the next message's answer", p)
	}
	if code, _ := postTelegram(t, r2, telegramSecret, telegramUpdate(9002, 52, 55, 55, "and then")); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.telegram.next(t); p.Text != "[scripted model] You said: and then" {
		t.Fatalf("after the retries, Telegram got %+v; want the next message's answer", p)
	}
	if n := workflowsOf(t, c.stack, "slack:T1:C5:U5"); n != 2 {
		t.Fatalf("%d workflows in the Slack session, want 2", n)
	}
	if n := workflowsOf(t, c.stack, "telegram:55:55"); n != 2 {
		t.Fatalf("%d workflows in the Telegram session, want 2", n)
	}
}

// A chat message whose answer was still to come when the gateway stopped
// is answered, in its conversation and thread, by the gateway that
// resumes its lane, once; its workflow ran once.
func TestChatAnswerPostedAfterRestart(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{}, "", agent{"id": "echo", "metadata": map[string]any{"scripted": map[string]any{
		"turns": []any{map[string]any{"text": "quick"}},
		"cases": []any{map[string]any{"contains": "slow", "turns": []any{map[string]any{"text": "noted", "delay": "3s"}}}},
	}}})
	ctx := ctxFor(t, 2*time.Minute)
	const session = "telegram:66:66"
	if code, body := postTelegram(t, c, telegramSecret, telegramUpdate(9101, 61, 66, 66, "slow one")); code != http.StatusOK {
		t.Fatalf("update: %d %s", code, body)
	}
	for workflowsOf(t, c.stack, session) == 0 { // started
		select {
		case <-ctx.Done():
			t.Fatal("the message's workflow did not start")
		case <-time.After(25 * time.Millisecond):
		}
	}
	c.stop()
	if n := c.telegram.count(); n != 0 {
		t.Fatalf("%d answers posted before the stop: nothing was left to post after it (raise the agent's delay)", n)
	}
	r := c.replica(t)
	if p := c.telegram.next(t); p != (chatPost{Conversation: "66", Thread: "61", Text: "noted"}) {
		t.Fatalf("after the restart, posted %+v", p)
	}
	// The next message's answer comes next: the first was posted once.
	if code, _ := postTelegram(t, r, telegramSecret, telegramUpdate(9102, 62, 66, 66, "and now")); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.telegram.next(t); p != (chatPost{Conversation: "66", Thread: "62", Text: "quick"}) {
		t.Fatalf("next posted %+v", p)
	}
	if n := workflowsOf(t, c.stack, session); n != 2 {
		t.Fatalf("%d workflows in the session, want 2", n)
	}
	st := statev1.NewStateServiceClient(harness.Dial(t, c.stateAddr))
	for {
		_, err := st.Read(ctx, &statev1.ReadRequest{Scope: scope.Custom(gateway.StateScope), Key: "lane/" + session})
		if status.Code(err) == codes.NotFound {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the lane's record is still there: %v", err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// slowEcho answers "noted" after 3 s to a message containing "slow",
// "quick" at once to any other.
func slowEcho() agent {
	return agent{"id": "echo", "metadata": map[string]any{"scripted": map[string]any{
		"turns": []any{map[string]any{"text": "quick"}},
		"cases": []any{map[string]any{"contains": "slow", "turns": []any{map[string]any{"text": "noted", "delay": "3s"}}}},
	}}}
}

// Two live replicas take messages for one lane: the one holding it runs
// them all, in order, and posts each chat answer once; a blocking A2A
// send to the other gets its answer.
func TestLaneHeldByAnotherReplica(t *testing.T) {
	t.Parallel()
	c := startChatStack(t, stackOptions{}, "", slowEcho())
	r := c.replica(t)
	ctx := ctxFor(t, 2*time.Minute)
	if code, body := postTelegram(t, c, telegramSecret, telegramUpdate(9201, 71, 77, 77, "slow one")); code != http.StatusOK {
		t.Fatalf("update: %d %s", code, body)
	}
	if code, body := postTelegram(t, r, telegramSecret, telegramUpdate(9202, 72, 77, 77, "and now")); code != http.StatusOK {
		t.Fatalf("update on the replica: %d %s", code, body)
	}
	if p := c.telegram.next(t); p != (chatPost{Conversation: "77", Thread: "71", Text: "noted"}) {
		t.Fatalf("first posted %+v", p)
	}
	if p := c.telegram.next(t); p != (chatPost{Conversation: "77", Thread: "72", Text: "quick"}) {
		t.Fatalf("second posted %+v", p)
	}
	if code, _ := postTelegram(t, r, telegramSecret, telegramUpdate(9203, 73, 77, 77, "last")); code != http.StatusOK {
		t.Fatal(code)
	}
	if p := c.telegram.next(t); p != (chatPost{Conversation: "77", Thread: "73", Text: "quick"}) {
		t.Fatalf("third posted %+v: an answer was posted twice", p)
	}

	// A2A: a message queued on the first replica, the next one sent,
	// blocking, to the second.
	const session = "two-replicas"
	p := userText(session, "slow one")
	p.Config = &a2a.MessageSendConfig{Blocking: new(bool)}
	first := asTask(t)(a2aClients(t, c.stack, "echo")["jsonrpc"].SendMessage(ctx, p))
	second := asTask(t)(a2aClients(t, r.stack, "echo")["jsonrpc"].SendMessage(ctx, userText(session, "then this")))
	if second.Status.State != a2a.TaskStateCompleted || artifactText(second) != "quick" {
		t.Fatalf("blocking send on the replica: %s %q", second.Status.State, artifactText(second))
	}
	if wf := waitEnded(t, ctx, c.stack, string(first.ID)); gateway.Answer(wf) != "noted" {
		t.Fatalf("first message: %s %q", wf.GetStatus(), gateway.Answer(wf))
	}
}
