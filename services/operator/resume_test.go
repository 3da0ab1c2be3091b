package operator

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// resumeFixture is a state of n tool turns, each with a result of size
// bytes of text, ending with a turn whose call waits.
func resumeFixture(n, size int) *resumeState {
	msgs := []provider.Message{{Role: provider.User, Parts: []provider.Part{{Text: "summarise the logs"}}}}
	for i := range n + 1 {
		id := fmt.Sprintf("call_%d", i)
		msgs = append(msgs, provider.Message{Role: provider.Assistant, Parts: []provider.Part{
			{Text: "looking"}, {ToolUse: &provider.ToolUse{ID: id, Name: "read", Input: json.RawMessage(`{"path":"log.txt"}`)}},
		}})
		if i < n {
			line := fmt.Sprintf("%d GET /api/items 200 12ms\n", i)
			msgs = append(msgs, provider.Message{Role: provider.User, Parts: []provider.Part{
				{ToolResult: &provider.ToolResult{ToolUseID: id, Content: strings.Repeat(line, size/len(line)+1)[:size]}},
			}})
		}
	}
	return &resumeState{KeyBase: "d-1", Turns: uint32(n + 1), Cost: "0.0123", Messages: toTokenMessages(msgs),
		Pending: []tokenPending{{ID: fmt.Sprintf("call_%d", n), Reason: reasonPolicy}}}
}

// TestResumeTokenRoundTrip: a token opens to the state sealed, including
// a tool input that is not valid JSON (the model may send anything).
func TestResumeTokenRoundTrip(t *testing.T) {
	k := newRandomResumeKey()
	st := resumeFixture(3, 2000)
	st.Messages[1].Parts[1].Use.Input = []byte(`{"path": 7`)
	token, err := k.seal(st)
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.open(token)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(st)
	b, _ := json.Marshal(got)
	if string(a) != string(b) {
		t.Fatalf("round trip changed the state:\n%s\n%s", a, b)
	}
	t.Logf("3 turns of 2000-byte results: token %d bytes", len(token))
}

// TestResumeTokenTooLarge: a state whose token would pass MaxResumeToken
// fails the invocation (FAILED_PRECONDITION, not retryable) instead of
// issuing a token nobody may send back.
func TestResumeTokenTooLarge(t *testing.T) {
	st := resumeFixture(1, 0)
	// Incompressible text: hex of a counter's hash-like sequence.
	var b strings.Builder
	for i := 0; b.Len() < 2*MaxResumeToken; i++ {
		fmt.Fprintf(&b, "%x", uint64(i)*0x9E3779B97F4A7C15)
	}
	st.Messages[2].Parts[0].Result.Content = b.String()
	_, err := newRandomResumeKey().seal(st)
	if !errors.Is(err, errs.NonRetryable) || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("err %v", err)
	}
}

// BenchmarkResumeToken seals and opens the token of a 5-turn invocation
// whose tool results are 4 KiB each.
func BenchmarkResumeToken(b *testing.B) {
	k := newRandomResumeKey()
	st := resumeFixture(5, 4096)
	token, _ := k.seal(st)
	b.ReportMetric(float64(len(token)), "token-bytes")
	b.Run("seal", func(b *testing.B) {
		for b.Loop() {
			if _, err := k.seal(st); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("open", func(b *testing.B) {
		for b.Loop() {
			if _, err := k.open(token); err != nil {
				b.Fatal(err)
			}
		}
	})
}
