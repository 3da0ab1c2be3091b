package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// Retention: the State service deletes what a policy says is no longer
// worth keeping, from a background sweeper (Config.Retention, the
// --retention and --retention-file flags).
//
// A RetentionRule selects keys by scope and key prefix and bounds them
// per scope: MaxAge deletes the keys last written longer ago than that,
// MaxEntries keeps only the most recently written MaxEntries keys of each
// scope (oldest-first deletion). Rules apply independently; a key is
// deleted when any rule that selects it says so.
//
// How old a key is: stored values carry no timestamp, but revisions come
// from one counter per store. At every sweep the sweeper notes (time,
// last revision); a key whose revision is at most the revision noted at
// time t was last written at or before t. A key is deleted by MaxAge once
// a note at least MaxAge old covers its revision, so it goes up to one
// sweep interval late, never early. The bbolt backend keeps the notes in
// its meta bucket (key "retention_marks"), so ages survive a restart; the
// memory backend keeps them in memory, like its data. After the first
// start with a rule, keys already stored count as written then.
//
// Every deletion is an ordinary Delete with the key's revision as
// expected_revision: a key rewritten since the sweep read it is kept
// (its newer write is not what the rule selected), and the full-text and
// vector indexes are kept in step exactly as for a client's Delete.
//
// Idempotency: the sweeper never touches idempotency records. A retry of
// a write whose key retention has since deleted is still recognised
// within the idempotency window (--idempotency-retention): it is not
// applied again, so a retry never resurrects what the policy removed, and
// it answers with the first attempt's revision and replayed = true, as
// for any retry after a later change of the key. A compare-and-set on
// that revision then fails STALE_REVISION, like one after any other
// writer's change. Nothing else is affected: a rule never deletes a key
// written after the sweep read the store, and MaxEntries keeps the newest
// keys, the ones a retry can concern.
//
// PostgreSQL: the notes are in state_meta, shared by the replicas, each
// running its own sweeper (the deletions are compare-and-set, so two
// sweepers never remove a newer write); the vector change log's trigger
// carries the deletions to every replica's index (retention_postgres.go).
type RetentionRule struct {
	// Scope selects scopes: "*" (every scope), a kind ("session",
	// "workflow", "agent", "global", "custom": every scope of that kind),
	// or one scope as logs show it (session:"s1", with or without the
	// quotes).
	Scope string `json:"scope"`
	// Prefix selects the keys that start with it; "" selects every key.
	Prefix string `json:"prefix,omitempty"`
	// MaxAge deletes keys last written longer ago; 0: no age limit.
	MaxAge time.Duration `json:"-"`
	// MaxEntries keeps at most this many keys per scope, the most
	// recently written; 0: no count limit.
	MaxEntries int `json:"max_entries,omitempty"`
}

// String renders r in --retention's form.
func (r RetentionRule) String() string {
	parts := []string{"scope=" + r.Scope}
	if r.Prefix != "" {
		parts = append(parts, "prefix="+r.Prefix)
	}
	if r.MaxAge > 0 {
		parts = append(parts, "max-age="+r.MaxAge.String())
	}
	if r.MaxEntries > 0 {
		parts = append(parts, "max-entries="+strconv.Itoa(r.MaxEntries))
	}
	return strings.Join(parts, ",")
}

var scopeKinds = []string{"session", "workflow", "agent", "global", "custom"}

func (r RetentionRule) check() error {
	switch {
	case r.Scope == "":
		return errors.New(`scope is required: "*", a kind (session, workflow, agent, global, custom) or one scope such as session:"s1"`)
	case r.Scope != "*" && !slices.Contains(scopeKinds, r.Scope) && !strings.Contains(r.Scope, ":"):
		return fmt.Errorf(`scope %q: want "*", a kind (session, workflow, agent, global, custom) or one scope such as session:"s1"`, r.Scope)
	case r.MaxAge < 0 || r.MaxEntries < 0:
		return errors.New("max-age and max-entries must not be negative")
	case r.MaxAge == 0 && r.MaxEntries == 0:
		return errors.New("a rule needs max-age or max-entries")
	}
	return nil
}

// matches reports whether r selects key in scope s (rendered as str).
func (r RetentionRule) matches(str, key string) bool {
	if !strings.HasPrefix(key, r.Prefix) {
		return false
	}
	switch {
	case r.Scope == "*":
		return true
	case !strings.Contains(r.Scope, ":"):
		kind, _, _ := strings.Cut(str, ":")
		return kind == r.Scope
	}
	return r.Scope == str || r.Scope == strings.ReplaceAll(str, `"`, "")
}

// ParseRetention parses --retention: rules separated by ";", each a
// comma-separated list of scope=, prefix=, max-age= (a Go duration such
// as 720h) and max-entries=, e.g.
//
//	scope=session,prefix=conversation/,max-age=720h,max-entries=1000;scope=global,max-age=2160h
//
// A prefix holding "," or ";" needs --retention-file.
func ParseRetention(s string) ([]RetentionRule, error) {
	var rules []RetentionRule
	for i, spec := range strings.Split(s, ";") {
		spec = strings.TrimSpace(spec)
		if spec == "" {
			continue
		}
		var r RetentionRule
		for _, f := range strings.Split(spec, ",") {
			name, val, ok := strings.Cut(strings.TrimSpace(f), "=")
			if !ok {
				return nil, fmt.Errorf("retention rule %d: %q is not name=value", i+1, f)
			}
			var err error
			switch name {
			case "scope":
				r.Scope = val
			case "prefix":
				r.Prefix = val
			case "max-age":
				r.MaxAge, err = time.ParseDuration(val)
			case "max-entries":
				r.MaxEntries, err = strconv.Atoi(val)
			default:
				return nil, fmt.Errorf("retention rule %d: unknown field %q: want scope, prefix, max-age or max-entries", i+1, name)
			}
			if err != nil {
				return nil, fmt.Errorf("retention rule %d: %s: %v", i+1, name, err)
			}
		}
		if err := r.check(); err != nil {
			return nil, fmt.Errorf("retention rule %d (%s): %v", i+1, spec, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// ReadRetentionFile reads --retention-file, a JSON file of rules:
//
//	{"rules": [{"scope": "session", "prefix": "conversation/", "max_age": "720h", "max_entries": 1000}]}
func ReadRetentionFile(path string) ([]RetentionRule, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Rules []struct {
			RetentionRule
			MaxAge string `json:"max_age"`
		} `json:"rules"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	rules := make([]RetentionRule, 0, len(f.Rules))
	for i, fr := range f.Rules {
		r := fr.RetentionRule
		if fr.MaxAge != "" {
			if r.MaxAge, err = time.ParseDuration(fr.MaxAge); err != nil {
				return nil, fmt.Errorf("%s: rule %d: max_age: %v", path, i+1, err)
			}
		}
		if err := r.check(); err != nil {
			return nil, fmt.Errorf("%s: rule %d: %v", path, i+1, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// DefaultRetentionInterval is the time between sweeps (--retention-interval).
const DefaultRetentionInterval = time.Minute

// retentionStore is a Backend the sweeper can enumerate.
type retentionStore interface {
	Backend
	// retentionScan calls fn with every stored key (of every scope), its
	// encoded scope and revision, from one snapshot, and returns the last
	// revision taken in that snapshot.
	retentionScan(ctx context.Context, fn func(enc []byte, key string, rev uint64)) (last uint64, err error)
	// loadMarks and saveMarks keep the sweeper's (time, revision) notes.
	loadMarks() ([]retentionMark, error)
	saveMarks([]retentionMark) error
}

// retentionMark notes that every revision up to rev was written at or
// before at.
type retentionMark struct {
	at  time.Time
	rev uint64
}

// Removed is one key a sweep deleted.
type Removed struct {
	Scope *typesv1.Scope
	Key   string
	// Rule is the rule that deleted it, in --retention's form; Reason is
	// "max-age" or "max-entries".
	Rule, Reason string
}

// Sweeper applies retention rules to a store.
type Sweeper struct {
	store retentionStore
	rules []RetentionRule
	now   func() time.Time
	log   *slog.Logger
	marks []retentionMark
}

// NewSweeper returns a sweeper of rules over b, reading time from now
// (time.Now when nil). b must be a bbolt, memory or PostgreSQL backend:
// another is an error wrapping errs.FailedPrecondition.
func NewSweeper(b Backend, rules []RetentionRule, now func() time.Time, log *slog.Logger) (*Sweeper, error) {
	rs, ok := b.(retentionStore)
	if !ok {
		return nil, fmt.Errorf("retention rules are enforced on the bolt, memory and postgres backends only, not on %T: %w", b, errs.FailedPrecondition)
	}
	for i, r := range rules {
		if err := r.check(); err != nil {
			return nil, fmt.Errorf("retention rule %d: %v: %w", i+1, err, errs.InvalidArgument)
		}
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	marks, err := rs.loadMarks()
	if err != nil {
		return nil, fmt.Errorf("reading retention marks: %w", err)
	}
	return &Sweeper{store: rs, rules: slices.Clone(rules), now: now, log: log, marks: marks}, nil
}

// Run sweeps every interval until ctx ends, logging failures.
func (s *Sweeper) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultRetentionInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("retention sweep failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type candidate struct {
	key string
	rev uint64
}

// Sweep applies the rules once and returns what it deleted, oldest
// first within each scope. It logs each scope's deletions at INFO.
func (s *Sweeper) Sweep(ctx context.Context) ([]Removed, error) {
	now := s.now()
	// per rule, per encoded scope: the keys it selects.
	sel := make([]map[string][]candidate, len(s.rules))
	for i := range sel {
		sel[i] = map[string][]candidate{}
	}
	names := map[string]string{} // encoded scope -> scope.String
	last, err := s.store.retentionScan(ctx, func(enc []byte, key string, rev uint64) {
		name, ok := names[string(enc)]
		if !ok {
			sc, err := scope.Decode(enc)
			if err != nil {
				return
			}
			name = scope.String(sc)
			names[string(enc)] = name
		}
		for i, r := range s.rules {
			if r.matches(name, key) {
				sel[i][string(enc)] = append(sel[i][string(enc)], candidate{key, rev})
			}
		}
	})
	if err != nil {
		return nil, err
	}
	s.note(now, last)

	var removed []Removed
	gone := map[string]bool{} // encoded scope + key, deleted by an earlier rule
	for i, r := range s.rules {
		cutoff := s.cutoff(now, r.MaxAge)
		for enc, cands := range sel[i] {
			slices.SortFunc(cands, func(a, b candidate) int { return cmpU64(a.rev, b.rev) })
			sc, err := scope.Decode([]byte(enc))
			if err != nil {
				continue
			}
			var del []Removed
			kept := len(cands)
			for j, c := range cands {
				reason := ""
				switch {
				case r.MaxAge > 0 && c.rev <= cutoff:
					reason = "max-age"
				case r.MaxEntries > 0 && len(cands)-j > r.MaxEntries:
					reason = "max-entries"
				default:
					continue
				}
				if gone[enc+c.key] {
					kept--
					continue
				}
				rev := c.rev
				_, err := s.store.Delete(ctx, sc, c.key, Guard{ExpectedRevision: &rev})
				switch {
				case err == nil:
				case errors.Is(err, errs.StaleRevision):
					continue // rewritten since the scan: its new write is kept
				default:
					return removed, fmt.Errorf("retention: deleting %q in %s: %w", c.key, scope.String(sc), err)
				}
				gone[enc+c.key] = true
				kept--
				del = append(del, Removed{Scope: sc, Key: c.key, Rule: r.String(), Reason: reason})
			}
			if len(del) > 0 {
				s.log.Info("retention removed keys", "scope", scope.String(sc), "rule", r.String(), "removed", len(del), "kept", kept,
					"oldest", del[0].Key, "newest", del[len(del)-1].Key)
				removed = append(removed, del...)
			}
		}
	}
	return removed, nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// note records that every revision up to last was written by now, and
// forgets the notes no rule needs any more.
func (s *Sweeper) note(now time.Time, last uint64) {
	// When nothing was written since the last note, that older note says
	// more.
	if n := len(s.marks); n == 0 || s.marks[n-1].rev != last {
		s.marks = append(s.marks, retentionMark{at: now, rev: last})
	}
	var maxAge time.Duration
	for _, r := range s.rules {
		maxAge = max(maxAge, r.MaxAge)
	}
	// Keep the newest note at least maxAge old, and every later one.
	keep := 0
	for i, m := range s.marks {
		if now.Sub(m.at) >= maxAge {
			keep = i
		}
	}
	s.marks = slices.Clone(s.marks[keep:])
	if err := s.store.saveMarks(s.marks); err != nil {
		s.log.Warn("saving retention marks failed; ages restart from the next sweep after a restart", "err", err)
	}
}

// cutoff is the highest revision known written at least maxAge before
// now; 0 when none is (or maxAge is 0).
func (s *Sweeper) cutoff(now time.Time, maxAge time.Duration) uint64 {
	if maxAge <= 0 {
		return 0
	}
	var rev uint64
	for _, m := range s.marks {
		if now.Sub(m.at) >= maxAge {
			rev = max(rev, m.rev)
		}
	}
	return rev
}
