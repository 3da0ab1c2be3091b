package compaction

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func TestParse(t *testing.T) {
	p := &fake{}
	tests := []struct {
		name    string
		p       provider.Provider
		want    string
		wantErr string
	}{
		{"none", nil, NameNone, ""},
		{"", nil, NameNone, ""},
		{"sliding", nil, NameSliding, ""},
		{"summarize", p, NameSummarize, ""},
		{"summarize", nil, "", `context strategy "summarize" needs a model to write summaries, and none is configured: invalid argument`},
		{"window", nil, "", `unknown context strategy "window": use one of none, sliding, summarize: invalid argument`},
		{"Sliding", nil, "", `unknown context strategy "Sliding": use one of none, sliding, summarize: invalid argument`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.name, tt.p, "m")
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr || !errors.Is(err, errs.InvalidArgument) {
					t.Fatalf("err = %v, want %q wrapping InvalidArgument", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Name() != tt.want {
				t.Errorf("Name = %q, want %q", s.Name(), tt.want)
			}
		})
	}
	if got := Names(); !reflect.DeepEqual(got, []string{"none", "sliding", "summarize"}) {
		t.Errorf("Names = %v", got)
	}
}

func TestNoneNeverChanges(t *testing.T) {
	msgs := history()
	orig := deepCopy(msgs)
	for _, b := range []Budget{{}, {ContextWindow: 1}, {ContextWindow: 1 << 20}, {ContextWindow: 10, Reserve: 100}} {
		out, rep, err := None().Compact(context.Background(), testSystem, testTools, msgs, b)
		if err != nil || rep != nil || len(out) != len(msgs) || &out[0] != &msgs[0] {
			t.Errorf("budget %+v: got %d messages, report %v, err %v; want msgs unchanged", b, len(out), rep, err)
		}
	}
	if !reflect.DeepEqual(msgs, orig) {
		t.Error("input modified")
	}
}

func TestCutPoints(t *testing.T) {
	mixed := results("c1")
	mixed.Parts = append(mixed.Parts, provider.Part{Text: "and also check b.txt"})
	tests := []struct {
		name string
		msgs []provider.Message
		want []int
	}{
		{"empty", nil, nil},
		{"single user", []provider.Message{user("a")}, nil},
		{"history", history(), []int{4, 8}},
		{"user turns without tools", []provider.Message{user("a"), asst("b"), user("c"), asst("d"), user("e")}, []int{2, 4}},
		{"consecutive users", []provider.Message{user("a"), user("b"), asst("c")}, []int{1}},
		{"empty user message is not genuine", []provider.Message{user("a"), asst("b"), {Role: provider.User}, asst("c"), user("d")}, []int{4}},
		{"text beside a result is genuine but would orphan the result",
			[]provider.Message{user("a"), calls("c1:read"), mixed, asst("b"), user("c")}, []int{4}},
		{"ids repeat across invocations", []provider.Message{
			user("a"), calls("call_0_0:read"), results("call_0_0"), asst("b"),
			user("c"), calls("call_0_0:read"), results("call_0_0"), asst("d"),
			user("e"),
		}, []int{4, 8}},
		{"a user message inside an unanswered span is still no cut", []provider.Message{
			user("a"), calls("c1:read"), user("interjection"), results("c1"), asst("b"), user("c"),
		}, []int{5}},
		{"orphan result is ignored", []provider.Message{user("a"), results("zz"), asst("b"), user("c")}, []int{3}},
		{"pending call at the end", []provider.Message{user("a"), asst("b"), user("c"), calls("c9:read")}, []int{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cutPoints(tt.msgs); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("cutPoints = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSlidingWindow(t *testing.T) {
	h := history()
	est := func(i int) int { return Estimate(testSystem, testTools, h[i:]) }
	total, t4, t8 := est(0), est(4), est(8)
	if !(total > t4 && t4 > t8) {
		t.Fatalf("bad fixture: %d %d %d", total, t4, t8)
	}
	const reserve = 1000
	window := func(limit int) Budget { return Budget{ContextWindow: limit + reserve, Reserve: reserve} }
	tests := []struct {
		name string
		msgs []provider.Message
		b    Budget
		want *Report // nil: unchanged
	}{
		{"unknown window never compacts", h, Budget{ContextWindow: 0, Reserve: 10}, nil},
		{"negative window never compacts", h, Budget{ContextWindow: -5}, nil},
		{"fits exactly", h, window(total), nil},
		{"one token over drops the oldest turn", h, window(total - 1),
			&Report{Strategy: "sliding", TokensBefore: total, TokensAfter: t4, MessagesBefore: 11, MessagesAfter: 7, Dropped: 4}},
		{"second turn fits exactly", h, window(t4),
			&Report{Strategy: "sliding", TokensBefore: total, TokensAfter: t4, MessagesBefore: 11, MessagesAfter: 7, Dropped: 4}},
		{"only the current turn fits", h, window(t4 - 1),
			&Report{Strategy: "sliding", TokensBefore: total, TokensAfter: t8, MessagesBefore: 11, MessagesAfter: 3, Dropped: 8}},
		{"current turn fits exactly", h, window(t8),
			&Report{Strategy: "sliding", TokensBefore: total, TokensAfter: t8, MessagesBefore: 11, MessagesAfter: 3, Dropped: 8}},
		{"current turn over budget is kept", h, window(t8 - 1),
			&Report{Strategy: "sliding", TokensBefore: total, TokensAfter: t8, MessagesBefore: 11, MessagesAfter: 3, Dropped: 8, OverBudget: true}},
		{"reserve above the window keeps the current turn", h, Budget{ContextWindow: 10, Reserve: 20},
			&Report{Strategy: "sliding", TokensBefore: total, TokensAfter: t8, MessagesBefore: 11, MessagesAfter: 3, Dropped: 8, OverBudget: true}},
		{"no cut point: unchanged even over budget", h[8:], window(1), nil},
		{"current turn alone, starting with results of an earlier call", h[2:4], window(1), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := deepCopy(tt.msgs)
			out, rep, err := SlidingWindow().Compact(context.Background(), testSystem, testTools, tt.msgs, tt.b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(tt.msgs, orig) {
				t.Fatal("input modified")
			}
			if tt.want == nil {
				if rep != nil || len(out) != len(tt.msgs) || (len(out) > 0 && &out[0] != &tt.msgs[0]) {
					t.Fatalf("got report %+v and %d messages, want msgs unchanged", rep, len(out))
				}
				return
			}
			if !reflect.DeepEqual(rep, tt.want) {
				t.Fatalf("report = %+v\nwant     %+v", rep, tt.want)
			}
			if !reflect.DeepEqual(out, tt.msgs[rep.Dropped:]) {
				t.Fatalf("out is not the tail after %d messages", rep.Dropped)
			}
			if &out[0] == &tt.msgs[rep.Dropped] {
				t.Error("out shares its backing array with msgs")
			}
			if got := Estimate(testSystem, testTools, out); got != rep.TokensAfter {
				t.Errorf("TokensAfter = %d, Estimate(out) = %d", rep.TokensAfter, got)
			}
			checkTail(t, out)
		})
	}
}

// TestSlidingWindowKeepsPairs slides over every budget of a history
// with tool calls, including ids repeated across invocations, and checks
// that no call is ever separated from its result.
func TestSlidingWindowKeepsPairs(t *testing.T) {
	mixed := results("call_0_1")
	mixed.Parts = append(mixed.Parts, provider.Part{Text: "also look at c.txt"})
	h := []provider.Message{
		user(pad("one", 50)), calls("call_0_0:read", "call_0_1:grep"), results("call_0_0", "call_0_1"), asst("done one"),
		user(pad("two", 40)), calls("call_0_0:read"), results("call_0_0"), calls("call_1_0:read", "call_1_1:list"), results("call_1_1", "call_1_0"), asst("done two"),
		user(pad("three", 30)), calls("call_0_0:read", "call_0_1:read"), results("call_0_0"), asst("hm"), results("call_0_1"), asst("done three"),
		user(pad("four", 20)), calls("call_0_0:read", "call_0_1:read"), results("call_0_0"), mixed, asst("done four"),
		user(pad("five", 10)), calls("call_0_0:read"), results("call_0_0"),
	}
	wantCuts := []int{4, 10, 16, 21}
	if got := cutPoints(h); !reflect.DeepEqual(got, wantCuts) {
		t.Fatalf("cutPoints = %v, want %v", got, wantCuts)
	}
	total := Estimate("", nil, h)
	seen := map[int]bool{}
	for limit := total + 1; limit >= 0; limit-- {
		out, rep, _ := SlidingWindow().Compact(context.Background(), "", nil, h, Budget{ContextWindow: limit + 1, Reserve: 1})
		if rep == nil {
			if limit < total {
				t.Fatalf("limit %d: no compaction of %d tokens", limit, total)
			}
			continue
		}
		seen[rep.Dropped] = true
		checkTail(t, out)
		if !reflect.DeepEqual(out, h[rep.Dropped:]) {
			t.Fatalf("limit %d: out is not the tail after %d", limit, rep.Dropped)
		}
		// The oldest are dropped first: the kept tail is the longest that fits.
		for _, c := range wantCuts {
			if c < rep.Dropped && Estimate("", nil, h[c:]) <= limit {
				t.Fatalf("limit %d: dropped %d, but the tail from %d fits", limit, rep.Dropped, c)
			}
		}
		if rep.OverBudget != (rep.TokensAfter > limit) || (rep.OverBudget && rep.Dropped != 21) {
			t.Fatalf("limit %d: %+v", limit, rep)
		}
	}
	for _, c := range wantCuts {
		if !seen[c] {
			t.Errorf("never cut at %d", c)
		}
	}
}
