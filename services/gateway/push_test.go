package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/a2a"
)

// pushReceived is one POST the push receiver got.
type pushReceived struct {
	state       a2a.TaskState
	token, auth string
	status      int
}

// A2A push notifications through the SDK client: a config given with
// the message (token and bearer credentials) gets the task's state
// changes; a receiver that fails twice gets the first one a third time
// (then answered 2xx), and no state twice once delivered; configs are
// set, read, listed and deleted, kept in State across a restart, and a
// bad URL is refused.
func TestA2APushNotifications(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOptions{noGateway: true}, scriptedAgent("paced", map[string]any{"text": "noted", "delay": "300ms"}))
	clock := &fakeClock{t: time.Now()}
	var stop func()
	s.httpURL, s.grpcAddr, stop = runGatewayAt(t, s, clock)
	ctx := ctxFor(t, 2*time.Minute)

	var mu sync.Mutex
	var got []pushReceived
	fails := 2
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var task a2a.Task
		_ = json.NewDecoder(r.Body).Decode(&task)
		mu.Lock()
		defer mu.Unlock()
		p := pushReceived{state: task.Status.State, token: r.Header.Get("X-A2A-Notification-Token"), auth: r.Header.Get("Authorization"), status: http.StatusOK}
		if fails > 0 {
			fails--
			p.status = http.StatusServiceUnavailable
		}
		got = append(got, p)
		w.WriteHeader(p.status)
	}))
	defer recv.Close()

	c := a2aClients(t, s, "paced")["jsonrpc"]
	card, err := c.GetAgentCard(ctx)
	if err != nil || !card.Capabilities.PushNotifications {
		t.Fatalf("the card does not offer push notifications: %+v %v", card, err)
	}
	p := userText("push-session", "tell me when done")
	p.Config = &a2a.MessageSendConfig{Blocking: new(bool), PushConfig: &a2a.PushConfig{URL: recv.URL, Token: "tok",
		Auth: &a2a.PushAuthInfo{Schemes: []string{"Bearer"}, Credentials: "cred"}}}
	task := asTask(t)(c.SendMessage(ctx, p))

	delivered := func() []pushReceived {
		mu.Lock()
		defer mu.Unlock()
		return append([]pushReceived(nil), got...)
	}
	for {
		list := delivered()
		if n := len(list); n > 0 && list[n-1].state == a2a.TaskStateCompleted && list[n-1].status == http.StatusOK {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no completed notification delivered: %+v", delivered())
		case <-time.After(25 * time.Millisecond):
		}
	}
	list := delivered()
	if len(list) < 3 || list[0].state != list[1].state || list[1].state != list[2].state || list[2].status != http.StatusOK {
		t.Fatalf("the first notification was not retried until delivered: %+v", list)
	}
	seen := map[a2a.TaskState]bool{}
	for _, r := range list {
		if r.token != "tok" || r.auth != "Bearer cred" {
			t.Fatalf("a notification without the config's token and credentials: %+v", r)
		}
		if r.status == http.StatusOK {
			if seen[r.state] {
				t.Fatalf("state %s delivered twice: %+v", r.state, list)
			}
			seen[r.state] = true
		}
	}

	// The configs through the SDK client.
	cfg, err := c.GetTaskPushConfig(ctx, &a2a.GetTaskPushConfigParams{TaskID: task.ID})
	if err != nil || cfg.Config.URL != recv.URL || cfg.Config.Token != "tok" {
		t.Fatalf("GetTaskPushConfig = %+v, %v", cfg, err)
	}
	if _, err := c.SetTaskPushConfig(ctx, &a2a.TaskPushConfig{TaskID: task.ID, Config: a2a.PushConfig{ID: "bad", URL: "ftp://nowhere"}}); err == nil {
		t.Fatal("a config with an ftp URL was accepted")
	}
	if _, err := c.SetTaskPushConfig(ctx, &a2a.TaskPushConfig{TaskID: "no-such-task~0123456789abcdef", Config: a2a.PushConfig{URL: recv.URL}}); err == nil {
		t.Fatal("a config for a task that does not exist was accepted")
	}
	if _, err := c.SetTaskPushConfig(ctx, &a2a.TaskPushConfig{TaskID: task.ID, Config: a2a.PushConfig{ID: "second", URL: recv.URL + "/second"}}); err != nil {
		t.Fatal(err)
	}
	stop() // the configs live in State: a restarted gateway has them
	s.httpURL, s.grpcAddr, _ = runGatewayAt(t, s, clock)
	c = a2aClients(t, s, "paced")["jsonrpc"]
	all, err := c.ListTaskPushConfig(ctx, &a2a.ListTaskPushConfigParams{TaskID: task.ID})
	if err != nil || len(all) != 2 {
		t.Fatalf("ListTaskPushConfig after a restart = %+v, %v, want 2", all, err)
	}
	if err := c.DeleteTaskPushConfig(ctx, &a2a.DeleteTaskPushConfigParams{TaskID: task.ID, ConfigID: "second"}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTaskPushConfig(ctx, &a2a.DeleteTaskPushConfigParams{TaskID: task.ID, ConfigID: "second"}); err == nil {
		t.Fatal("deleting a deleted config succeeded")
	}
	if all, err := c.ListTaskPushConfig(ctx, &a2a.ListTaskPushConfigParams{TaskID: task.ID}); err != nil || len(all) != 1 {
		t.Fatalf("ListTaskPushConfig after the delete = %+v, %v", all, err)
	}
}
