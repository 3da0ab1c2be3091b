// Command mockmodel is an OpenAI-compatible model server for benchmarks:
// POST /v1/chat/completions answers at once with a canned Chat
// Completions reply, a call of one tool until the request holds
// --tool-calls tool results, then a final answer. It decides by counting
// "role":"tool" in the request body (compact JSON, as openai-go and the
// operator send it), so that decoding the request is not part of what it
// costs. GET /stats answers {"requests":N}, the chat completions served
// so far.
//
// It listens on --addr (default: a free loopback port), prints its base
// URL (http://HOST:PORT/v1) as the first line of stdout, and exits on
// SIGTERM, SIGINT or when its stdin closes, so that it never outlives the
// benchmark that started it.
//
//	mockmodel --tool-calls 3 --tool read --arguments '{"path":"bench.txt"}'
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "mockmodel: %v\n", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mockmodel", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	calls := fs.Int("tool-calls", 1, "tool results a conversation needs before the final answer (K: K+1 model calls per conversation)")
	name := fs.String("tool", "noop", "the tool the model calls")
	arguments := fs.String("arguments", `{"n":1}`, "the tool call's arguments (a JSON object)")
	model := fs.String("model", "mock-1", "the model name in replies")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *calls < 0 {
		return errors.New("--tool-calls must not be negative")
	}
	m := newMock(*calls, *name, *arguments, *model)

	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: m, ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("http://%s/v1\n", lis.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // returns when stdin closes
		stop()
	}()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// mock serves the canned replies.
type mock struct {
	calls    int
	toolCall [][]byte // toolCall[n]: the reply asking for tool call n+1
	final    []byte
	// The same replies as server-sent events, for requests that stream.
	toolCallSSE [][]byte
	finalSSE    []byte
	requests    atomic.Int64
}

var streamField = []byte(`"stream":true`)

// sse is a streamed reply: one chunk with delta, one with the finish
// reason, one with the usage, then [DONE].
func sse(id, model, delta, finish, usage string) []byte {
	var b bytes.Buffer
	chunk := func(choices, extra string) {
		fmt.Fprintf(&b, "data: {\"id\":%q,\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":%s%s}\n\n", id, model, choices, extra)
	}
	chunk(`[{"index":0,"delta":`+delta+`,"finish_reason":null}]`, "")
	chunk(`[{"index":0,"delta":{},"finish_reason":"`+finish+`"}]`, "")
	chunk(`[]`, `,"usage":`+usage)
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

var toolRole = []byte(`"role":"tool"`)

func newMock(calls int, name, arguments, model string) *mock {
	m := &mock{calls: calls}
	for n := range calls {
		// The arguments are a JSON string inside the reply.
		m.toolCall = append(m.toolCall, fmt.Appendf(nil, `{"id":"chatcmpl-%d","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_%d","type":"function","function":{"name":%q,"arguments":%s}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":50,"completion_tokens":10,"total_tokens":60}}`,
			n+1, model, n+1, name, strconv.Quote(arguments)))
	}
	for n := range calls {
		delta := fmt.Sprintf(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_%d","type":"function","function":{"name":%q,"arguments":%s}}]}`, n+1, name, strconv.Quote(arguments))
		m.toolCallSSE = append(m.toolCallSSE, sse(fmt.Sprintf("chatcmpl-%d", n+1), model, delta, "tool_calls", `{"prompt_tokens":50,"completion_tokens":10,"total_tokens":60}`))
	}
	m.finalSSE = sse("chatcmpl-final", model, `{"role":"assistant","content":"done"}`, "stop", `{"prompt_tokens":70,"completion_tokens":2,"total_tokens":72}`)
	m.final = fmt.Appendf(nil, `{"id":"chatcmpl-final","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":70,"completion_tokens":2,"total_tokens":72}}`, model)
	return m
}

func (m *mock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/stats":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"requests":%d}`, m.requests.Load())
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m.requests.Add(1)
		reply := m.final
		n := bytes.Count(body, toolRole)
		if n < m.calls {
			reply = m.toolCall[n]
		}
		if bytes.Contains(body, streamField) {
			reply = m.finalSSE
			if n < m.calls {
				reply = m.toolCallSSE[n]
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Content-Length", strconv.Itoa(len(reply)))
			_, _ = w.Write(reply)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(reply)))
		_, _ = w.Write(reply)
	default:
		http.Error(w, `{"error":{"message":"not found","type":"invalid_request_error"}}`, http.StatusNotFound)
	}
}
