// Command handloop is the baseline of the whole-path benchmark
// (internal/pathbench): a minimal hand-written agent loop on openai-go,
// in a process of its own so that its CPU time is measured the way the
// services' is. Each conversation sends the operator's default system
// prompt and a user message, offering the operator's read tool (the same
// definition); while the model asks for tool calls it reads the file
// from --dir and sends its content back; it ends at the first reply
// without tool calls. No service, registry, validation or history.
//
// It warms up with one conversation, prints "ready", then serves
// commands, one a line on stdin:
//
//	run N C   N conversations over C goroutines; answers "done CALLS",
//	          CALLS being the model calls made, or "error MESSAGE"
//
// and exits when stdin closes.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/tool/builtin"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "handloop: %v\n", err)
		os.Exit(2)
	}
}

type loop struct {
	client sdk.Client
	model  string
	dir    string
	tools  []sdk.ChatCompletionToolUnionParam
	calls  atomic.Int64
}

func run() error {
	baseURL := flag.String("base-url", "", "the model server's base URL, http://HOST:PORT/v1")
	model := flag.String("model", "mock-1", "model name")
	dir := flag.String("dir", ".", "directory the read tool reads from")
	flag.Parse()
	if *baseURL == "" {
		return errors.New("--base-url is required")
	}
	spec := builtin.NewRead(nil).Spec()
	var params sdk.FunctionParameters
	if err := json.Unmarshal(spec.Schema, &params); err != nil {
		return err
	}
	l := &loop{
		client: sdk.NewClient(option.WithBaseURL(*baseURL), option.WithAPIKey("unused"), option.WithMaxRetries(0)),
		model:  *model, dir: *dir,
		tools: []sdk.ChatCompletionToolUnionParam{sdk.ChatCompletionFunctionTool(sdk.FunctionDefinitionParam{
			Name: spec.Name, Description: sdk.String(spec.Description), Parameters: params,
		})},
	}
	if err := l.conversation(); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var n, c int
		if _, err := fmt.Sscanf(sc.Text(), "run %d %d", &n, &c); err != nil || n < 0 || c < 1 {
			fmt.Printf("error bad command %q\n", sc.Text())
			continue
		}
		before := l.calls.Load()
		if err := l.runMany(n, c); err != nil {
			fmt.Printf("error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		fmt.Printf("done %d\n", l.calls.Load()-before)
	}
	return sc.Err()
}

// runMany runs n conversations over c goroutines.
func (l *loop) runMany(n, c int) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := l.conversation(); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// conversation is one agent run: model calls until one asks for no tool.
func (l *loop) conversation() error {
	ctx := context.Background()
	msgs := []sdk.ChatCompletionMessageParamUnion{
		sdk.SystemMessage(operator.DefaultSystemPrompt),
		sdk.UserMessage("read bench.txt until the model is done"),
	}
	for {
		resp, err := l.client.Chat.Completions.New(ctx, sdk.ChatCompletionNewParams{Model: l.model, Messages: msgs, Tools: l.tools})
		l.calls.Add(1)
		if err != nil {
			return err
		}
		if len(resp.Choices) == 0 {
			return errors.New("a reply without choices")
		}
		calls := resp.Choices[0].Message.ToolCalls
		if len(calls) == 0 {
			return nil
		}
		msgs = append(msgs, resp.Choices[0].Message.ToParam())
		for _, c := range calls {
			var args struct {
				Path string `json:"path"`
			}
			if err := json.Unmarshal([]byte(c.Function.Arguments), &args); err != nil {
				return err
			}
			text, err := os.ReadFile(filepath.Join(l.dir, filepath.Clean("/"+args.Path)))
			if err != nil {
				return err
			}
			msgs = append(msgs, sdk.ToolMessage(string(text), c.ID))
		}
	}
}
