package compaction

import (
	"encoding/json"
	"testing"

	"github.com/secbear/neuron/services/operator/provider"
)

func TestEstimate(t *testing.T) {
	img := provider.Message{Role: provider.User, Parts: []provider.Part{{Image: &provider.Image{Data: make([]byte, 100000), MediaType: "image/png"}}}}
	urlImg := provider.Message{Role: provider.User, Parts: []provider.Part{{Text: "see"}, {Image: &provider.Image{URL: "https://example.com/a.png"}}}}
	use := provider.Message{Role: provider.Assistant, Parts: []provider.Part{{ToolUse: &provider.ToolUse{ID: "c1", Name: "read", Input: json.RawMessage(`{"path":"a"}`)}}}}
	res := provider.Message{Role: provider.User, Parts: []provider.Part{{ToolResult: &provider.ToolResult{ToolUseID: "c1", Content: "xyz", IsError: true}}}}
	tools := []provider.ToolSpec{{Name: "read", Description: "Read a file.", InputSchema: json.RawMessage(`{"type":"object"}`)}} // 4+12+17 bytes
	tests := []struct {
		name   string
		system string
		tools  []provider.ToolSpec
		msgs   []provider.Message
		want   int
	}{
		{"empty", "", nil, nil, 0},
		{"system 4 bytes", "abcd", nil, nil, 1},
		{"system 5 bytes rounds up", "abcde", nil, nil, 2},
		{"tool spec", "", tools, nil, 9},                                         // 33 bytes
		{"empty message", "", nil, []provider.Message{{Role: provider.User}}, 4}, // framing only
		{"text", "", nil, []provider.Message{user("hello")}, 2 + 4},
		{"multibyte counts bytes", "", nil, []provider.Message{user("日本")}, 2 + 4}, // 6 bytes
		{"tool use", "", nil, []provider.Message{use}, 5 + 4},                      // 2+4+12 bytes
		{"tool result", "", nil, []provider.Message{res}, 2 + 4},                   // 2+3 bytes
		{"inline image is fixed", "", nil, []provider.Message{img}, ImageTokens + 4},
		{"url image is fixed", "", nil, []provider.Message{urlImg}, 1 + ImageTokens + 4},
		// 4 + 33 + 5 + 18 + 5 + 3 = 68 bytes = 17 tokens; 5 messages; 2 images.
		{"all together", "abcd", tools, []provider.Message{user("hello"), use, res, img, urlImg}, 17 + 5*4 + 2*ImageTokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 3 { // deterministic
				if got := Estimate(tt.system, tt.tools, tt.msgs); got != tt.want {
					t.Fatalf("Estimate = %d, want %d", got, tt.want)
				}
			}
		})
	}
}

func TestEstimatorTailMatchesEstimate(t *testing.T) {
	msgs := history()
	e := newEstimator(testSystem, testTools, msgs)
	for i := 0; i <= len(msgs); i++ {
		if got, want := e.tail(i), Estimate(testSystem, testTools, msgs[i:]); got != want {
			t.Errorf("tail(%d) = %d, want %d", i, got, want)
		}
	}
}
