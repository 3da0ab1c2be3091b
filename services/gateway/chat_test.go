package gateway_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// chatEvents posts body to /v1/chat and returns the AG-UI events of the
// stream.
func chatEvents(t *testing.T, s *stack, body string) []map[string]any {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxFor(t, 60*time.Second), http.MethodPost, s.httpURL+"/v1/chat", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("chat: HTTP %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var evs []map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func types(evs []map[string]any) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e["type"].(string))
	}
	return out
}

// A chat front end posts a message and reads the run as AG-UI events;
// an approval ends the stream with approval_required and a decision
// streams the rest.
func TestChatSSE(t *testing.T) {
	t.Parallel()
	// The chat gets the deltas of the call running when it starts
	// watching, from that call's start, but not those of a call that has
	// already finished (it gets the answer in one piece then): the delay
	// keeps the call running until the chat watches.
	s := startStack(t, stackOptions{}, scriptedAgent("writer", map[string]any{"text": "one two three", "delay": "2s"}), carefulAgent("careful"))
	evs := chatEvents(t, s, `{"agent": "writer", "message": "write", "session": "web-1"}`)
	ts := types(evs)
	if ts[0] != "RUN_STARTED" || ts[len(ts)-1] != "RUN_FINISHED" || evs[0]["threadId"] != "web-1" {
		t.Fatalf("events %v", ts)
	}
	var text strings.Builder
	deltas := 0
	for _, e := range evs {
		if e["type"] == "TEXT_MESSAGE_CONTENT" {
			deltas++
			text.WriteString(e["delta"].(string))
		}
	}
	if text.String() != "one two three" || deltas < 2 {
		t.Fatalf("text %q in %d deltas", text.String(), deltas)
	}

	evs = chatEvents(t, s, `{"agent": "careful", "message": "keep notes"}`)
	ts = types(evs)
	joined := strings.Join(ts, " ")
	if !strings.Contains(joined, "TOOL_CALL_START") && !strings.Contains(joined, "CUSTOM") {
		t.Fatalf("events %v", ts)
	}
	var custom map[string]any
	for _, e := range evs {
		if e["type"] == "CUSTOM" && e["name"] == "approval_required" {
			custom = e["value"].(map[string]any)
		}
	}
	if custom == nil {
		t.Fatalf("no approval_required event: %v", ts)
	}
	id := custom["workflow_id"].(string)
	evs = chatEvents(t, s, `{"decision": {"workflow_id": "`+id+`", "approved": true}}`)
	ts = types(evs)
	text.Reset()
	for _, e := range evs {
		if e["type"] == "TEXT_MESSAGE_CONTENT" {
			text.WriteString(e["delta"].(string))
		}
	}
	if ts[len(ts)-1] != "RUN_FINISHED" || !strings.Contains(text.String(), "The notes are written.") {
		t.Fatalf("after the decision: %v %q", ts, text.String())
	}

	resp, err := http.Post(s.httpURL+"/v1/chat", "application/json", strings.NewReader(`{"agent": "nobody", "message": "hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("an unknown agent: HTTP %d, want 404", resp.StatusCode)
	}
}
