package operator

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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

// StateHistory reads history from a StateService. It needs only List
// (and Read, for a State that lists no values), so the operator's
// credential can be read-only.
//
// Load reads the session's last entries newest first in one List with
// values (ListRequest.include_values and reverse): one round trip for up
// to 1000 entries of up to 2 MiB in all. A State that returns no values
// (one that predates them, or one behind a store middleware, which must
// see each value on Read) is read as before: List the keys, then Read
// each entry, HistoryReads at a time. A StateHistory made by
// NewStateHistory remembers that answer and lists only keys from then
// on; one built as a literal asks for values on every Load.
type StateHistory struct {
	Client statev1.StateServiceClient
	Log    *slog.Logger
	// byRead is set once Client's State has answered a List with values
	// without them; nil: not remembered.
	byRead *atomic.Bool
}

// NewStateHistory returns a StateHistory over c that remembers whether
// its State lists values.
func NewStateHistory(c statev1.StateServiceClient, log *slog.Logger) StateHistory {
	return StateHistory{Client: c, Log: log, byRead: new(atomic.Bool)}
}

// HistoryWait bounds how long Load waits for a State service that is
// down or restarting (its client waits for it to come back, WaitForReady)
// before the invocation fails UNAVAILABLE, OPERATOR_RETRYABLE: a restart
// is ridden out, a State that stays away is reported, and the caller's
// retries take over.
const HistoryWait = 10 * time.Second

// historyPage is the most entries one List of Load asks for (State's
// largest page).
const historyPage = 1000

// Load implements History.
func (h StateHistory) Load(ctx context.Context, sessionID string, maxEntries int) ([]provider.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, HistoryWait)
	defer cancel()
	sc := scope.Session(sessionID)
	var (
		keys []string
		vals []*structpb.Value
		ok   bool
		err  error
	)
	if h.byRead == nil || !h.byRead.Load() {
		keys, vals, ok, err = h.listValues(ctx, sc, maxEntries)
		if err != nil {
			return nil, historyErr(sessionID, err)
		}
		if !ok && h.byRead != nil && !h.byRead.Swap(true) && h.Log != nil {
			h.Log.Info("the state service lists no values (it predates them, or a store middleware must see each read): reading history one entry at a time from now on")
		}
	}
	if !ok {
		keys, vals, err = h.listThenRead(ctx, sc, maxEntries)
		if err != nil {
			return nil, historyErr(sessionID, err)
		}
	}
	var msgs []provider.Message
	for i, v := range vals {
		if v == nil {
			continue // deleted between List and Read
		}
		entry, err := decodeEntry(v)
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

// listValues reads the last maxEntries (0: all) entries with their
// values, newest first, in as few List calls as State's page bounds
// allow, and returns them oldest first. ok is false, with nothing read,
// when State answered without values or not in descending order: it
// does not know include_values or reverse, or will not list values.
func (h StateHistory) listValues(ctx context.Context, sc *typesv1.Scope, maxEntries int) (keys []string, vals []*structpb.Value, ok bool, err error) {
	token := ""
	for {
		size := historyPage
		if maxEntries > 0 {
			size = min(maxEntries-len(keys), historyPage)
		}
		resp, err := h.Client.List(ctx, &statev1.ListRequest{
			Scope: sc, Prefix: HistoryPrefix, PageSize: int32(size), PageToken: token,
			IncludeValues: true, Reverse: true,
		})
		if err != nil {
			return nil, nil, false, err
		}
		for _, it := range resp.GetItems() {
			if it.GetValue() == nil || (len(keys) > 0 && it.GetKey() >= keys[len(keys)-1]) {
				return nil, nil, false, nil
			}
			keys = append(keys, it.GetKey())
			vals = append(vals, it.GetValue())
		}
		token = resp.GetNextPageToken()
		if token == "" || (maxEntries > 0 && len(keys) >= maxEntries) {
			break
		}
	}
	if maxEntries > 0 && len(keys) > maxEntries {
		keys, vals = keys[:maxEntries], vals[:maxEntries]
	}
	slices.Reverse(keys)
	slices.Reverse(vals)
	return keys, vals, true, nil
}

// listThenRead lists the session's keys, then reads the last maxEntries
// (0: all) of them; an entry deleted in between has a nil value.
func (h StateHistory) listThenRead(ctx context.Context, sc *typesv1.Scope, maxEntries int) ([]string, []*structpb.Value, error) {
	var keys []string
	token := ""
	for {
		resp, err := h.Client.List(ctx, &statev1.ListRequest{Scope: sc, Prefix: HistoryPrefix, PageSize: historyPage, PageToken: token})
		if err != nil {
			return nil, nil, err
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
		return nil, nil, err
	}
	vals := make([]*structpb.Value, len(entries))
	for i, e := range entries {
		vals[i] = e.GetValue()
	}
	return keys, vals, nil
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
