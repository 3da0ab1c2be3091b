package benchmark

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/benchkit"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/provider/openai"
	"github.com/secbear/neuron/services/operator/tool"
)

const model = "mock-1"

// mock starts the OpenAI-compatible mock model in its own process
// (internal/benchkit/mockmodel), so that its CPU is not in the
// measurement: one call of the noop tool, then (after the tool result) a
// final answer, both what a real Chat Completions server sends.
func mock(tb testing.TB) string {
	return benchkit.StartMockModel(tb, 1, "noop", `{"n":1}`).URL
}

type noop struct{}

func (noop) Spec() tool.Spec {
	return tool.Spec{Name: "noop", Description: "does nothing", Tier: tool.ReadOnly,
		Schema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)}
}
func (noop) Call(context.Context, json.RawMessage) (string, error) { return "ok", nil }

// usage is what the process consumed so far.
type usage struct {
	cpu     time.Duration
	mallocs uint64
}

func now() usage {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return usage{cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), mallocs: ms.Mallocs}
}

// report adds per-model-call metrics; every iteration makes two calls.
func report(b *testing.B, start usage) {
	end := now()
	calls := float64(b.N * 2)
	b.ReportMetric(float64(end.cpu-start.cpu)/calls, "cpu-ns/call")
	b.ReportMetric(float64(end.mallocs-start.mallocs)/calls, "allocs/call")
	b.ReportMetric(peakRSS(), "peak-rss-MiB")
}

// peakRSS is the process's high-water resident set (VmHWM), in MiB.
func peakRSS() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// config is the operator under test, as Run takes it: the binary's
// defaults for each invocation (system prompt, limits), the
// OpenAI-compatible provider against the mock as every model, the noop
// tool and nothing else (no built-in or effect tools, no compaction).
func config(b *testing.B, log *slog.Logger) operator.Config {
	p, err := openai.NewCompatible(openai.Config{BaseURL: mock(b)})
	if err != nil {
		b.Fatal(err)
	}
	cfg := operator.DefaultConfig()
	cfg.Log = log
	cfg.Router = provider.Single{Provider: p, Default: model}
	cfg.Tools, cfg.EffectTools, cfg.Models.Compaction = nil, false, compaction.NameNone
	cfg.ExtraTools = []tool.Tool{noop{}}
	return cfg
}

// measure runs one warm-up iteration, then b.N timed ones, and reports.
func measure(b *testing.B, run func()) {
	run() // warm up connections
	b.ResetTimer()
	start := now()
	for range b.N {
		run()
	}
	b.StopTimer()
	report(b, start)
}

// BenchmarkOperatorLoop is one Execute through the real service per
// iteration: two model calls and one tool call.
func BenchmarkOperatorLoop(b *testing.B) {
	cfg := config(b, slog.New(slog.DiscardHandler))
	// The service as the binary starts it: operator.Run, its server chain.
	cfg.Server = grpcserver.Config{Name: "operator", Dev: true}
	addr := harness.Serve(b, func(ctx context.Context, lis net.Listener) error {
		cfg.Listener = lis
		return operator.Run(ctx, cfg)
	})
	// The client is the one the orchestrator and the CLI use.
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true})
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := operatorv1.NewOperatorServiceClient(conn)
	req := &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{Message: content.Text("call noop once, then say done")}}

	run := func() {
		resp, err := client.Execute(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		if resp.GetOutput().GetMetadata().GetTurnsUsed() != 2 {
			b.Fatalf("turns %d", resp.GetOutput().GetMetadata().GetTurnsUsed())
		}
	}
	measure(b, run)
}

// BenchmarkOperatorInProcess is the same loop called in process, without
// the gRPC hop and server chain, to split the overhead: the operator
// built by hand from the same Config, as Run builds it.
func BenchmarkOperatorInProcess(b *testing.B) {
	cfg := config(b, slog.New(slog.DiscardHandler))
	reg := tool.NewRegistry()
	for _, t := range cfg.ExtraTools {
		if err := reg.Register(t); err != nil {
			b.Fatal(err)
		}
	}
	op, err := operator.New(cfg, cfg.Router, cfg.Log, operator.WithTools(reg))
	if err != nil {
		b.Fatal(err)
	}
	in := &operatorv1.OperatorInput{Message: content.Text("call noop once, then say done")}
	run := func() {
		out, err := op.Execute(context.Background(), in, nil)
		if err != nil || out.GetMetadata().GetTurnsUsed() != 2 {
			b.Fatalf("%v %v", out, err)
		}
	}
	measure(b, run)
}

// BenchmarkHandLoop is the same conversation as a minimal hand-written
// loop on openai-go: no service, no registry, no validation.
func BenchmarkHandLoop(b *testing.B) {
	client := sdk.NewClient(option.WithBaseURL(mock(b)), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	tools := []sdk.ChatCompletionToolUnionParam{sdk.ChatCompletionFunctionTool(sdk.FunctionDefinitionParam{
		Name: "noop", Description: sdk.String("does nothing"),
		Parameters: sdk.FunctionParameters{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "integer"}}},
	})}
	run := func() {
		msgs := []sdk.ChatCompletionMessageParamUnion{
			sdk.SystemMessage(operator.DefaultSystemPrompt),
			sdk.UserMessage("call noop once, then say done"),
		}
		for turn := 0; ; turn++ {
			resp, err := client.Chat.Completions.New(context.Background(), sdk.ChatCompletionNewParams{Model: model, Messages: msgs, Tools: tools})
			if err != nil {
				b.Fatal(err)
			}
			calls := resp.Choices[0].Message.ToolCalls
			if len(calls) == 0 {
				if turn != 1 {
					b.Fatalf("done after %d turns", turn+1)
				}
				return
			}
			msgs = append(msgs, resp.Choices[0].Message.ToParam())
			for _, c := range calls {
				var args map[string]any
				if err := json.Unmarshal([]byte(c.Function.Arguments), &args); err != nil {
					b.Fatal(err)
				}
				msgs = append(msgs, sdk.ToolMessage("ok", c.ID))
			}
		}
	}
	measure(b, run)
}
