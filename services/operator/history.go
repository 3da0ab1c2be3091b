package operator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

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
	entries, err := h.read(ctx, sc, keys)
	if err != nil {
		return nil, historyErr(sessionID, err)
	}
	var msgs []provider.Message
	for i, resp := range entries {
		if resp == nil {
			continue // deleted between List and Read
		}
		entry, err := decodeEntry(resp.GetValue())
		if err != nil {
			// A damaged entry is skipped, not fatal: the rest of the
			// conversation is still worth more than an error.
			if h.Log != nil {
				h.Log.Warn("skipping unreadable history entry", "session", sessionID, "key", keys[i], "err", err)
			}
			continue
		}
		msgs = append(msgs, entry...)
	}
	return msgs, nil
}

// HistoryReads is how many entries Load reads at once: a session's
// entries arrive in about a HistoryReads-th of the round trips one after
// the other would take.
const HistoryReads = 8

// read reads the entries of keys, at most HistoryReads at a time, into
// the same order; an entry deleted since it was listed is nil. The first
// failure (other than NOT_FOUND) stops the reads and is returned.
func (h StateHistory) read(ctx context.Context, sc *typesv1.Scope, keys []string) ([]*statev1.ReadResponse, error) {
	out := make([]*statev1.ReadResponse, len(keys))
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	slots := make(chan struct{}, HistoryReads)
	for i, k := range keys {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			resp, err := h.Client.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: k})
			switch {
			case err == nil:
				out[i] = resp
			case errs.Code(errs.FromGRPC(err)) == errs.NotFound.Code():
			default:
				mu.Lock()
				if first == nil {
					first = err
					stop() // the reads still to start fail at once
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	return out, nil
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
