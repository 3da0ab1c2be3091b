// Package floor is what a dispatch costs with nothing of ours in it: the
// floor of the whole-path benchmark (internal/pathbench, route=floor, one
// process per role through cmd/floor) and of the orchestrator's
// (services/orchestrator/benchmark, DispatchFloor, in process). Each role
// makes the same calls, stream messages and durable commits as our
// service in its place, served by a bare grpc-go server (no interceptors,
// validation, auth, logging, lifecycle, tracing or registry):
//
//   - NewState: List (a bbolt read) and Write (a bbolt commit with its
//     fdatasyncs, concurrent writes sharing one, as in State's group
//     commit).
//   - NewOperator: ExecuteStream: the session's history read with one List,
//     then the model calls through the operator's own OpenAI-compatible
//     provider (streamed, as the orchestrator asks for), the read tool, and
//     the stream messages the operator sends (a text delta when there is
//     text, model call finished, tool call started and finished, the
//     history effect declared, the output carrying it). TrivialOperator
//     answers at once.
//   - NewOrchestrator: Dispatch: the operator's stream read to its end, the
//     step's transcript entry and each memory effect written to State, and
//     one journal commit (bbolt, with its fdatasyncs) before answering.
//
// What a dispatch costs here is what the design costs on this machine
// (three processes, five calls, about thirteen stream messages, three
// durable commits, four streamed model calls in the whole path's case);
// the real path's cost above it is what our services add.
package floor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool/builtin"
)

// OpenDB opens (creating it) the bbolt file name in dir, with bbolt's
// defaults: each commit fdatasyncs, as State's and the journal's do.
func OpenDB(dir, name string) (*DB, error) {
	if dir == "" {
		return nil, errors.New("a data directory is required")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	db, err := bbolt.Open(filepath.Join(dir, name), 0o600, nil)
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucket)
		return err
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &DB{db: db}, nil
}

// Close closes the file.
func (g *DB) Close() error { return g.db.Close() }

var bucket = []byte("kv")

// DB is a bbolt file whose commits are group commits: it commits concurrent changes in one transaction, as State's and the
// journal's group commits do: the first caller commits what is pending,
// and goes on while more arrived meanwhile; the others wait for the
// transaction that carried their change. One change's failure fails its
// whole transaction here (the floor's changes never fail).
type DB struct {
	db      *bbolt.DB
	mu      sync.Mutex
	pending []change
	leading bool
}

type change struct {
	fn   func(*bbolt.Tx) error
	done chan error
}

func (g *DB) commit(fn func(*bbolt.Tx) error) error {
	c := change{fn: fn, done: make(chan error, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, c)
	if g.leading {
		g.mu.Unlock()
		return <-c.done
	}
	g.leading = true
	for len(g.pending) > 0 {
		batch := g.pending
		g.pending = nil
		g.mu.Unlock()
		err := g.db.Update(func(tx *bbolt.Tx) error {
			for _, c := range batch {
				if err := c.fn(tx); err != nil {
					return err
				}
			}
			return nil
		})
		for _, c := range batch {
			c.done <- err
		}
		g.mu.Lock()
	}
	g.leading = false
	g.mu.Unlock()
	return <-c.done
}

// scopeKey is a Scope and key as one bbolt key.
func scopeKey(s *typesv1.Scope, key string) []byte {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	return append(append(b, 0), key...)
}

// NewState is the state role on db.
func NewState(db *DB) statev1.StateServiceServer { return &state{db: db} }

// state is the state role.
type state struct {
	statev1.UnimplementedStateServiceServer
	db  *DB
	rev atomic.Uint64
}

func (s *state) Write(_ context.Context, req *statev1.WriteRequest) (*statev1.WriteResponse, error) {
	v, err := proto.Marshal(req.GetValue())
	if err != nil {
		return nil, err
	}
	rev := s.rev.Add(1)
	err = s.db.commit(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucket).Put(scopeKey(req.GetScope(), req.GetKey()), v)
	})
	if err != nil {
		return nil, err
	}
	return &statev1.WriteResponse{Revision: rev}, nil
}

func (s *state) List(_ context.Context, req *statev1.ListRequest) (*statev1.ListResponse, error) {
	prefix := scopeKey(req.GetScope(), req.GetPrefix())
	resp := &statev1.ListResponse{}
	err := s.db.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucket).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			e := &statev1.ListItem{Key: string(k[len(prefix):])}
			if req.GetIncludeValues() {
				e.Value = &structpb.Value{}
				if err := proto.Unmarshal(v, e.Value); err != nil {
					return err
				}
			}
			resp.Items = append(resp.Items, e)
		}
		return nil
	})
	return resp, err
}

// NewOperator is the operator role: the model's calls (as model, with
// OpenAI's function tools) and the read tool on files under dir, its
// history in state.
func NewOperator(state statev1.StateServiceClient, model provider.Provider, modelName, dir string) operatorv1.OperatorServiceServer {
	spec := builtin.NewRead(nil).Spec()
	return &op{state: state, model: model, name: modelName, dir: dir,
		tools: []provider.ToolSpec{{Name: spec.Name, Description: spec.Description, InputSchema: spec.Schema}}}
}

// TrivialOperator is the operator role that answers each invocation at
// once with its message: no model, history or effects.
func TrivialOperator() operatorv1.OperatorServiceServer { return trivialOp{} }

// op is the operator role.
type op struct {
	operatorv1.UnimplementedOperatorServiceServer
	state statev1.StateServiceClient
	model provider.Provider
	name  string
	dir   string
	tools []provider.ToolSpec
}

func (o *op) ExecuteStream(req *operatorv1.ExecuteStreamRequest, stream grpc.ServerStreamingServer[operatorv1.ExecuteStreamResponse]) error {
	ctx := stream.Context()
	in := req.GetInput()
	session := scope.Session(in.GetSessionId())
	hist, err := o.state.List(ctx, &statev1.ListRequest{Scope: session, Prefix: operator.HistoryPrefix, IncludeValues: true, Reverse: true, PageSize: 50})
	if err != nil {
		return err
	}
	// The benchmarks' dispatches each start a session, so the history is
	// empty, as it is on the real path they are measured against; a
	// history's entries would not be replayed to the model here.
	msgs := make([]provider.Message, 0, len(hist.GetItems())+8)
	msgs = append(msgs, provider.Message{Role: provider.User, Parts: []provider.Part{{Text: content.TextOf(in.GetMessage())}}})
	send := func(r *operatorv1.ExecuteStreamResponse) error { return stream.Send(r) }
	var turns uint32
	var text string
	for {
		turns++
		turn := turns
		resp, err := o.model.Complete(ctx, &provider.Request{
			Model: o.name, System: operator.DefaultSystemPrompt, Messages: msgs, Tools: o.tools,
			OnText: func(t string) {
				if t != "" {
					_ = send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{TextDelta: &operatorv1.TextDelta{Turn: turn, Text: t}}})
				}
			},
		})
		if err != nil {
			return err
		}
		if err := send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ModelCallFinished{ModelCallFinished: &operatorv1.ModelCallFinished{
			Turn: turn, Model: resp.Model, TokensIn: resp.Usage.InputTokens, TokensOut: resp.Usage.OutputTokens,
		}}}); err != nil {
			return err
		}
		msgs = append(msgs, provider.Message{Role: provider.Assistant, Parts: resp.Parts})
		var results []provider.Part
		text = ""
		for _, p := range resp.Parts {
			text += p.Text
			if p.ToolUse == nil {
				continue
			}
			input := &structpb.Value{}
			if err := input.UnmarshalJSON(p.ToolUse.Input); err != nil {
				return err
			}
			if err := send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallStarted{ToolCallStarted: &operatorv1.ToolCallStarted{
				Turn: turn, ToolUseId: p.ToolUse.ID, Name: p.ToolUse.Name, Input: input,
			}}}); err != nil {
				return err
			}
			var args struct {
				Path string `json:"path"`
			}
			if err := json.Unmarshal(p.ToolUse.Input, &args); err != nil {
				return err
			}
			b, err := os.ReadFile(filepath.Join(o.dir, filepath.Clean("/"+args.Path)))
			if err != nil {
				return err
			}
			if err := send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallFinished{ToolCallFinished: &operatorv1.ToolCallFinished{
				Turn: turn, ToolUseId: p.ToolUse.ID, Name: p.ToolUse.Name, Result: string(b),
			}}}); err != nil {
				return err
			}
			results = append(results, provider.Part{ToolResult: &provider.ToolResult{ToolUseID: p.ToolUse.ID, Content: string(b)}})
		}
		if len(results) == 0 {
			break
		}
		msgs = append(msgs, provider.Message{Role: provider.User, Parts: results})
	}
	entry, err := historyValue(in.GetDispatch().GetDispatchId(), msgs)
	if err != nil {
		return err
	}
	hist1 := &typesv1.Effect{
		IdempotencyKey: in.GetDispatch().GetDispatchId() + "/history",
		Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{
			Scope: session, Key: operator.HistoryPrefix + in.GetDispatch().GetDispatchId(), Value: entry, Unindexed: true,
		}},
	}
	if err := send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_EffectDeclared{EffectDeclared: &operatorv1.EffectDeclared{Effect: hist1}}}); err != nil {
		return err
	}
	return send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: &operatorv1.OperatorOutput{
		Message:    content.Text(text),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{TurnsUsed: turns},
		Effects:    []*typesv1.Effect{hist1},
	}}})
}

// trivialOp is TrivialOperator.
type trivialOp struct {
	operatorv1.UnimplementedOperatorServiceServer
}

func (trivialOp) ExecuteStream(req *operatorv1.ExecuteStreamRequest, stream grpc.ServerStreamingServer[operatorv1.ExecuteStreamResponse]) error {
	return stream.Send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: &operatorv1.OperatorOutput{
		Message:    req.GetInput().GetMessage(),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{TurnsUsed: 1},
	}}})
}

// historyValue is the turns of a dispatch as a State value: a list of
// messages, each its role and parts.
func historyValue(dispatch string, msgs []provider.Message) (*structpb.Value, error) {
	list := make([]any, 0, len(msgs))
	for _, m := range msgs {
		parts := make([]any, 0, len(m.Parts))
		for _, p := range m.Parts {
			switch {
			case p.ToolUse != nil:
				parts = append(parts, map[string]any{"tool_use": map[string]any{"id": p.ToolUse.ID, "name": p.ToolUse.Name, "input": string(p.ToolUse.Input)}})
			case p.ToolResult != nil:
				parts = append(parts, map[string]any{"tool_result": map[string]any{"id": p.ToolResult.ToolUseID, "content": p.ToolResult.Content}})
			default:
				parts = append(parts, map[string]any{"text": p.Text})
			}
		}
		list = append(list, map[string]any{"role": strconv.Itoa(int(m.Role)), "parts": parts})
	}
	return structpb.NewValue(map[string]any{"dispatch": dispatch, "messages": list})
}

// NewOrchestrator is the orchestrator role: its journal, the State it
// writes the transcript and the operator's effects to, and the operator.
func NewOrchestrator(journal *DB, state statev1.StateServiceClient, op operatorv1.OperatorServiceClient) orchestratorv1.OrchestratorServiceServer {
	return &orch{db: journal, state: state, op: op}
}

// orch is the orchestrator role.
type orch struct {
	orchestratorv1.UnimplementedOrchestratorServiceServer
	db    *DB
	state statev1.StateServiceClient
	op    operatorv1.OperatorServiceClient
	seq   atomic.Uint64
}

func (o *orch) Dispatch(ctx context.Context, req *orchestratorv1.DispatchRequest) (*orchestratorv1.DispatchResponse, error) {
	id := fmt.Sprintf("wf-%d", o.seq.Add(1))
	in := proto.CloneOf(req.GetInput())
	in.Dispatch = &operatorv1.DispatchContext{WorkflowId: id, DispatchId: id + "#1", AgentId: req.GetAgentId()}
	stream, err := o.op.ExecuteStream(ctx, &operatorv1.ExecuteStreamRequest{Input: in})
	if err != nil {
		return nil, err
	}
	var out *operatorv1.OperatorOutput
	var calls []any
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch e := msg.GetEvent().(type) {
		case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
			calls = append(calls, map[string]any{"id": e.ToolCallFinished.GetToolUseId(), "name": e.ToolCallFinished.GetName(), "result": e.ToolCallFinished.GetResult()})
		case *operatorv1.ExecuteStreamResponse_Output:
			out = e.Output
		}
	}
	if out == nil {
		return nil, errors.New("the operator's stream ended without an output")
	}
	wfScope := scope.Workflow(id)
	step, err := structpb.NewValue(map[string]any{"agent": req.GetAgentId(), "input": content.TextOf(req.GetInput().GetMessage()),
		"output": content.TextOf(out.GetMessage()), "tool_calls": calls})
	if err != nil {
		return nil, err
	}
	if _, err := o.state.Write(ctx, &statev1.WriteRequest{Scope: wfScope, Key: "orchestrator/transcript/1", Value: step, Unindexed: true}); err != nil {
		return nil, err
	}
	for _, e := range out.GetEffects() {
		if w := e.GetWriteMemory(); w != nil {
			if _, err := o.state.Write(ctx, &statev1.WriteRequest{Scope: w.GetScope(), Key: w.GetKey(), Value: w.GetValue(),
				IdempotencyKey: e.GetIdempotencyKey(), Unindexed: w.GetUnindexed()}); err != nil {
				return nil, err
			}
		}
	}
	rec, err := proto.Marshal(out)
	if err != nil {
		return nil, err
	}
	if err := o.db.commit(func(tx *bbolt.Tx) error { return tx.Bucket(bucket).Put([]byte(id), rec) }); err != nil {
		return nil, err
	}
	return &orchestratorv1.DispatchResponse{WorkflowId: id, Output: out}, nil
}
