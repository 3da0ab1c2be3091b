package openairesponses

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/secbear/neuron/internal/httpfake"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// countingAPI answers call n with response "resp_<n+1>" holding the text
// "answer <n+1>".
func countingAPI(t *testing.T) *httpfake.Server {
	return newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		n := httpfake.Index(r)
		httpfake.JSON(200, textResponse(fmt.Sprintf("resp_%d", n+1), fmt.Sprintf("answer %d", n+1)))(w, r)
	})
}

func userItem(text string) string {
	return fmt.Sprintf(`{"type":"message","role":"user","content":[{"type":"input_text","text":%q}]}`, text)
}

func assistantItem(text string) string {
	return fmt.Sprintf(`{"type":"message","role":"assistant","content":[{"type":"output_text","text":%q,"annotations":[]}]}`, text)
}

// assertCall checks what a call sent for chaining: previous_response_id
// (absent when ""), store, and the input items.
func assertCall(t *testing.T, f *httpfake.Server, i int, previous string, store bool, input ...string) {
	t.Helper()
	body := f.Nth(t, i).JSON(t)
	got, has := body["previous_response_id"]
	switch {
	case previous == "" && has:
		t.Errorf("call %d: previous_response_id %v, want none", i, got)
	case previous != "" && got != previous:
		t.Errorf("call %d: previous_response_id %v, want %q", i, got, previous)
	}
	if body["store"] != store {
		t.Errorf("call %d: store %v, want %v", i, body["store"], store)
	}
	httpfake.AssertJSON(t, fmt.Sprintf("call %d input", i), body["input"], "["+join(input)+"]")
}

func join(items []string) string {
	out := ""
	for i, s := range items {
		if i > 0 {
			out += ","
		}
		out += s
	}
	return out
}

func complete(t *testing.T, p *Provider, session string, msgs []provider.Message) *provider.Response {
	t.Helper()
	resp, err := p.Complete(context.Background(), &provider.Request{
		System:    "Be brief.",
		SessionID: session,
		Messages:  msgs,
		Tools:     []provider.ToolSpec{{Name: "read", InputSchema: json.RawMessage(`{"type":"object"}`)}},
	})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return resp
}

func TestChainingSendsOnlyNewItems(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		n := httpfake.Index(r)
		if n == 0 {
			httpfake.JSON(200, responseBody("resp_1", "completed", "",
				"["+reasoningItem+","+functionCallItem("fc_1", "call_1", "read", `{"path":"a.txt"}`)+"]", ""))(w, r)
			return
		}
		httpfake.JSON(200, textResponse(fmt.Sprintf("resp_%d", n+1), fmt.Sprintf("answer %d", n+1)))(w, r)
	})
	p := newTestProvider(t, f)
	msgs := []provider.Message{userText("Read a.txt")}
	r1 := complete(t, p, "s1", msgs)
	assertCall(t, f, 0, "", true, userItem("Read a.txt"))

	msgs = append(slices.Clone(msgs), assistantOf(r1), provider.Message{Role: provider.User, Parts: []provider.Part{
		{ToolResult: &provider.ToolResult{ToolUseID: "call_1", Content: "hello"}},
	}})
	r2 := complete(t, p, "s1", msgs)
	assertCall(t, f, 1, "resp_1", true, `{"type":"function_call_output","call_id":"call_1","output":"hello"}`)

	msgs = append(slices.Clone(msgs), assistantOf(r2), userText("Thanks. And b.txt?"))
	complete(t, p, "s1", msgs)
	assertCall(t, f, 2, "resp_2", true, userItem("Thanks. And b.txt?"))

	// Instructions and tools are not carried over by the API: every call
	// sends them.
	for i := range 3 {
		body := f.Nth(t, i).JSON(t)
		if body["instructions"] != "Be brief." || len(body["tools"].([]any)) != 1 {
			t.Errorf("call %d: instructions %v tools %v", i, body["instructions"], body["tools"])
		}
	}
}

func TestChainingDivergedHistory(t *testing.T) {
	for _, tc := range []struct {
		name string
		// second builds the second call's messages from the first call's
		// messages and response.
		second    func(first []provider.Message, r *provider.Response) []provider.Message
		wantInput []string
	}{
		{"edited first message",
			func(first []provider.Message, r *provider.Response) []provider.Message {
				return []provider.Message{userText("Hello, edited"), assistantOf(r), userText("next")}
			},
			[]string{userItem("Hello, edited"), assistantItem("answer 1"), userItem("next")}},
		{"edited assistant message",
			func(first []provider.Message, r *provider.Response) []provider.Message {
				return []provider.Message{first[0], {Role: provider.Assistant, Parts: []provider.Part{textPart("answer 1, trimmed")}}, userText("next")}
			},
			[]string{userItem("Hello"), assistantItem("answer 1, trimmed"), userItem("next")}},
		{"truncated history",
			func(first []provider.Message, r *provider.Response) []provider.Message {
				return []provider.Message{assistantOf(r), userText("next")}
			},
			[]string{assistantItem("answer 1"), userItem("next")}},
		{"no new message",
			func(first []provider.Message, r *provider.Response) []provider.Message {
				return []provider.Message{first[0], assistantOf(r)}
			},
			[]string{userItem("Hello"), assistantItem("answer 1")}},
		{"new message without content",
			func(first []provider.Message, r *provider.Response) []provider.Message {
				return []provider.Message{first[0], assistantOf(r), userText("")}
			},
			[]string{userItem("Hello"), assistantItem("answer 1")}},
		{"assistant message missing",
			func(first []provider.Message, r *provider.Response) []provider.Message {
				return []provider.Message{first[0], userText("next")}
			},
			[]string{userItem("Hello"), userItem("next")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := countingAPI(t)
			p := newTestProvider(t, f)
			first := []provider.Message{userText("Hello")}
			r1 := complete(t, p, "s1", first)
			second := tc.second(first, r1)
			r2 := complete(t, p, "s1", second)
			assertCall(t, f, 1, "", true, tc.wantInput...)

			// The diverged call started a new chain.
			third := append(slices.Clone(second), assistantOf(r2), userText("third"))
			complete(t, p, "s1", third)
			assertCall(t, f, 2, "resp_2", true, userItem("third"))
		})
	}
}

func TestChainingPreviousNotFound(t *testing.T) {
	notFound := `{"error":{"message":"Previous response with id 'resp_1' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`
	event := func(ev string) http.HandlerFunc { return httpfake.SSE(sseBody(append(created(), ev)...)) }
	for _, tc := range []struct {
		name      string
		fail      http.HandlerFunc
		streaming bool
	}{
		{"code", httpfake.JSON(400, notFound), false},
		{"404", httpfake.JSON(404, `{"error":{"message":"Previous response with id 'resp_1' not found.","type":"invalid_request_error","param":null,"code":null}}`), false},
		{"code, streaming", httpfake.JSON(400, notFound), true},
		{"error event", event(`{"type":"error","sequence_number":2,"code":"previous_response_not_found","message":"Previous response with id 'resp_1' not found.","param":"previous_response_id"}`), true},
		{"nested error event", event(`{"type":"error","sequence_number":2,"error":{"type":"invalid_request_error","code":"previous_response_not_found","message":"Previous response with id 'resp_1' not found.","param":"previous_response_id"}}`), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
				n := httpfake.Index(r)
				var body map[string]any
				_ = json.NewDecoder(r.Body).Decode(&body) // newFakeAPI checks it
				if n == 1 {
					tc.fail(w, r)
					return
				}
				id, text := fmt.Sprintf("resp_%d", n+1), fmt.Sprintf("answer %d", n+1)
				if body["stream"] == true {
					httpfake.SSE(sseBody(append(created(),
						`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
						textDelta(3, 0, "msg_1", text),
						fmt.Sprintf(`{"type":"response.completed","sequence_number":4,"response":%s}`, textResponse(id, text)))...))(w, r)
					return
				}
				httpfake.JSON(200, textResponse(id, text))(w, r)
			})
			p := newTestProvider(t, f)
			var chunks []string
			call := func(msgs []provider.Message) *provider.Response {
				req := &provider.Request{SessionID: "s1", Messages: msgs}
				if tc.streaming {
					req.OnText = func(s string) { chunks = append(chunks, s) }
				}
				resp, err := p.Complete(context.Background(), req)
				if err != nil {
					t.Fatalf("Complete: %v", err)
				}
				return resp
			}
			msgs := []provider.Message{userText("one")}
			r1 := call(msgs)
			msgs = append(msgs, assistantOf(r1), userText("two"))
			r2 := call(msgs)
			if r2.Text() != "answer 3" {
				t.Errorf("second call answered %q, want the fallback's answer 3", r2.Text())
			}
			if f.Count() != 3 {
				t.Fatalf("the API got %d calls, want 3", f.Count())
			}
			assertCall(t, f, 1, "resp_1", true, userItem("two"))
			assertCall(t, f, 2, "", true, userItem("one"), assistantItem("answer 1"), userItem("two"))

			// The session continues from the fallback's response.
			msgs = append(msgs, assistantOf(r2), userText("three"))
			call(msgs)
			assertCall(t, f, 3, "resp_3", true, userItem("three"))
			if tc.streaming && !slices.Equal(chunks, []string{"answer 1", "answer 3", "answer 4"}) {
				t.Errorf("OnText chunks %q", chunks)
			}
		})
	}
}

func TestChainingOtherErrorsAreNotRetried(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		n := httpfake.Index(r)
		if n == 1 {
			httpfake.JSON(500, `{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`)(w, r)
			return
		}
		httpfake.JSON(200, textResponse(fmt.Sprintf("resp_%d", n+1), fmt.Sprintf("answer %d", n+1)))(w, r)
	})
	p := newTestProvider(t, f)
	msgs := []provider.Message{userText("one")}
	r1 := complete(t, p, "s1", msgs)
	msgs = append(msgs, assistantOf(r1), userText("two"))
	_, err := p.Complete(context.Background(), &provider.Request{SessionID: "s1", Messages: msgs})
	providerErr(t, err, errs.Retryable, 500)
	if f.Count() != 2 {
		t.Fatalf("the API got %d calls, want 2", f.Count())
	}
	// The chain survives the failure: the caller's retry chains again.
	complete(t, p, "s1", msgs)
	assertCall(t, f, 2, "resp_1", true, userItem("two"))
}

func TestChainingSessionsDoNotMix(t *testing.T) {
	f := countingAPI(t)
	p := newTestProvider(t, f)
	// Both sessions start with the same message.
	a := []provider.Message{userText("hi")}
	b := []provider.Message{userText("hi")}
	ra := complete(t, p, "session-a", a) // resp_1
	rb := complete(t, p, "session-b", b) // resp_2
	a = append(a, assistantOf(ra), userText("a2"))
	b = append(b, assistantOf(rb), userText("b2"))
	complete(t, p, "session-b", b) // resp_3
	complete(t, p, "session-a", a) // resp_4
	assertCall(t, f, 2, "resp_2", true, userItem("b2"))
	assertCall(t, f, 3, "resp_1", true, userItem("a2"))

	// Session b's history sent under session c starts no chain there.
	complete(t, p, "session-c", b)
	assertCall(t, f, 4, "", true, userItem("hi"), assistantItem("answer 2"), userItem("b2"))
}

func TestChainingDisabled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		disable bool
		session string
	}{
		{"disabled", true, "s1"},
		{"no session", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := countingAPI(t)
			p := newTestProvider(t, f, func(c *Config) { c.DisableChain = tc.disable })
			msgs := []provider.Message{userText("one")}
			r1 := complete(t, p, tc.session, msgs)
			msgs = append(msgs, assistantOf(r1), userText("two"))
			complete(t, p, tc.session, msgs)
			assertCall(t, f, 0, "", false, userItem("one"))
			assertCall(t, f, 1, "", false, userItem("one"), assistantItem("answer 1"), userItem("two"))
		})
	}
}

func TestChainingEviction(t *testing.T) {
	f := countingAPI(t)
	p := newTestProvider(t, f, func(c *Config) { c.MaxSessions = 2 })
	hist := map[string][]provider.Message{}
	turn := func(session, text string) {
		hist[session] = append(hist[session], userText(text))
		r := complete(t, p, session, hist[session])
		hist[session] = append(hist[session], assistantOf(r))
	}
	turn("a", "a1") // resp_1
	turn("b", "b1") // resp_2
	turn("c", "c1") // resp_3, evicts a
	turn("a", "a2") // resp_4, evicts b
	turn("c", "c2") // resp_5
	assertCall(t, f, 3, "", true, userItem("a1"), assistantItem("answer 1"), userItem("a2"))
	assertCall(t, f, 4, "resp_3", true, userItem("c2"))
	if n := p.sessions.len(); n != 2 {
		t.Errorf("%d sessions remembered, want 2", n)
	}
}

func TestChainingConcurrent(t *testing.T) {
	const sessions, turns = 8, 5
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body) // newFakeAPI checks it
		// The id names the last user text, e.g. resp_s3-t2.
		input, _ := body["input"].([]any)
		last, _ := input[len(input)-1].(map[string]any)
		content, _ := last["content"].([]any)
		part, _ := content[0].(map[string]any)
		marker, _ := part["text"].(string)
		httpfake.JSON(200, textResponse("resp_"+marker, "answer to "+marker))(w, r)
	})
	p := newTestProvider(t, f)
	var wg sync.WaitGroup
	for s := range sessions {
		wg.Go(func() {
			session := fmt.Sprintf("s%d", s)
			var msgs []provider.Message
			for turn := range turns {
				msgs = append(msgs, userText(fmt.Sprintf("s%d-t%d", s, turn)))
				resp, err := p.Complete(context.Background(), &provider.Request{SessionID: session, Messages: msgs})
				if err != nil {
					t.Errorf("%s turn %d: %v", session, turn, err)
					return
				}
				msgs = append(msgs, assistantOf(resp))
			}
		})
	}
	wg.Wait()
	if f.Count() != sessions*turns {
		t.Fatalf("the API got %d calls, want %d", f.Count(), sessions*turns)
	}
	for i := range f.Count() {
		body := f.Nth(t, i).JSON(t)
		input := body["input"].([]any)
		last := input[len(input)-1].(map[string]any)
		marker := last["content"].([]any)[0].(map[string]any)["text"].(string)
		var s, turn int
		if _, err := fmt.Sscanf(marker, "s%d-t%d", &s, &turn); err != nil {
			t.Fatalf("call %d: marker %q: %v", i, marker, err)
		}
		if turn == 0 {
			if _, has := body["previous_response_id"]; has || len(input) != 1 {
				t.Errorf("%s: previous_response_id %v, %d items; want none, 1", marker, body["previous_response_id"], len(input))
			}
			continue
		}
		if want := fmt.Sprintf("resp_s%d-t%d", s, turn-1); body["previous_response_id"] != want || len(input) != 1 {
			t.Errorf("%s: previous_response_id %v, %d items; want %s, 1", marker, body["previous_response_id"], len(input), want)
		}
	}
}

func TestSessionsLRU(t *testing.T) {
	s := newSessions(2)
	s.put("a", chain{responseID: "r1"})
	s.put("b", chain{responseID: "r2"})
	if c, ok := s.get("a"); !ok || c.responseID != "r1" { // a is now the most recent
		t.Fatalf("get a = %+v, %v", c, ok)
	}
	s.put("c", chain{responseID: "r3"}) // evicts b
	if _, ok := s.get("b"); ok {
		t.Error("b survived eviction")
	}
	s.put("a", chain{responseID: "r4"})
	if c, _ := s.get("a"); c.responseID != "r4" {
		t.Errorf("a = %+v, want r4", c)
	}
	s.drop("a")
	if _, ok := s.get("a"); ok || s.len() != 1 {
		t.Errorf("after drop: a present %v, len %d", ok, s.len())
	}
}

func TestPrefixHash(t *testing.T) {
	base := []provider.Message{
		userText("ab"),
		{Role: provider.Assistant, Parts: []provider.Part{textPart("c"), toolPart("id", "n", `{}`)}},
		{Role: provider.User, Parts: []provider.Part{{ToolResult: &provider.ToolResult{ToolUseID: "id", Content: "x"}}}},
	}
	variants := map[string][]provider.Message{
		"split text":  {userText("a"), userText("b"), base[1], base[2]},
		"moved text":  {userText("a"), {Role: provider.Assistant, Parts: []provider.Part{textPart("bc"), toolPart("id", "n", `{}`)}}, base[2]},
		"role":        {{Role: provider.Assistant, Parts: base[0].Parts}, base[1], base[2]},
		"is error":    {base[0], base[1], {Role: provider.User, Parts: []provider.Part{{ToolResult: &provider.ToolResult{ToolUseID: "id", Content: "x", IsError: true}}}}},
		"tool input":  {base[0], {Role: provider.Assistant, Parts: []provider.Part{textPart("c"), toolPart("id", "n", `{ }`)}}, base[2]},
		"image":       {{Role: provider.User, Parts: []provider.Part{{Image: &provider.Image{URL: "ab"}}}}, base[1], base[2]},
		"fewer parts": {base[0], {Role: provider.Assistant, Parts: base[1].Parts[:1]}, base[2]},
	}
	want := prefixHash(base)
	if got := prefixHash(base[:1], base[1:]); got != want {
		t.Error("hash depends on how the list is split")
	}
	for name, v := range variants {
		if prefixHash(v) == want {
			t.Errorf("%s: same hash as the original", name)
		}
	}
}

func TestChainingNoFallbackAfterText(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		n := httpfake.Index(r)
		if n == 1 {
			httpfake.SSE(sseBody(append(created(),
				`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
				textDelta(3, 0, "msg_1", "partial"),
				`{"type":"error","sequence_number":4,"code":"previous_response_not_found","message":"Previous response with id 'resp_1' not found.","param":"previous_response_id"}`)...))(w, r)
			return
		}
		httpfake.JSON(200, textResponse(fmt.Sprintf("resp_%d", n+1), "answer"))(w, r)
	})
	p := newTestProvider(t, f)
	msgs := []provider.Message{userText("one")}
	r1 := complete(t, p, "s1", msgs)
	msgs = append(msgs, assistantOf(r1), userText("two"))
	_, err := p.Complete(context.Background(), &provider.Request{SessionID: "s1", Messages: msgs, OnText: func(string) {}})
	pe := providerErr(t, err, errs.NonRetryable, 0)
	if pe.Message != "previous_response_not_found: Previous response with id 'resp_1' not found." {
		t.Errorf("message %q", pe.Message)
	}
	if f.Count() != 2 {
		t.Errorf("the API got %d calls, want 2: no fallback once text reached OnText", f.Count())
	}
}
