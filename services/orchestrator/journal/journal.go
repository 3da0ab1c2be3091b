package journal

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/shopspring/decimal"
	bolt "go.etcd.io/bbolt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/boltcheck"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
	"github.com/secbear/neuron/services/orchestrator"
)

// The journal is one bbolt file. Layout (schema version 3):
//
//	meta/schema_version   the layout's version, checked at open
//	meta/secret           HMAC key of page tokens
//	meta/epoch            bumped at every open; lifecycle sequences start at epoch*1e9
//	meta/finished         how many finished workflows ended/ holds (u64 BE)
//	index/<created ns BE><id>  -> status byte (ListWorkflows, newest first)
//	live/<created ns BE><id>   -> status byte, for RUNNING and SUSPENDED
//	                      workflows only (what a start reads)
//	ended/<ended ns BE><id>    -> created ns BE, for finished workflows,
//	                      oldest end first (what retention deletes)
//	workflows/<id>/       one bucket per workflow:
//	    r                 the record
//	    s<n BE>           step n: agent, input, then output or error
//	    e<effect key>     an effect's outcome, once executed
//	    g<seq BE>         signal seq: payload, key, delivering step
//	    k<signal key>     seq of an idempotent signal
//	    l<agent id>       a registry lookup, as the workflow first saw it
//	    v<pos BE>         event pos of the workflow's event log (binary LifecycleEvent)
//	    n                 the log's last position
//	    w                 how many of the workflow's own events the log holds
//
// The records (r, s, e, g, l) are these structs in the binary form of
// codec.go, protobuf values inside them in theirs. They are the stored
// format: a field may be added (older files read it as zero), never
// renamed, renumbered or given another meaning; anything else bumps
// schemaVersion, which an older orchestrator then refuses to open.
// Version 2 added live, ended and meta/finished (indexes.go); Open
// migrates a version 1 file by building them once. Version 3 writes the
// records in binary instead of JSON; it reads the JSON records of older
// files as they are (Open rewrites nothing), and a record is binary once
// it is next written.

var (
	bucketMeta      = []byte("meta")
	bucketIndex     = []byte("index")
	bucketWorkflows = []byte("workflows")
	bucketLive      = []byte("live")
	bucketEnded     = []byte("ended")
	keyFinished     = []byte("finished")
	keyRecord       = []byte("r")
	keySecret       = []byte("secret")
	keyEpoch        = []byte("epoch")
	keySchema       = []byte("schema_version")
)

// schemaVersion is the journal layout this build reads and writes.
const schemaVersion = 3

const (
	prefixStep   = 's'
	prefixEffect = 'e'
	prefixSignal = 'g'
	prefixSigKey = 'k'
	prefixLookup = 'l'
	prefixEvent  = 'v'
)

var (
	keyLogEnd  = []byte("n")
	keyLogOwn  = []byte("w")
	maxLogPage = 512
)

// DefaultLockTimeout is how long Open waits for another process to release
// the journal file.
const DefaultLockTimeout = 10 * time.Second

// errSchema says the file is of a layout this build does not read.
var errSchema = errors.New("the journal's schema version is not one this build reads")

func schemaOf(v []byte) string {
	if len(v) != 8 {
		return fmt.Sprintf("%q (malformed)", v)
	}
	return fmt.Sprint(binary.BigEndian.Uint64(v))
}

// errJournalLocked says another process holds the journal.
var errJournalLocked = errors.New("the journal is locked by another process (is another orchestrator running with this --data-dir?)")

// failure is a terminal error kept in the journal.
type failure struct {
	Code    int32             `json:"code"`
	Message string            `json:"message"`
	Reason  string            `json:"reason,omitempty"`
	Meta    map[string]string `json:"metadata,omitempty"`
}

// record is a workflow's journaled header.
type record struct {
	ID           string                        `json:"id"`
	Status       orchestratorv1.WorkflowStatus `json:"status"`
	RootAgent    string                        `json:"root_agent"`
	CurrentAgent string                        `json:"current_agent"`
	Steps        uint32                        `json:"steps"`
	Spent        decimal.Decimal               `json:"spent"`
	Budget       decimal.NullDecimal           `json:"budget"`
	LastOutput   []byte                        `json:"last_output,omitempty"`
	Failure      *failure                      `json:"failure,omitempty"`
	Created      time.Time                     `json:"created"`
	Updated      time.Time                     `json:"updated"`
	// Fingerprint identifies the request that created the workflow, so a
	// retried Dispatch is told apart from a different one reusing the id.
	Fingerprint string `json:"fingerprint"`
	// Input is the first invocation (OperatorInput, binary).
	Input []byte `json:"input"`
	// Deadline is the Dispatch caller's deadline; zero for none.
	Deadline time.Time `json:"deadline,omitzero"`
	// Trace is the W3C trace context of the call that started it.
	Trace map[string]string `json:"trace,omitempty"`
	// SignalSeq is the last signal sequence issued; Pending counts the
	// signals not yet delivered.
	SignalSeq uint64 `json:"signal_seq"`
	Pending   uint32 `json:"pending"`
	// Detached workflows (StartWorkflow) outlive their caller.
	Detached bool `json:"detached,omitempty"`
	// The settings frozen at start; zero in records written before they
	// were kept (the orchestrator's options then apply).
	MaxDepth     uint32 `json:"max_depth,omitempty"`
	MaxSteps     uint64 `json:"max_steps,omitempty"`
	WarnFraction string `json:"warn_fraction,omitempty"`
	// RootRevision is the root agent's definition revision the workflow
	// started with (0: a registry without revisions); its lookup of the
	// root agent reads that revision.
	RootRevision uint64 `json:"root_revision,omitempty"`
	// AskLimits: it waits for a raise at a limit (Spec.AskLimits).
	AskLimits bool `json:"ask_limits,omitempty"`
	// Asking is the limit it waits to have raised while SUSPENDED (empty:
	// it waits for something else).
	Asking string `json:"asking,omitempty"`
	// Limit and LimitSteps are its budget and limit of operator calls as
	// UpdateWorkflowLimits last changed them (Budget and MaxSteps stay
	// what it started with: a run from the top starts there again).
	Limit      decimal.NullDecimal `json:"limit,omitzero"`
	LimitSteps uint64              `json:"limit_steps,omitempty"`
}

// lookupRecord is a registry lookup as the workflow first saw it.
type lookupRecord struct {
	Err            string        `json:"err,omitempty"`
	Code           int32         `json:"code,omitempty"`
	Model          string        `json:"model,omitempty"`
	DowngradeModel string        `json:"downgrade_model,omitempty"`
	Attempts       int           `json:"attempts"`
	Initial        time.Duration `json:"initial"`
	MaxBackoff     time.Duration `json:"max_backoff"`
	// The definition revision and delegation allowlist the workflow uses
	// for this agent (orchestrator.AgentInfo).
	Revision      uint64   `json:"revision,omitempty"`
	Restricted    bool     `json:"restricted,omitempty"`
	AllowedAgents []string `json:"allowed_agents,omitempty"`
}

func (r *record) terminal() bool { return orchestrator.Terminal(r.Status) }

// stepRecord is one operator call: its intent, then its result.
type stepRecord struct {
	Agent string `json:"agent"`
	// Input is the OperatorInput sent (binary), signals folded in.
	Input []byte `json:"input"`
	// Output is set once the call returned (binary OperatorOutput).
	Output []byte `json:"output,omitempty"`
	// Error is set when the call failed for good.
	Error *failure `json:"error,omitempty"`
	// Signals delivered with this call, by sequence.
	Signals []uint64  `json:"signals,omitempty"`
	Started time.Time `json:"started"`
}

func (s *stepRecord) done() bool { return s.Output != nil || s.Error != nil }

// effectRecord is what happened to one effect.
type effectRecord struct {
	Applied bool   `json:"applied"`
	Detail  string `json:"detail,omitempty"`
	// Events the effect produced (binary LifecycleEvents).
	Events [][]byte  `json:"events,omitempty"`
	Step   uint64    `json:"step"`
	Time   time.Time `json:"time"`
}

// signalRecord is one accepted signal.
type signalRecord struct {
	Seq      uint64    `json:"seq"`
	Payload  []byte    `json:"payload"` // binary SignalPayload
	Key      string    `json:"key,omitempty"`
	Step     uint64    `json:"step,omitempty"` // the step that delivered it; 0 while pending
	Accepted time.Time `json:"accepted"`
}

// Journal is the orchestrator's durable record of every workflow.
type Journal struct {
	db     *bolt.DB
	secret []byte
	epoch  uint64
	commit *committer
	// retain is the background pruning Retain started; Close stops it.
	retain *retainer
}

// Open opens (creating if needed) the journal file at path. A file of
// another schema version is refused, and so is a damaged one (cut short,
// both meta pages invalid, a page overwritten: an error wrapping
// boltcheck.ErrDamaged that says what to do), before bbolt maps it; one
// invalid meta page is logged at ERROR (WithLogger) and the file opened
// at the other.
func Open(path string, lockTimeout time.Duration, opts ...OpenOption) (*Journal, error) {
	if lockTimeout <= 0 {
		lockTimeout = DefaultLockTimeout
	}
	var o openOptions
	for _, opt := range opts {
		opt(&o)
	}
	checked, err := boltcheck.Check(path, lockTimeout)
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("open journal %s: %w (waited %s)", path, errJournalLocked, lockTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	if o.log == nil && checked.Warns() {
		o.log = slog.Default() // never drop a warning
	}
	if o.log != nil {
		checked.Log(o.log, path)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        lockTimeout,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		NoSync:         o.noSync,
	})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("open journal %s: %w (waited %s)", path, errJournalLocked, lockTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	j := &Journal{db: db}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		// Files written before the version was kept have version 1's
		// layout; version 1 is migrated (indexes.go).
		from := uint64(1)
		if v := meta.Get(keySchema); v != nil {
			if len(v) != 8 || binary.BigEndian.Uint64(v) < 1 || binary.BigEndian.Uint64(v) > schemaVersion {
				return fmt.Errorf("%w: the file has schema version %s; this orchestrator reads version %d (run the orchestrator release that wrote it, or start with another --data-dir)",
					errSchema, schemaOf(v), schemaVersion)
			}
			from = binary.BigEndian.Uint64(v)
		}
		for _, b := range [][]byte{bucketIndex, bucketWorkflows, bucketLive, bucketEnded} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if from < schemaVersion {
			if err := migrate(tx, from); err != nil {
				return fmt.Errorf("migrate from schema version %d to %d: %w", from, schemaVersion, err)
			}
			if err := meta.Put(keySchema, u64(schemaVersion)); err != nil {
				return err
			}
		}
		if s := meta.Get(keySecret); len(s) == 32 {
			j.secret = bytes.Clone(s)
		} else {
			j.secret = make([]byte, 32)
			_, _ = rand.Read(j.secret)
			if err := meta.Put(keySecret, j.secret); err != nil {
				return err
			}
		}
		if e := meta.Get(keyEpoch); len(e) == 8 {
			j.epoch = binary.BigEndian.Uint64(e)
		}
		j.epoch++
		return meta.Put(keyEpoch, u64(j.epoch))
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("initialise journal %s: %w", path, err)
	}
	j.commit = newCommitter(db)
	return j, nil
}

// Close waits for writes in flight, then closes the file.
func (j *Journal) Close() error {
	j.retain.stop()
	j.commit.close()
	return j.db.Close()
}

// update runs fn in a write transaction shared with the writes queued
// behind it (group commit: one fsync for many workflows).
func (j *Journal) update(fn func(tx *bolt.Tx) error) error { return j.commit.do(fn) }

// Epoch is bumped by every open of the journal.
func (j *Journal) Epoch() uint64 { return j.epoch }

func u64(n uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return b[:]
}

// prefixed is a workflow bucket's key: a prefix byte, then key.
func prefixed(prefix byte, key []byte) []byte {
	k := make([]byte, 1+len(key))
	k[0] = prefix
	copy(k[1:], key)
	return k
}

// seqKey is prefix, then n big-endian.
func seqKey(prefix byte, n uint64) []byte {
	k := make([]byte, 9)
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:], n)
	return k
}

func stepKey(n uint64) []byte     { return seqKey(prefixStep, n) }
func signalKey(n uint64) []byte   { return seqKey(prefixSignal, n) }
func eventKey(n uint64) []byte    { return seqKey(prefixEvent, n) }
func effectKey(key string) []byte { return prefixed(prefixEffect, []byte(key)) }

func indexKey(r *record) []byte {
	k := make([]byte, 8+len(r.ID))
	binary.BigEndian.PutUint64(k, uint64(r.Created.UnixNano()))
	copy(k[8:], r.ID)
	return k
}

func notFound(id string) error {
	return fmt.Errorf("workflow %q does not exist: %w", id, errs.NotFound)
}

func wfBucket(tx *bolt.Tx, id string) *bolt.Bucket {
	return tx.Bucket(bucketWorkflows).Bucket([]byte(id))
}

// get decodes the entry at key into v; false when there is none.
func get(b *bolt.Bucket, key []byte, v codec) (bool, error) {
	raw := b.Get(key)
	if raw == nil {
		return false, nil
	}
	if err := v.unmarshal(raw); err != nil {
		return false, fmt.Errorf("journal entry %q is corrupt: %w", key, err)
	}
	return true, nil
}

// put stores v at key, in the binary form.
func put(b *bolt.Bucket, key []byte, v codec) error { return b.Put(key, v.marshal()) }

// view runs fn on workflow id's bucket in a read transaction; an
// unknown id is NotFound.
func (j *Journal) view(id string, fn func(b *bolt.Bucket) error) error {
	return j.db.View(func(tx *bolt.Tx) error {
		b := wfBucket(tx, id)
		if b == nil {
			return notFound(id)
		}
		return fn(b)
	})
}

// scan decodes every entry of b whose key starts with prefix, in key
// order, passing the key without its prefix (valid only in the
// transaction).
func scan[T any, P interface {
	*T
	codec
}](b *bolt.Bucket, prefix byte, fn func(key []byte, v P)) error {
	c := b.Cursor()
	for k, v := c.Seek([]byte{prefix}); k != nil && k[0] == prefix; k, v = c.Next() {
		rec := P(new(T))
		if err := rec.unmarshal(v); err != nil {
			return fmt.Errorf("journal entry %q is corrupt: %w", k, err)
		}
		fn(k[1:], rec)
	}
	return nil
}

func readRecord(b *bolt.Bucket) (*record, error) {
	var r record
	ok, err := get(b, keyRecord, &r)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("journal: workflow bucket without a record")
	}
	return &r, nil
}

// writeRecord stores r and keeps the status indexes in step.
func writeRecord(tx *bolt.Tx, b *bolt.Bucket, r *record) error {
	if err := put(b, keyRecord, r); err != nil {
		return err
	}
	return indexStatus(tx, r)
}

// wtx is one workflow's part of a write transaction: its bucket; its
// record, decoded at most once and, once changed, written back once at
// the end of the write with Updated set to the time of the write; and
// its event log's counters, read at most once and written once.
type wtx struct {
	tx    *bolt.Tx
	b     *bolt.Bucket
	r     *record
	dirty bool
	// logEnd is the log's last position once read (logRead); logOwn,
	// when set, how many of the workflow's own events the log holds.
	logEnd          uint64
	logOwn          uint64
	logRead, setEnd bool
	setOwn          bool
}

// log appends raws (binary LifecycleEvents) at the next positions of
// the workflow's event log, each with its position as its
// workflow_sequence, and returns the last position.
func (w *wtx) log(raws ...[]byte) (uint64, error) {
	if !w.logRead {
		w.logEnd, w.logRead = getU64(w.b, keyLogEnd), true
	}
	for _, raw := range raws {
		w.logEnd++
		if err := w.b.Put(eventKey(w.logEnd), withSequence(raw, w.logEnd)); err != nil {
			return 0, err
		}
	}
	w.setEnd = w.setEnd || len(raws) > 0
	return w.logEnd, nil
}

// logEvent appends ev to the workflow's event log, setting its
// WorkflowSequence.
func (w *wtx) logEvent(ev *lifecyclev1.LifecycleEvent) error {
	if !w.logRead {
		w.logEnd, w.logRead = getU64(w.b, keyLogEnd), true
	}
	ev.WorkflowSequence = w.logEnd + 1
	raw, err := lifecycle.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = w.log(raw)
	return err
}

// own records that the log holds the workflow's first n own events.
func (w *wtx) own(n uint64) { w.logOwn, w.setOwn = n, true }

// finish writes what the ops changed: the log's counters, the record.
func (w *wtx) finish() error {
	if w.setEnd {
		if err := w.b.Put(keyLogEnd, u64(w.logEnd)); err != nil {
			return err
		}
	}
	if w.setOwn {
		if err := w.b.Put(keyLogOwn, u64(w.logOwn)); err != nil {
			return err
		}
	}
	if !w.dirty {
		return nil
	}
	w.r.Updated = time.Now()
	return writeRecord(w.tx, w.b, w.r)
}

// record returns the workflow's record as the transaction has it.
func (w *wtx) record() (*record, error) {
	if w.r == nil {
		r, err := readRecord(w.b)
		if err != nil {
			return nil, err
		}
		w.r = r
	}
	return w.r, nil
}

// change returns the record for a change, which the write stores.
func (w *wtx) change() (*record, error) {
	r, err := w.record()
	if err == nil {
		w.dirty = true
	}
	return r, err
}

// op is one change of a workflow, made in a write.
type op func(w *wtx) error

// existsError: the workflow a write was to create exists.
type existsError struct{ existing *record }

func (e *existsError) Error() string { return fmt.Sprintf("workflow %q exists", e.existing.ID) }

// write applies ops, in order, to workflow id in one transaction of the
// group commit, and returns once the transaction is durable. With create
// set, the workflow is created from it first; when it exists, nothing is
// written and the error is an *existsError with its record. An error of
// an op rolls the whole write back (and only it: the writes of other
// workflows sharing the transaction are committed without it). ops may
// run more than once (the group commit runs a transaction again without
// a write that failed): they change nothing outside the transaction but
// what they report.
func (j *Journal) write(id string, create *record, ops ...op) error {
	return j.update(func(tx *bolt.Tx) error {
		all := tx.Bucket(bucketWorkflows)
		w := &wtx{tx: tx, b: all.Bucket([]byte(id))}
		switch {
		case create != nil && w.b != nil:
			r, err := readRecord(w.b)
			if err != nil {
				return err
			}
			return &existsError{r}
		case create != nil:
			b, err := all.CreateBucket([]byte(id))
			if err != nil {
				return err
			}
			r := *create // ops change it; a second run starts from create again
			w.b, w.r, w.dirty = b, &r, true
		case w.b == nil:
			return notFound(id)
		}
		for _, op := range ops {
			if err := op(w); err != nil {
				return err
			}
		}
		return w.finish()
	})
}

// Create stores a new workflow. When the id exists it returns the
// existing record and created=false, changing nothing.
func (j *Journal) Create(r *record) (existing *record, created bool, err error) {
	var ex *existsError
	switch err := j.write(r.ID, r); {
	case errors.As(err, &ex):
		return ex.existing, false, nil
	case err != nil:
		return nil, false, err
	}
	return nil, true, nil
}

// Get returns a workflow's record, or NotFound.
func (j *Journal) Get(id string) (*record, error) {
	var r *record
	err := j.view(id, func(b *bolt.Bucket) (err error) {
		r, err = readRecord(b)
		return err
	})
	return r, err
}

// Update changes a record in one transaction, after the ops in also. fn
// may return errNoChange to leave it as it is (and write nothing).
func (j *Journal) Update(id string, fn func(r *record) error, also ...op) (*record, error) {
	var out *record
	err := j.write(id, nil, append(also, updateRecord(fn, &out))...)
	if errors.Is(err, errNoChange) {
		err = nil
	}
	return out, err
}

// updateRecord is fn applied to the record; *out is the record.
func updateRecord(fn func(r *record) error, out **record) op {
	return func(w *wtx) error {
		r, err := w.record()
		if err != nil {
			return err
		}
		*out = r
		if err := fn(r); err != nil {
			return err
		}
		w.dirty = true
		return nil
	}
}

// errNoChange lets an Update callback leave the record untouched.
var errNoChange = errors.New("no change")

// Step returns step n, or nil when it was never begun.
func (j *Journal) Step(id string, n uint64) (*stepRecord, error) {
	var s *stepRecord
	err := j.view(id, func(b *bolt.Bucket) error {
		var st stepRecord
		ok, err := get(b, stepKey(n), &st)
		if ok {
			s = &st
		}
		return err
	})
	return s, err
}

// Steps returns every step in order.
func (j *Journal) Steps(id string) ([]*stepRecord, error) {
	var out []*stepRecord
	err := j.view(id, func(b *bolt.Bucket) error {
		return scan(b, prefixStep, func(_ []byte, s *stepRecord) { out = append(out, s) })
	})
	return out, err
}

// BeginStep journals the intent of step n, alone in a write (see
// beginStep).
func (j *Journal) BeginStep(id string, n uint64, plan func(w *wtx, pending []*signalRecord) (*stepRecord, error), also ...op) (*stepRecord, bool, error) {
	var (
		out    *stepRecord
		replay bool
	)
	err := j.write(id, nil, append(also, beginStep(n, plan, &out, &replay))...)
	return out, replay, err
}

// beginStep journals the intent of step n. When step n exists, *out is
// it as journaled and *replay true (a replay). Otherwise plan is called
// with the signals not yet delivered and returns the step to store; the
// signals it lists are marked delivered by step n.
func beginStep(n uint64, plan func(w *wtx, pending []*signalRecord) (*stepRecord, error), out **stepRecord, replay *bool) op {
	return func(w *wtx) error {
		var st stepRecord
		ok, err := get(w.b, stepKey(n), &st)
		if err != nil {
			return err
		}
		*out, *replay = &st, ok
		if ok {
			return nil
		}
		r, err := w.change()
		if err != nil {
			return err
		}
		var pending []*signalRecord
		if r.Pending > 0 { // Pending counts the signals not yet delivered
			if pending, err = pendingSignals(w.b); err != nil {
				return err
			}
		}
		s, err := plan(w, pending)
		if err != nil {
			return err
		}
		for _, sig := range pending {
			if slices.Contains(s.Signals, sig.Seq) {
				sig.Step = n
				if err := put(w.b, signalKey(sig.Seq), sig); err != nil {
					return err
				}
				r.Pending--
			}
		}
		*out = s
		return put(w.b, stepKey(n), s)
	}
}

// putStep stores step n as raw, a stepRecord in its binary form, as
// beginStep stores a step it plans (a workflow's first step, planned
// before the workflow was written: Engine.create's deferral).
func putStep(n uint64, raw []byte) op {
	return func(w *wtx) error {
		if _, err := w.change(); err != nil {
			return err
		}
		return w.b.Put(stepKey(n), raw)
	}
}

// FinishStep stores step n's result and applies update to the record,
// alone in a write (see finishStep).
func (j *Journal) FinishStep(id string, n uint64, s *stepRecord, update func(r *record), also ...op) error {
	return j.write(id, nil, append(also, finishStep(n, s, update))...)
}

// finishStep stores step n's result and applies update (nil: none) to
// the record.
func finishStep(n uint64, s *stepRecord, update func(r *record)) op {
	return func(w *wtx) error {
		if err := put(w.b, stepKey(n), s); err != nil {
			return err
		}
		r, err := w.change()
		if err != nil {
			return err
		}
		if update != nil {
			update(r)
		}
		return nil
	}
}

// eventSeqField is LifecycleEvent.workflow_sequence's field number.
var eventSeqField = protowire.Number((&lifecyclev1.LifecycleEvent{}).ProtoReflect().Descriptor().Fields().ByName("workflow_sequence").Number())

// withSequence is raw, a binary LifecycleEvent, with its
// workflow_sequence set to pos: the field is appended, and the last
// value of a field is the one a parser keeps.
func withSequence(raw []byte, pos uint64) []byte {
	out := make([]byte, len(raw), len(raw)+11)
	copy(out, raw)
	out = protowire.AppendTag(out, eventSeqField, protowire.VarintType)
	return protowire.AppendVarint(out, pos)
}

func getU64(b *bolt.Bucket, key []byte) uint64 {
	if v := b.Get(key); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// Events returns up to maxLogPage events of workflow id's log after
// position after, and whether the workflow has ended.
func (j *Journal) Events(id string, after uint64) ([]*lifecyclev1.LifecycleEvent, bool, error) {
	var (
		out   []*lifecyclev1.LifecycleEvent
		ended bool
	)
	err := j.view(id, func(b *bolt.Bucket) error {
		r, err := readRecord(b)
		if err != nil {
			return err
		}
		ended = r.terminal()
		c := b.Cursor()
		for k, v := c.Seek(eventKey(after + 1)); k != nil && k[0] == prefixEvent; k, v = c.Next() {
			if len(out) == maxLogPage {
				ended = false
				break
			}
			ev := &lifecyclev1.LifecycleEvent{}
			if err := proto.Unmarshal(v, ev); err != nil {
				return fmt.Errorf("journal event %x of workflow %q is corrupt: %w", k[1:], id, err)
			}
			out = append(out, ev)
		}
		return nil
	})
	return out, ended, err
}

// runState is what a run of workflow id starts from, read at once: its
// record, how many of its own events its log holds, and its recorded
// registry lookups.
func (j *Journal) runState(id string) (r *record, published uint64, lookups map[string]*lookupRecord, err error) {
	lookups = map[string]*lookupRecord{}
	err = j.view(id, func(b *bolt.Bucket) error {
		if r, err = readRecord(b); err != nil {
			return err
		}
		published = getU64(b, keyLogOwn)
		return scan(b, prefixLookup, func(agent []byte, l *lookupRecord) { lookups[string(agent)] = l })
	})
	return r, published, lookups, err
}

// final is what Wait answers of a workflow, read in one transaction: its
// record, its steps and its effects' outcomes.
func (j *Journal) final(id string) (r *record, steps []*stepRecord, effects map[string]*effectRecord, err error) {
	effects = map[string]*effectRecord{}
	err = j.view(id, func(b *bolt.Bucket) error {
		if r, err = readRecord(b); err != nil {
			return err
		}
		if err := scan(b, prefixStep, func(_ []byte, s *stepRecord) { steps = append(steps, s) }); err != nil {
			return err
		}
		return scan(b, prefixEffect, func(key []byte, e *effectRecord) { effects[string(key)] = e })
	})
	return r, steps, effects, err
}

// stepOutput decodes step n's output from b; nil when it has none.
func stepOutput(b *bolt.Bucket, n uint64) (*stepRecord, error) {
	var st stepRecord
	ok, err := get(b, stepKey(n), &st)
	if err != nil || !ok {
		return nil, err
	}
	return &st, nil
}

// Effect returns an effect's recorded outcome, or nil.
func (j *Journal) Effect(id, key string) (*effectRecord, error) {
	var e *effectRecord
	err := j.view(id, func(b *bolt.Bucket) error {
		var rec effectRecord
		ok, err := get(b, effectKey(key), &rec)
		if ok {
			e = &rec
		}
		return err
	})
	return e, err
}

// Effects returns every recorded effect outcome by key.
func (j *Journal) Effects(id string) (map[string]*effectRecord, error) {
	out := map[string]*effectRecord{}
	err := j.view(id, func(b *bolt.Bucket) error {
		return scan(b, prefixEffect, func(key []byte, e *effectRecord) { out[string(key)] = e })
	})
	return out, err
}

// RecordEffect stores an effect's outcome, alone in a write.
func (j *Journal) RecordEffect(id, key string, e *effectRecord, also ...op) error {
	return j.write(id, nil, append(also, recordEffect(key, e))...)
}

// recordEffect stores an effect's outcome.
func recordEffect(key string, e *effectRecord) op {
	return func(w *wtx) error { return put(w.b, effectKey(key), e) }
}

func pendingSignals(b *bolt.Bucket) ([]*signalRecord, error) {
	var out []*signalRecord
	err := scan(b, prefixSignal, func(_ []byte, s *signalRecord) {
		if s.Step == 0 {
			out = append(out, s)
		}
	})
	return out, err
}

// Signals returns every signal of a workflow in order.
func (j *Journal) Signals(id string) ([]*signalRecord, error) {
	var out []*signalRecord
	err := j.view(id, func(b *bolt.Bucket) error {
		return scan(b, prefixSignal, func(_ []byte, s *signalRecord) { out = append(out, s) })
	})
	return out, err
}

// AddSignal journals a signal for a running or suspended workflow. A
// repeated non-empty key returns the first signal's sequence and
// duplicate=true. A SUSPENDED workflow turns RUNNING (resumed=true): the
// caller restarts it.
func (j *Journal) AddSignal(id string, payload []byte, key string, accepted func(seq uint64) *lifecyclev1.LifecycleEvent) (seq uint64, duplicate, resumed bool, err error) {
	err = j.write(id, nil, func(w *wtx) error {
		seq, duplicate, resumed = 0, false, false
		if key != "" {
			if v := w.b.Get(prefixed(prefixSigKey, []byte(key))); len(v) == 8 {
				seq, duplicate = binary.BigEndian.Uint64(v), true
				return nil
			}
		}
		r, err := w.record()
		if err != nil {
			return err
		}
		if r.terminal() {
			return fmt.Errorf("workflow %q has ended (%s); signals go to running workflows: %w",
				id, orchestrator.StatusName(r.Status), errs.FailedPrecondition)
		}
		w.dirty = true
		r.SignalSeq++
		seq = r.SignalSeq
		r.Pending++
		if r.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED {
			r.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING
			resumed = true
		}
		sig := &signalRecord{Seq: seq, Payload: payload, Key: key, Accepted: time.Now()}
		if err := put(w.b, signalKey(seq), sig); err != nil {
			return err
		}
		if key != "" {
			if err := w.b.Put(prefixed(prefixSigKey, []byte(key)), u64(seq)); err != nil {
				return err
			}
		}
		return w.logEvent(accepted(seq))
	})
	return seq, duplicate, resumed, err
}

// Unfinished returns the workflows still RUNNING, oldest first. It
// reads the live index, so finished workflows cost it nothing.
func (j *Journal) Unfinished() ([]*record, error) {
	var out []*record
	err := j.db.View(func(tx *bolt.Tx) error {
		all := tx.Bucket(bucketWorkflows)
		return tx.Bucket(bucketLive).ForEach(func(k, v []byte) error {
			if len(v) != 1 || orchestratorv1.WorkflowStatus(v[0]) != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING {
				return nil
			}
			b := all.Bucket(k[8:])
			if b == nil {
				return nil
			}
			r, err := readRecord(b)
			if err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// List returns up to size workflows, newest first, in the given status
// (UNSPECIFIED: any), after the position in token.
func (j *Journal) List(status orchestratorv1.WorkflowStatus, size int, token string) ([]*record, string, error) {
	var after []byte
	if token != "" {
		var err error
		if after, err = j.openToken(token, status); err != nil {
			return nil, "", err
		}
	}
	var (
		out  []*record
		next string
	)
	err := j.db.View(func(tx *bolt.Tx) error {
		all := tx.Bucket(bucketWorkflows)
		c := tx.Bucket(bucketIndex).Cursor()
		var k, v []byte
		if after == nil {
			k, v = c.Last()
		} else {
			k, v = c.Seek(after)
			if k != nil && bytes.Equal(k, after) {
				k, v = c.Prev()
			} else if k == nil {
				k, v = c.Last()
			} else {
				k, v = c.Prev()
			}
		}
		var last []byte
		for ; k != nil; k, v = c.Prev() {
			if status != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED && (len(v) != 1 || orchestratorv1.WorkflowStatus(v[0]) != status) {
				continue
			}
			if len(out) == size {
				next = j.issueToken(last, status)
				return nil
			}
			b := all.Bucket(k[8:])
			if b == nil {
				continue
			}
			r, err := readRecord(b)
			if err != nil {
				return err
			}
			out = append(out, r)
			last = bytes.Clone(k)
		}
		return nil
	})
	return out, next, err
}

const tokenVersion = 1

func (j *Journal) mac(b []byte) []byte {
	h := hmac.New(sha256.New, j.secret)
	h.Write(b)
	return h.Sum(nil)
}

func (j *Journal) issueToken(last []byte, status orchestratorv1.WorkflowStatus) string {
	p := append([]byte{tokenVersion, byte(status)}, last...)
	return base64.RawURLEncoding.EncodeToString(append(p, j.mac(p)...))
}

func (j *Journal) openToken(token string, status orchestratorv1.WorkflowStatus) ([]byte, error) {
	raw, err := base64.RawURLEncoding.Strict().DecodeString(token)
	// Only the token as issued: the decoder skips line breaks.
	if err != nil || base64.RawURLEncoding.EncodeToString(raw) != token || len(raw) < 2+8+sha256.Size || raw[0] != tokenVersion {
		return nil, fmt.Errorf("page_token is malformed; pass the next_page_token of the previous page unchanged: %w", errs.InvalidArgument)
	}
	p, sum := raw[:len(raw)-sha256.Size], raw[len(raw)-sha256.Size:]
	if !hmac.Equal(sum, j.mac(p)) {
		return nil, fmt.Errorf("page_token was not issued by this orchestrator or was altered: %w", errs.InvalidArgument)
	}
	if orchestratorv1.WorkflowStatus(p[1]) != status {
		return nil, fmt.Errorf("page_token was issued for a listing of another status: %w", errs.InvalidArgument)
	}
	return p[2:], nil
}

// anyWakes says whether a pending signal wakes the workflow (nil wakes:
// any does).
func anyWakes(b *bolt.Bucket, wakes func([]byte) bool) (bool, error) {
	if wakes == nil {
		return true, nil
	}
	pending, err := pendingSignals(b)
	if err != nil {
		return false, err
	}
	for _, s := range pending {
		if wakes(s.Payload) {
			return true, nil
		}
	}
	return false, nil
}

// endUnlessMore sets the workflow's status to status (COMPLETED or
// SUSPENDED), after ending (which writes its last event), unless step
// next is journaled or signals that wake it are pending: then it changes nothing and
// sets *more. Signal writes in the same commit order, so a signal
// accepted before this commits is never stranded. A workflow that has
// ended meanwhile (a CancelWorkflow) sets *ended and is left as it is.
func endUnlessMore(next uint64, status orchestratorv1.WorkflowStatus, asking string, ending op, wakes func([]byte) bool, more, ended *bool) op {
	return func(w *wtx) error {
		*more, *ended = false, false
		r, err := w.record()
		if err != nil {
			return err
		}
		if r.terminal() {
			*ended = true
			return nil
		}
		if w.b.Get(stepKey(next)) != nil {
			*more = true
			return nil
		}
		if r.Pending > 0 {
			waking, err := anyWakes(w.b, wakes)
			if err != nil {
				return err
			}
			if waking {
				*more = true
				return nil
			}
		}
		if err := ending(w); err != nil {
			return err
		}
		r.Status, r.Asking = status, asking
		w.dirty = true
		return nil
	}
}
