package compaction

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

func summaryResponse(text string) *provider.Response {
	return &provider.Response{
		Parts: []provider.Part{{Text: text}},
		Stop:  provider.StopEndTurn,
		Usage: provider.Usage{InputTokens: 700, OutputTokens: 40, CacheReadTokens: 3},
		Model: "summ-model-2025",
		Cost:  decimal.RequireFromString("0.0021"),
	}
}

// requestText is the text of a summary request's only message.
func requestText(t *testing.T, req *provider.Request) string {
	t.Helper()
	if len(req.Messages) != 1 || req.Messages[0].Role != provider.User || len(req.Messages[0].Parts) != 1 {
		t.Fatalf("summary request messages = %+v, want one user text", req.Messages)
	}
	return req.Messages[0].Parts[0].Text
}

func TestSummarize(t *testing.T) {
	h := history()
	const maxSummary = 50
	room := Estimate("", nil, []provider.Message{SummaryMessage("")}) + maxSummary
	est := func(i int) int { return Estimate(testSystem, testTools, h[i:]) }
	total, t4 := est(0), est(4)
	const reserve = 100
	window := func(limit int) Budget { return Budget{ContextWindow: limit + reserve, Reserve: reserve} }
	tests := []struct {
		name   string
		opts   []SummarizeOption
		b      Budget
		wantK  int // 0: no compaction
		tokens int // the summary request's MaxTokens
	}{
		{"unknown window", nil, Budget{Reserve: 10}, 0, 0},
		{"fits", nil, window(total), 0, 0},
		{"keeps two turns", []SummarizeOption{WithMaxSummaryTokens(maxSummary)}, window(total - 1), 4, maxSummary},
		{"two turns and the summary fit exactly", []SummarizeOption{WithMaxSummaryTokens(maxSummary)}, window(t4 + room), 4, maxSummary},
		{"keeps one turn when two would not fit with the summary", []SummarizeOption{WithMaxSummaryTokens(maxSummary)}, window(t4 + room - 1), 8, maxSummary},
		{"keep recent 1", []SummarizeOption{WithMaxSummaryTokens(maxSummary), WithKeepRecent(1)}, window(total - 1), 8, maxSummary},
		{"keep recent above the turns there are", []SummarizeOption{WithMaxSummaryTokens(maxSummary), WithKeepRecent(5)}, window(total - 1), 4, maxSummary},
		// A summary of up to 1024 tokens with two turns would not fit.
		{"zero options keep the defaults", []SummarizeOption{WithMaxSummaryTokens(0), WithKeepRecent(0)}, window(total - 1), 8, DefaultMaxSummaryTokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fake{resp: summaryResponse("  - main.go needs a fix\n")}
			orig := deepCopy(h)
			out, rep, err := Summarize(f, "summ-model", tt.opts...).Compact(context.Background(), testSystem, testTools, h, tt.b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(h, orig) {
				t.Fatal("input modified")
			}
			reqs := f.requests()
			if tt.wantK == 0 {
				if rep != nil || len(reqs) != 0 || &out[0] != &h[0] {
					t.Fatalf("report %+v, %d requests; want no compaction", rep, len(reqs))
				}
				return
			}
			if len(reqs) != 1 {
				t.Fatalf("%d summary requests, want 1", len(reqs))
			}
			req := reqs[0]
			if req.Model != "summ-model" || req.MaxTokens != tt.tokens || req.Tools != nil || req.OnText != nil {
				t.Errorf("request model %q, max tokens %d, tools %v; want summ-model, %d, none", req.Model, req.MaxTokens, req.Tools, tt.tokens)
			}
			for _, w := range []string{"facts", "decisions", "open tasks", "file names"} {
				if !strings.Contains(req.System, w) {
					t.Errorf("instruction lacks %q", w)
				}
			}
			text := requestText(t, req)
			if want := transcriptOpen + transcript(h[:tt.wantK], 1<<20) + transcriptClose; text != want {
				t.Errorf("request text =\n%s\nwant\n%s", text, want)
			}
			for i, m := range h {
				if m.Role != provider.User || !genuineUser(m) {
					continue
				}
				if in := strings.Contains(text, m.Parts[0].Text); in != (i < tt.wantK) {
					t.Errorf("message %d in the transcript: %v, want %v", i, in, i < tt.wantK)
				}
			}

			wantOut := append([]provider.Message{SummaryMessage("- main.go needs a fix")}, h[tt.wantK:]...)
			if !reflect.DeepEqual(out, wantOut) {
				t.Fatalf("out =\n%+v\nwant\n%+v", out, wantOut)
			}
			if out[0].Parts[0].Text != "[Summary of the earlier conversation]\n- main.go needs a fix" || !IsSummary(out[0]) {
				t.Errorf("summary message = %q", out[0].Parts[0].Text)
			}
			after := Estimate(testSystem, testTools, out)
			limit := tt.b.ContextWindow - tt.b.Reserve
			want := &Report{
				Strategy: "summarize", TokensBefore: total, TokensAfter: after,
				MessagesBefore: len(h), MessagesAfter: len(h) - tt.wantK + 1, Summarized: tt.wantK,
				OverBudget: after > limit,
				Model:      "summ-model-2025",
				Usage:      provider.Usage{InputTokens: 700, OutputTokens: 40, CacheReadTokens: 3},
				Cost:       decimal.RequireFromString("0.0021"),
			}
			if !reflect.DeepEqual(rep, want) {
				t.Errorf("report = %+v\nwant     %+v", rep, want)
			}
			checkTail(t, out[1:])
		})
	}
}

func TestSummarizeDefaults(t *testing.T) {
	h := history()
	h[0] = user(pad("a very long first question", 5000))
	room := Estimate("", nil, []provider.Message{SummaryMessage("")}) + DefaultMaxSummaryTokens
	t4 := Estimate("", nil, h[4:])
	for _, tt := range []struct {
		limit, wantK int
	}{
		{t4 + room, 4},     // two turns and a summary fit
		{t4 + room - 1, 8}, // they do not: one turn
	} {
		f := &fake{resp: summaryResponse("s")}
		_, rep, err := Summarize(f, "m").Compact(context.Background(), "", nil, h, Budget{ContextWindow: tt.limit})
		if err != nil || rep == nil || rep.Summarized != tt.wantK || f.requests()[0].MaxTokens != DefaultMaxSummaryTokens {
			t.Errorf("limit %d: report %+v, err %v; want %d summarized", tt.limit, rep, err, tt.wantK)
		}
	}
}

func TestSummarizeReportsRequestedModelWhenResponseHasNone(t *testing.T) {
	resp := summaryResponse("s")
	resp.Model = ""
	h := history()
	_, rep, err := Summarize(&fake{resp: resp}, "summ-model").Compact(context.Background(), "", nil, h, Budget{ContextWindow: 1})
	if err != nil || rep == nil || rep.Model != "summ-model" {
		t.Fatalf("report %+v, err %v; want model summ-model", rep, err)
	}
}

func TestSummarizeRolling(t *testing.T) {
	h := append([]provider.Message{SummaryMessage("- user wants main.go fixed")}, history()...)
	f := &fake{resp: summaryResponse("- main.go fixed; tests next")}
	out, rep, err := Summarize(f, "m", WithKeepRecent(1)).Compact(context.Background(), "", nil, h, Budget{ContextWindow: 1})
	if err != nil {
		t.Fatal(err)
	}
	text := requestText(t, f.requests()[0])
	if !strings.Contains(text, "User: [Summary of the earlier conversation]\n- user wants main.go fixed") {
		t.Errorf("the earlier summary is not in the transcript:\n%s", text)
	}
	if rep.Summarized != 9 || len(out) != 4 || !IsSummary(out[0]) || !reflect.DeepEqual(out[1:], h[9:]) || !rep.OverBudget {
		t.Errorf("report %+v, out %+v", rep, out)
	}
	if got := cutPoints(h); !reflect.DeepEqual(got, []int{1, 5, 9}) {
		t.Errorf("a summary message is a turn of its own: cut points %v", got)
	}
}

func TestSummarizeFallback(t *testing.T) {
	h := history()
	b := Budget{ContextWindow: Estimate("", nil, h[4:]) + 10, Reserve: 10}
	slid, slidRep, _ := SlidingWindow().Compact(context.Background(), "", nil, h, b)
	if slidRep == nil || slidRep.Dropped != 4 {
		t.Fatalf("bad fixture: %+v", slidRep)
	}
	apiErr := &provider.Error{Provider: "fake", Model: "m", Kind: errs.Retryable, HTTPStatus: 529, Message: "overloaded"}
	empty := summaryResponse(" \n")
	filtered := summaryResponse("partial")
	filtered.Stop = provider.StopContentFilter
	tests := []struct {
		name      string
		resp      *provider.Response
		err       error
		wantErr   string
		wantKind  *errs.Kind
		wantUsage bool
	}{
		{"provider error", nil, apiErr, "fake model m: HTTP 529: overloaded", errs.Retryable, false},
		{"no response", nil, nil, "fake model m: no response to the summary request", errs.NonRetryable, false},
		{"empty summary", empty, nil, "fake model m: the model returned an empty summary", errs.NonRetryable, true},
		{"content filter", filtered, nil, "fake model m: the summary was stopped by the provider's content filter", errs.NonRetryable, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			f := &fake{resp: tt.resp, err: tt.err}
			out, rep, err := Summarize(f, "m", WithLogger(log)).Compact(context.Background(), "", nil, h, b)
			if err != nil {
				t.Fatalf("err = %v, want a fallback", err)
			}
			if !reflect.DeepEqual(out, slid) {
				t.Errorf("out is not the sliding window's")
			}
			want := *slidRep
			want.Strategy = "summarize(fallback: sliding)"
			want.Err = rep.Err
			if tt.wantUsage {
				want.Model, want.Usage, want.Cost = tt.resp.Model, tt.resp.Usage, tt.resp.Cost
			}
			if !reflect.DeepEqual(rep, &want) {
				t.Errorf("report = %+v\nwant     %+v", rep, &want)
			}
			if rep.Err == nil || rep.Err.Error() != tt.wantErr || !errors.Is(rep.Err, tt.wantKind) {
				t.Errorf("Err = %v, want %q wrapping %v", rep.Err, tt.wantErr, tt.wantKind)
			}
			if !strings.Contains(logs.String(), "level=WARN msg=\"context summary failed; dropped the oldest messages instead\"") ||
				!strings.Contains(logs.String(), "dropped=4") {
				t.Errorf("log = %q", logs.String())
			}
		})
	}
}

func TestSummarizeContextEnds(t *testing.T) {
	h := history()
	b := Budget{ContextWindow: 1}

	t.Run("cancelled during the call", func(t *testing.T) {
		f := &fake{block: true, entered: make(chan struct{})}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-f.entered; cancel() }()
		out, rep, err := Summarize(f, "m").Compact(ctx, "", nil, h, b)
		if !errors.Is(err, context.Canceled) || out != nil || rep != nil {
			t.Fatalf("out %v, report %+v, err %v; want context.Canceled only", out, rep, err)
		}
		if err.Error() != "summarizing the 8 oldest messages: context canceled" {
			t.Errorf("err = %q", err)
		}
	})
	t.Run("deadline during the call", func(t *testing.T) {
		f := &fake{block: true}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		_, rep, err := Summarize(f, "m").Compact(ctx, "", nil, h, b)
		if !errors.Is(err, context.DeadlineExceeded) || rep != nil {
			t.Fatalf("report %+v, err %v; want context.DeadlineExceeded", rep, err)
		}
	})
	t.Run("cancelled before", func(t *testing.T) {
		f := &fake{resp: summaryResponse("s")}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _, err := Summarize(f, "m").Compact(ctx, "", nil, h, b)
		if !errors.Is(err, context.Canceled) || len(f.requests()) != 0 {
			t.Fatalf("err %v, %d requests; want context.Canceled and no call", err, len(f.requests()))
		}
	})
	t.Run("cancelled, nothing to do", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		out, rep, err := Summarize(&fake{}, "m").Compact(ctx, "", nil, h, Budget{})
		if err != nil || rep != nil || len(out) != len(h) {
			t.Fatalf("err %v, report %+v", err, rep)
		}
	})
	t.Run("provider error after the context ended is the context's", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		f := &fake{err: errors.New("connection reset"), entered: make(chan struct{})}
		p := providerFunc(func(c context.Context, r *provider.Request) (*provider.Response, error) {
			cancel()
			return f.Complete(c, r)
		})
		_, _, err := Summarize(p, "m").Compact(ctx, "", nil, h, b)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	})
}

type providerFunc func(context.Context, *provider.Request) (*provider.Response, error)

func (providerFunc) Name() string { return "func" }

func (f providerFunc) Complete(ctx context.Context, r *provider.Request) (*provider.Response, error) {
	return f(ctx, r)
}

func TestSummarizeLongPrefixFitsTheWindow(t *testing.T) {
	var h []provider.Message
	for range 200 {
		h = append(h, user(pad("question", 250)), asst(pad("answer", 250)))
	}
	h = append(h, user("now"))
	f := &fake{resp: summaryResponse("s")}
	b := Budget{ContextWindow: 8000, Reserve: 1000}
	out, rep, err := Summarize(f, "m", WithMaxSummaryTokens(500)).Compact(context.Background(), "", nil, h, b)
	if err != nil {
		t.Fatal(err)
	}
	req := f.requests()[0]
	if got := Estimate(req.System, nil, req.Messages); got > b.ContextWindow-1000 {
		t.Errorf("summary request estimate %d exceeds the window less its output", got)
	}
	if text := requestText(t, req); !strings.Contains(text, "entries left out ...]") {
		t.Error("no entries were left out")
	}
	if rep.Summarized != 398 || len(out) != 4 || rep.OverBudget {
		t.Errorf("report %+v", rep)
	}
}

func TestStrategiesAreSafeForConcurrentUse(t *testing.T) {
	h := history()
	f := &fake{resp: summaryResponse("s")}
	strategies := []Strategy{None(), SlidingWindow(), Summarize(f, "m")}
	b := Budget{ContextWindow: 200}
	var want [][]provider.Message
	for _, s := range strategies {
		out, _, _ := s.Compact(context.Background(), testSystem, testTools, h, b)
		want = append(want, out)
	}
	var wg sync.WaitGroup
	for range 8 {
		for i, s := range strategies {
			wg.Go(func() {
				out, _, err := s.Compact(context.Background(), testSystem, testTools, h, b)
				if err != nil || !reflect.DeepEqual(out, want[i]) {
					t.Errorf("%s: concurrent result differs (err %v)", s.Name(), err)
				}
			})
		}
	}
	wg.Wait()
}

func TestSummarizeNilProviderPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	Summarize(nil, "m")
}
