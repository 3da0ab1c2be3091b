package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// A second message for a busy session. An agent whose definition sets
// busy_session (Agent.BusySession) keeps, per session, which workflow of
// it runs for that session: a claim in the State service (the session's
// scope, key SessionClaimPrefix + agent id) naming the workflow and its
// message, written with compare-and-set before the workflow starts. A
// message that finds the claimed workflow not ended follows the policy;
// one that finds it ended (or gone) claims the session for its own. The
// claim lives in State, not in this process, so every replica (Temporal)
// and every restart sees it, and two messages racing for a session are
// ordered by the compare-and-set.

// SessionClaimPrefix is the State key prefix of a session's claims.
const SessionClaimPrefix = "orchestrator/busy/"

// MessageSignal is the signal type a message delivered to a busy
// session's workflow (busy_session: signal) is sent as.
const MessageSignal = "message"

// claimAttempts bounds the compare-and-set retries of one message.
const claimAttempts = 8

// claimGrace is how long a claim may name a workflow that does not exist
// yet (its start follows the claim): a message meanwhile waits for it.
// An older claim of a missing workflow is one whose start failed.
const claimGrace = 10 * time.Second

// WithAgents lets the Server read agents' busy_session policies.
func WithAgents(lookup func(id string) (*Agent, error)) ServerOption {
	return func(s *Server) { s.agents = lookup }
}

// busyPolicy is agent id's busy_session policy; "" when it has none (or
// is unknown: the start reports that).
func (s *Server) busyPolicy(id string) string {
	if s.agents == nil {
		return ""
	}
	a, err := s.agents(id)
	if err != nil {
		return ""
	}
	return a.BusySession
}

// claim is a session's claim as stored.
type claim struct {
	workflow string
	message  *typesv1.Content
	at       time.Time // when it was claimed
	revision uint64    // 0: none
}

// busy is what the session gate decided for a message.
type busy struct {
	// signaled: the message went to workflow as a signal; answer for it.
	signaled string
	// input replaces the message's input (interrupt: both messages).
	input *operatorv1.OperatorInput
}

// sessionGate applies agent's busy_session policy to a message for its
// session, before a workflow with id wfID is started for it. It returns
// what to do instead of a plain start, or an error to answer.
func (s *Server) sessionGate(ctx context.Context, agentID, policy, wfID string, in *operatorv1.OperatorInput) (*busy, error) {
	session := in.GetSessionId()
	if s.state == nil {
		return nil, fmt.Errorf("agent %q has a busy_session policy, but this orchestrator has no State service to keep sessions' claims in: %w", agentID, errs.FailedPrecondition)
	}
	key := SessionClaimPrefix + agentID
	sc := scope.Session(session)
	for conflicts := 0; conflicts < claimAttempts; {
		c, err := s.readClaim(ctx, sc, key)
		if err != nil {
			return nil, err
		}
		if c.workflow == wfID {
			return nil, nil // a retry of this message: the start finds its workflow
		}
		running, suspended := false, false
		if c.workflow != "" {
			wf, err := s.e.Get(ctx, c.workflow)
			switch {
			case errors.Is(err, errs.NotFound) && time.Since(c.at) < claimGrace:
				// Claimed and about to start: wait for it to exist.
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(25 * time.Millisecond):
				}
				continue
			case errors.Is(err, errs.NotFound):
			case err != nil:
				return nil, err
			default:
				running = !Terminal(wf.Status)
				suspended = wf.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED
			}
		}
		out := &busy{}
		if running {
			switch policy {
			case BusyReject:
				return nil, fmt.Errorf("session %q of agent %q is busy with workflow %s, which has not ended; send the message once it has (watch it with WatchWorkflow), or cancel it: %w",
					session, agentID, c.workflow, errs.FailedPrecondition)
			case BusySignal:
				if err := s.signalMessage(ctx, c.workflow, wfID, in); err != nil {
					return nil, err
				}
				return &busy{signaled: c.workflow}, nil
			case BusyEnqueue:
				if suspended {
					return nil, fmt.Errorf("session %q of agent %q is busy with workflow %s, which is SUSPENDED (waiting for an approval, a raise or a signal); a queued message would wait for a person: decide it or cancel it first: %w",
						session, agentID, c.workflow, errs.FailedPrecondition)
				}
				if _, err := s.e.Wait(ctx, c.workflow); err != nil {
					return nil, fmt.Errorf("waiting for workflow %s of session %q to end before this message: %w", c.workflow, session, err)
				}
				continue // claim it now, unless another message did first
			case BusyInterrupt:
				if _, err := s.e.Cancel(ctx, c.workflow, fmt.Sprintf("interrupted by a newer message in session %q (workflow %s goes on with both)", session, wfID)); err != nil &&
					!errors.Is(err, errs.NotFound) {
					return nil, err
				}
				out.input = proto.CloneOf(in)
				out.input.Message = &typesv1.Content{Blocks: append(append([]*typesv1.ContentBlock{}, c.message.GetBlocks()...), in.GetMessage().GetBlocks()...)}
			}
		}
		msg := in.GetMessage()
		if out.input != nil {
			msg = out.input.GetMessage()
		}
		ok, err := s.writeClaim(ctx, sc, key, claim{workflow: wfID, message: msg, revision: c.revision})
		if err != nil {
			return nil, err
		}
		if ok {
			return out, nil
		}
		// Another message claimed the session meanwhile: look again.
		conflicts++
	}
	return nil, fmt.Errorf("session %q of agent %q changed hands %d times while this message waited; send it again: %w", session, agentID, claimAttempts, errs.Retryable)
}

// readClaim reads a session's claim; a zero claim when there is none.
func (s *Server) readClaim(ctx context.Context, sc *typesv1.Scope, key string) (claim, error) {
	resp, err := s.state.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: key})
	if errors.Is(errs.FromGRPC(err), errs.NotFound) {
		return claim{}, nil
	}
	if err != nil {
		return claim{}, fmt.Errorf("reading the session's claim from the State service: %w", errs.FromGRPC(err))
	}
	f := resp.GetValue().GetStructValue().GetFields()
	c := claim{workflow: f["workflow_id"].GetStringValue(), revision: resp.GetRevision(), message: &typesv1.Content{}}
	c.at, _ = time.Parse(time.RFC3339Nano, f["claimed_at"].GetStringValue())
	if m := f["message"]; m != nil {
		if b, err := protojson.Marshal(m); err == nil {
			_ = protojson.Unmarshal(b, c.message)
		}
	}
	return c, nil
}

// writeClaim claims a session for c.workflow if its claim is still at
// c.revision (0: none); false when another message claimed it first.
func (s *Server) writeClaim(ctx context.Context, sc *typesv1.Scope, key string, c claim) (bool, error) {
	fields := map[string]*structpb.Value{"workflow_id": structpb.NewStringValue(c.workflow),
		"claimed_at": structpb.NewStringValue(time.Now().UTC().Format(time.RFC3339Nano))}
	if b, err := protojson.Marshal(c.message); err == nil {
		m := &structpb.Value{}
		if protojson.Unmarshal(b, m) == nil {
			fields["message"] = m
		}
	}
	rev := c.revision
	_, err := s.state.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: key, Value: structpb.NewStructValue(&structpb.Struct{Fields: fields}),
		ExpectedRevision: &rev, Unindexed: true})
	switch err := errs.FromGRPC(err); {
	case err == nil:
		return true, nil
	case errors.Is(err, errs.StaleRevision):
		return false, nil
	default:
		return false, fmt.Errorf("claiming the session in the State service: %w", err)
	}
}

// signalMessage delivers a message to a session's running workflow as a
// signal of type MessageSignal, once per message (its workflow id is the
// idempotency key).
func (s *Server) signalMessage(ctx context.Context, to, wfID string, in *operatorv1.OperatorInput) error {
	data := &structpb.Value{}
	if b, err := protojson.Marshal(in.GetMessage()); err == nil {
		_ = protojson.Unmarshal(b, data)
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(&typesv1.SignalPayload{SignalType: MessageSignal, Data: data})
	if err != nil {
		return err
	}
	_, _, err = s.e.Signal(ctx, to, raw, "message:"+wfID)
	return err
}

// signaledResponse answers a Dispatch whose message went to workflow id
// as a signal: that workflow's answer, once it stops.
func (s *Server) signaledResponse(ctx context.Context, id string) (*orchestratorv1.DispatchResponse, error) {
	wf, err := s.e.Wait(ctx, id)
	if err != nil {
		return nil, err
	}
	return response(wf)
}
