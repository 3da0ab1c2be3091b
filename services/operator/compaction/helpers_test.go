package compaction

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/secbear/neuron/services/operator/provider"
)

func user(text string) provider.Message {
	return provider.Message{Role: provider.User, Parts: []provider.Part{{Text: text}}}
}

func asst(text string) provider.Message {
	return provider.Message{Role: provider.Assistant, Parts: []provider.Part{{Text: text}}}
}

// calls is an assistant message with tool calls, each "id:name".
func calls(idNames ...string) provider.Message {
	m := provider.Message{Role: provider.Assistant}
	for _, in := range idNames {
		id, name, _ := strings.Cut(in, ":")
		m.Parts = append(m.Parts, provider.Part{ToolUse: &provider.ToolUse{ID: id, Name: name, Input: json.RawMessage(`{"path":"` + id + `.txt"}`)}})
	}
	return m
}

// results is a user message with a result for each id.
func results(ids ...string) provider.Message {
	m := provider.Message{Role: provider.User}
	for _, id := range ids {
		m.Parts = append(m.Parts, provider.Part{ToolResult: &provider.ToolResult{ToolUseID: id, Content: "content of " + id}})
	}
	return m
}

// pad is a text of exactly n tokens' worth of bytes.
func pad(word string, n int) string {
	return word + strings.Repeat(".", n*BytesPerToken-len(word))
}

// deepCopy copies msgs and their parts, to check they were not modified.
func deepCopy(msgs []provider.Message) []provider.Message {
	out := make([]provider.Message, len(msgs))
	for i, m := range msgs {
		out[i] = provider.Message{Role: m.Role, Parts: slices.Clone(m.Parts)}
		for j, p := range out[i].Parts {
			if p.ToolUse != nil {
				u := *p.ToolUse
				u.Input = slices.Clone(u.Input)
				out[i].Parts[j].ToolUse = &u
			}
			if p.ToolResult != nil {
				r := *p.ToolResult
				out[i].Parts[j].ToolResult = &r
			}
		}
	}
	return out
}

// checkTail asserts the rules of a compacted list: it starts with a user
// message, and every tool call has its result after it and every result
// its call before it.
func checkTail(t *testing.T, out []provider.Message) {
	t.Helper()
	if len(out) == 0 {
		t.Fatal("empty output")
	}
	if !genuineUser(out[0]) {
		t.Errorf("output starts with %v, not a genuine user message", out[0])
	}
	uses, answered := map[string]int{}, map[string]bool{}
	for i, m := range out {
		for _, p := range m.Parts {
			if p.ToolUse != nil {
				uses[p.ToolUse.ID] = i
				answered[p.ToolUse.ID] = false
			}
			if p.ToolResult != nil {
				u, ok := uses[p.ToolResult.ToolUseID]
				if !ok || u >= i {
					t.Errorf("message %d: result for %s has no call before it", i, p.ToolResult.ToolUseID)
				}
				answered[p.ToolResult.ToolUseID] = true
			}
		}
	}
	for id, ok := range answered {
		if !ok {
			t.Errorf("call %s has no result in the output", id)
		}
	}
}

// history is a session of three invocations; 4 and 8 are the cut points,
// 8 starts the current invocation.
func history() []provider.Message {
	return []provider.Message{
		user(pad("first question about main.go", 100)), // 0
		calls("c1:read"),                 // 1
		results("c1"),                    // 2
		asst(pad("first answer", 20)),    // 3
		user(pad("second question", 30)), // 4
		calls("c2:read", "c3:grep"),      // 5
		results("c2", "c3"),              // 6
		asst(pad("second answer", 20)),   // 7
		user(pad("third question", 10)),  // 8
		calls("c4:write"),                // 9
		results("c4"),                    // 10
	}
}

const testSystem = "You are a careful assistant."

var testTools = []provider.ToolSpec{{Name: "read", Description: "Read a file.", InputSchema: json.RawMessage(`{"type":"object"}`)}}

// fake is a provider that records its requests.
type fake struct {
	resp    *provider.Response
	err     error
	block   bool          // wait for the context to end
	entered chan struct{} // closed on the first call, when set

	mu   sync.Mutex
	reqs []*provider.Request
	once sync.Once
}

func (f *fake) Name() string { return "fake" }

func (f *fake) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	if f.entered != nil {
		f.once.Do(func() { close(f.entered) })
	}
	if f.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return f.resp, f.err
}

func (f *fake) requests() []*provider.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}
