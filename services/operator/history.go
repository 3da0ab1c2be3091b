package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator/provider"
)

// HistoryPrefix is the key prefix of conversation entries in a session
// scope. Each invocation adds one entry, "conversation/<sortable id>",
// holding the turns it added, so concurrent invocations of one session
// never overwrite each other.
const HistoryPrefix = "conversation/"

// historyVersion is the entry format's version.
const historyVersion = 1

// History reads a session's past turns. Implementations are read-only.
type History interface {
	// Load returns the session's messages, oldest first, from at most the
	// last maxEntries invocations (0: all).
	Load(ctx context.Context, sessionID string, maxEntries int) ([]provider.Message, error)
}

// StateHistory reads history from a StateService. It needs only Read and
// List, so the operator's credential can be read-only.
type StateHistory struct {
	Client statev1.StateServiceClient
	Log    *slog.Logger
}

// HistoryWait bounds how long Load waits for a State service that is
// down or restarting (its client waits for it to come back, WaitForReady)
// before the invocation fails UNAVAILABLE, OPERATOR_RETRYABLE: a restart
// is ridden out, a State that stays away is reported, and the caller's
// retries take over.
const HistoryWait = 10 * time.Second

// Load implements History.
func (h StateHistory) Load(ctx context.Context, sessionID string, maxEntries int) ([]provider.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, HistoryWait)
	defer cancel()
	sc := scope.Session(sessionID)
	var keys []string
	token := ""
	for {
		resp, err := h.Client.List(ctx, &statev1.ListRequest{Scope: sc, Prefix: HistoryPrefix, PageSize: 1000, PageToken: token})
		if err != nil {
			return nil, historyErr(sessionID, err)
		}
		for _, it := range resp.GetItems() {
			keys = append(keys, it.GetKey())
		}
		token = resp.GetNextPageToken()
		if token == "" {
			break
		}
	}
	if maxEntries > 0 && len(keys) > maxEntries {
		keys = keys[len(keys)-maxEntries:]
	}
	var msgs []provider.Message
	for _, k := range keys {
		resp, err := h.Client.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: k})
		if err != nil {
			if errs.Code(errs.FromGRPC(err)) == errs.NotFound.Code() {
				continue // deleted between List and Read
			}
			return nil, historyErr(sessionID, err)
		}
		entry, err := decodeEntry(resp.GetValue())
		if err != nil {
			// A damaged entry is skipped, not fatal: the rest of the
			// conversation is still worth more than an error.
			if h.Log != nil {
				h.Log.Warn("skipping unreadable history entry", "session", sessionID, "key", k, "err", err)
			}
			continue
		}
		msgs = append(msgs, entry...)
	}
	return msgs, nil
}

func historyErr(sessionID string, err error) error {
	err = errs.FromGRPC(err)
	switch errs.Code(err) {
	case errs.Unavailable.Code(), errs.DeadlineExceeded.Code():
		return fmt.Errorf("reading history of session %q from the state service: %v: %w", sessionID, err, errs.Retryable)
	case errs.Canceled.Code():
		return err
	}
	return fmt.Errorf("reading history of session %q from the state service: %v: %w", sessionID, err, errs.NonRetryable)
}

// historyEntry is the stored form of one invocation's turns.
type historyEntry struct {
	Version    int               `json:"version"`
	DispatchID string            `json:"dispatch_id,omitempty"`
	Messages   []json.RawMessage `json:"messages"`
}

type storedMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// encodeEntry builds the WriteMemory value for the turns of one invocation.
func encodeEntry(dispatchID string, msgs []provider.Message) (*structpb.Value, error) {
	e := historyEntry{Version: historyVersion, DispatchID: dispatchID}
	for _, m := range msgs {
		c, err := protojson.Marshal(toContent(m.Parts))
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(storedMessage{Role: m.Role.String(), Content: c})
		if err != nil {
			return nil, err
		}
		e.Messages = append(e.Messages, b)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	return jsonValue(b)
}

func decodeEntry(v *structpb.Value) ([]provider.Message, error) {
	b, err := protojson.Marshal(v)
	if err != nil {
		return nil, err
	}
	var e historyEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, err
	}
	if e.Version != historyVersion {
		return nil, fmt.Errorf("entry version %d, want %d", e.Version, historyVersion)
	}
	msgs := make([]provider.Message, 0, len(e.Messages))
	for i, raw := range e.Messages {
		var sm storedMessage
		if err := json.Unmarshal(raw, &sm); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		var role provider.Role
		switch strings.ToLower(sm.Role) {
		case "user":
			role = provider.User
		case "assistant":
			role = provider.Assistant
		default:
			return nil, fmt.Errorf("message %d: unknown role %q", i, sm.Role)
		}
		c := &typesv1.Content{}
		if err := protojson.Unmarshal(sm.Content, c); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		msgs = append(msgs, provider.Message{Role: role, Parts: toParts(c, nil)})
	}
	return msgs, nil
}
