package operator

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator/compaction"
	"github.com/secbear/neuron/services/operator/provider"
)

// A session's rolling summary is its long-term memory: when the
// summarize context strategy folds the oldest turns of a session into a
// summary, the invocation declares it as two WriteMemory effects in the
// session scope, after its history entry:
//
//	summary-covers/<epoch>~<writer>  {"version": 1, "covers": [<history keys>]}  (unindexed)
//	summary/<epoch>~<writer>         {"version": 1, "summary": "<text>"}         (indexed)
//
// <epoch> is the newest history entry the summary covers, without
// HistoryPrefix ("<20-digit start time>-<dispatch>"), and <writer> the
// writing invocation's dispatch, so every summary has a key of its own and
// keys sort by what they cover. The summary key is indexed, and embedded
// by a State service that has an embedder, so search_memory finds it;
// the list of covered entries is kept apart so that it pollutes neither
// the full-text index nor the embedding. The covers key is written first,
// so a summary whose covers key is missing is never trusted.
//
// A later invocation of the session (StateHistory.LoadSession) starts
// from the newest summary, then the entries of its window that summary
// does not list, verbatim and oldest first, instead of summarizing them
// all again. Race safety needs no lock and no compare-and-set:
//
//   - A stale summary never replaces a newer one: it is written under its
//     own, smaller key, and only the newest key is read. Two racing
//     compactions both land; the one covering the newer turns is used,
//     the other is ignored (and deleted by the next summary that
//     supersedes it, or by State's retention).
//   - Turns appended while a summary is being written are never lost:
//     the summary lists exactly the entries it folded in, and any other
//     entry, even one whose key is older than the epoch (an invocation
//     that started earlier and finished later), is loaded verbatim.
//   - Where the summary covers only part of an entry (the cut fell inside
//     it, or the sliding window had dropped some of it), the entry is not
//     listed: it is loaded again in full, so its turns may appear twice,
//     but never not at all.
const (
	SummaryPrefix       = "summary/"
	SummaryCoversPrefix = "summary-covers/"
	summaryVersion      = 1
)

// sessionLoader is a History that also reads the session's persisted
// summary and says which entry each message came from.
type sessionLoader interface {
	LoadSession(ctx context.Context, sessionID string, maxEntries int) (*loadedSession, error)
}

// loadedSession is a session's context as LoadSession reads it.
type loadedSession struct {
	// messages is the context: the summary message (when summaryKey is
	// set), then the uncovered entries' messages.
	messages []provider.Message
	// summaryKey is the suffix (after SummaryPrefix) of the summary in
	// use; "" when none.
	summaryKey string
	// covered lists the entries the summary folds in that are still in
	// the window.
	covered []string
	// entries are the uncovered entries, in the order of messages.
	entries []entrySpan
}

// entrySpan locates one history entry's messages in the context:
// messages[start:end]. whole is false once some of them were dropped.
type entrySpan struct {
	key        string
	start, end int
	whole      bool
}

// LoadSession reads the session like Load, then its newest persisted
// summary (see SummaryPrefix): the context starts with the summary, and
// the entries it covers are left out.
func (h StateHistory) LoadSession(ctx context.Context, sessionID string, maxEntries int) (*loadedSession, error) {
	ctx, cancel := context.WithTimeout(ctx, HistoryWait)
	defer cancel()
	sc := scope.Session(sessionID)
	// The summary is looked up while the entries are listed: no round
	// trip added to the invocation's start.
	type found struct {
		text, suffix string
		covers       map[string]bool
		err          error
	}
	sumc := make(chan found, 1)
	go func() {
		var f found
		f.text, f.suffix, f.covers, f.err = h.summary(ctx, sc)
		sumc <- f
	}()
	var (
		keys []string
		vals []*structpb.Value
		ok   bool
		err  error
	)
	if h.byRead == nil || !h.byRead.Load() {
		keys, vals, ok, err = h.listValues(ctx, sc, maxEntries)
		if err == nil && !ok && h.byRead != nil {
			h.byRead.Store(true)
		}
	}
	if err == nil && !ok {
		keys, vals, err = h.listThenRead(ctx, sc, maxEntries)
	}
	if err != nil {
		cancel() // the summary's lookup stops too
		<-sumc
		return nil, historyErr(sessionID, err)
	}
	f := <-sumc
	if f.err != nil {
		return nil, historyErr(sessionID, f.err)
	}
	sum, suffix, covers := f.text, f.suffix, f.covers
	s := &loadedSession{}
	if sum != "" {
		s.summaryKey = suffix
		s.messages = append(s.messages, compaction.SummaryMessage(sum))
	}
	for i, v := range vals {
		if v == nil {
			continue
		}
		if covers[keys[i]] {
			s.covered = append(s.covered, keys[i])
			continue
		}
		entry, err := decodeEntry(v)
		if err != nil {
			if h.Log != nil {
				h.Log.Warn("skipping unreadable history entry", "session", sessionID, "key", keys[i], "err", err)
			}
			continue
		}
		s.entries = append(s.entries, entrySpan{key: keys[i], start: len(s.messages), end: len(s.messages) + len(entry), whole: true})
		s.messages = append(s.messages, entry...)
	}
	if h.Log != nil && sum != "" {
		h.Log.Debug("session starts from its summary", "session", sessionID, "summary", SummaryPrefix+suffix,
			"covered_entries", len(s.covered), "verbatim_entries", len(s.entries))
	}
	return s, nil
}

// summary reads the session's newest summary: its text, its key's
// suffix and the entries it covers. No summary, or one without a
// readable covers key, is text "".
func (h StateHistory) summary(ctx context.Context, sc *typesv1.Scope) (text, suffix string, covers map[string]bool, err error) {
	resp, err := h.Client.List(ctx, &statev1.ListRequest{Scope: sc, Prefix: SummaryPrefix, PageSize: 1, Reverse: true})
	if err != nil {
		return "", "", nil, err
	}
	items := resp.GetItems()
	if len(items) == 0 {
		return "", "", nil, nil
	}
	suffix = strings.TrimPrefix(items[0].GetKey(), SummaryPrefix)
	read := func(key string) (*structpb.Struct, error) {
		r, err := h.Client.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: key})
		if err != nil {
			if errs.Code(errs.FromGRPC(err)) == errs.NotFound.Code() {
				return nil, nil
			}
			return nil, err
		}
		return r.GetValue().GetStructValue(), nil
	}
	sv, err := read(SummaryPrefix + suffix)
	if err != nil {
		return "", "", nil, err
	}
	cv, err := read(SummaryCoversPrefix + suffix)
	if err != nil {
		return "", "", nil, err
	}
	text = strings.TrimSpace(sv.GetFields()["summary"].GetStringValue())
	list := cv.GetFields()["covers"].GetListValue()
	if text == "" || list == nil {
		if h.Log != nil {
			h.Log.Warn("ignoring unreadable session summary", "key", SummaryPrefix+suffix)
		}
		return "", "", nil, nil
	}
	covers = map[string]bool{}
	for _, v := range list.GetValues() {
		covers[v.GetStringValue()] = true
	}
	return text, suffix, covers, nil
}

// sessionMemory follows, through one invocation's compactions, which
// history entries the context's leading summary folds in.
type sessionMemory struct {
	loaded  string   // suffix of the summary loaded, "" none
	lead    bool     // messages[0] is a summary message
	covered []string // entries folded into messages[0], when lead
	entries []entrySpan
	// summary is the text of the latest summary made by this
	// invocation; "" when it made none.
	summary string
	// loadedCovered is covered as loaded, to tell whether a new summary
	// covers anything more; keepsLoaded is whether messages[0] still
	// holds the loaded summary's content (the sliding window may drop it).
	loadedCovered int
	keepsLoaded   bool
}

// newSessionMemory starts from what LoadSession read.
func newSessionMemory(s *loadedSession) *sessionMemory {
	return &sessionMemory{
		loaded: s.summaryKey, lead: s.summaryKey != "", covered: slices.Clone(s.covered),
		entries: slices.Clone(s.entries), loadedCovered: len(s.covered), keepsLoaded: s.summaryKey != "",
	}
}

// compacted updates m after the strategy replaced msgs by out.
func (m *sessionMemory) compacted(rep *compaction.Report, out []provider.Message) {
	if m == nil {
		return
	}
	if rep.Strategy == compaction.NameSummarize && len(out) > 0 && compaction.IsSummary(out[0]) {
		k := rep.Summarized
		var covered []string
		if m.lead {
			covered = m.covered
		}
		var kept []entrySpan
		for _, e := range m.entries {
			switch {
			case e.end <= k:
				if e.whole {
					covered = append(covered, e.key)
				}
			case e.start < k:
				kept = append(kept, entrySpan{key: e.key, start: 1, end: e.end - k + 1})
			default:
				kept = append(kept, entrySpan{key: e.key, start: e.start - k + 1, end: e.end - k + 1, whole: e.whole})
			}
		}
		m.lead, m.covered, m.entries = true, covered, kept
		m.summary = strings.TrimPrefix(out[0].Parts[0].Text, compaction.SummaryHeader+"\n")
		return
	}
	d := rep.Dropped
	if d <= 0 {
		return
	}
	if m.lead {
		m.lead, m.covered, m.keepsLoaded, m.summary = false, nil, false, ""
	}
	var kept []entrySpan
	for _, e := range m.entries {
		switch {
		case e.end <= d:
		case e.start < d:
			kept = append(kept, entrySpan{key: e.key, start: 0, end: e.end - d})
		default:
			kept = append(kept, entrySpan{key: e.key, start: e.start - d, end: e.end - d, whole: e.whole})
		}
	}
	m.entries = kept
}

// effects are the WriteMemory (and DeleteMemory) effects that persist
// the invocation's summary: none when it made none, or when its summary
// folds in no entry beyond the loaded one's.
func (m *sessionMemory) effects(sc *typesv1.Scope, keyBase string) ([]*typesv1.Effect, error) {
	if m == nil || m.summary == "" || !m.lead {
		return nil, nil
	}
	if n := len(m.covered); n == 0 || (m.keepsLoaded && n <= m.loadedCovered) {
		return nil, nil
	}
	epoch := strings.TrimPrefix(slices.Max(m.covered), HistoryPrefix)
	if m.keepsLoaded {
		// Never sort below the summary folded in (its oldest entries may
		// have left the window).
		if i := strings.LastIndexByte(m.loaded, '~'); i >= 0 && m.loaded[:i] > epoch {
			epoch = m.loaded[:i]
		}
	}
	suffix := epoch + "~" + shortKey(keyBase)
	covers := make([]any, len(m.covered))
	for i, k := range m.covered {
		covers[i] = k
	}
	cv, err := structpb.NewValue(map[string]any{"version": summaryVersion, "covers": covers})
	if err != nil {
		return nil, fmt.Errorf("encoding the summary's entries: %v: %w", err, errs.Internal)
	}
	sv, err := structpb.NewValue(map[string]any{"version": summaryVersion, "summary": m.summary})
	if err != nil {
		return nil, fmt.Errorf("encoding the summary: %v: %w", err, errs.Internal)
	}
	out := []*typesv1.Effect{
		{IdempotencyKey: keyBase + "/summary-covers", Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{
			Scope: sc, Key: SummaryCoversPrefix + suffix, Value: cv, Unindexed: true,
		}}},
		{IdempotencyKey: keyBase + "/summary", Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{
			Scope: sc, Key: SummaryPrefix + suffix, Value: sv,
		}}},
	}
	if m.keepsLoaded && m.loaded < suffix {
		// The loaded summary is folded into this one: it goes.
		out = append(out,
			&typesv1.Effect{IdempotencyKey: keyBase + "/summary-delete", Kind: &typesv1.Effect_DeleteMemory{DeleteMemory: &typesv1.DeleteMemory{
				Scope: sc, Key: SummaryPrefix + m.loaded,
			}}},
			&typesv1.Effect{IdempotencyKey: keyBase + "/summary-covers-delete", Kind: &typesv1.Effect_DeleteMemory{DeleteMemory: &typesv1.DeleteMemory{
				Scope: sc, Key: SummaryCoversPrefix + m.loaded,
			}}},
		)
	}
	return out, nil
}
