package journal

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/shopspring/decimal"
	bolt "go.etcd.io/bbolt"

	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/boltcheck"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/orchestrator"
)

// The journal is one bbolt file. Layout (schema version 2):
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
//	    r                 the record (JSON)
//	    s<n BE>           step n: agent, input, then output or error
//	    e<effect key>     an effect's outcome, once executed
//	    g<seq BE>         signal seq: payload, key, delivering step
//	    k<signal key>     seq of an idempotent signal
//	    l<agent id>       a registry lookup, as the workflow first saw it
//	    v<pos BE>         event pos of the workflow's event log (binary LifecycleEvent)
//	    n                 the log's last position
//	    w                 how many of the workflow's own events the log holds
//
// Protobuf values inside records are stored in their binary form. These
// structs are the stored format: a field may be added (older files read
// it as zero), never renamed or given another meaning; anything else
// bumps schemaVersion, which an older orchestrator then refuses to open.
// Version 2 added live, ended and meta/finished (indexes.go); Open
// migrates a version 1 file by building them once.

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
const schemaVersion = 2

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

func stepKey(n uint64) []byte { return append([]byte{prefixStep}, u64(n)...) }

func indexKey(r *record) []byte {
	return append(u64(uint64(r.Created.UnixNano())), r.ID...)
}

func notFound(id string) error {
	return fmt.Errorf("workflow %q does not exist: %w", id, errs.NotFound)
}

func wfBucket(tx *bolt.Tx, id string) *bolt.Bucket {
	return tx.Bucket(bucketWorkflows).Bucket([]byte(id))
}

func getJSON(b *bolt.Bucket, key []byte, v any) (bool, error) {
	raw := b.Get(key)
	if raw == nil {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("journal entry %q is corrupt: %w", key, err)
	}
	return true, nil
}

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
// order, passing the key without its prefix.
func scan[T any](b *bolt.Bucket, prefix byte, fn func(key []byte, v *T)) error {
	c := b.Cursor()
	for k, v := c.Seek([]byte{prefix}); k != nil && k[0] == prefix; k, v = c.Next() {
		var rec T
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("journal entry %q is corrupt: %w", k, err)
		}
		fn(k[1:], &rec)
	}
	return nil
}

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, raw)
}

func readRecord(b *bolt.Bucket) (*record, error) {
	var r record
	ok, err := getJSON(b, keyRecord, &r)
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
	if err := putJSON(b, keyRecord, r); err != nil {
		return err
	}
	return indexStatus(tx, r)
}

// Create stores a new workflow. When the id exists it returns the
// existing record and created=false, changing nothing.
func (j *Journal) Create(r *record) (existing *record, created bool, err error) {
	err = j.update(func(tx *bolt.Tx) error {
		all := tx.Bucket(bucketWorkflows)
		if b := all.Bucket([]byte(r.ID)); b != nil {
			existing, err = readRecord(b)
			return err
		}
		b, err := all.CreateBucket([]byte(r.ID))
		if err != nil {
			return err
		}
		created = true
		return writeRecord(tx, b, r)
	})
	return existing, created, err
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

// Update changes a record in one transaction. fn may return errNoChange to
// leave it as it is.
func (j *Journal) Update(id string, fn func(r *record) error, also ...writeFn) (*record, error) {
	var out *record
	err := j.update(func(tx *bolt.Tx) error {
		b := wfBucket(tx, id)
		if b == nil {
			return notFound(id)
		}
		if err := each(b, also); err != nil {
			return err
		}
		r, err := readRecord(b)
		if err != nil {
			return err
		}
		out = r
		if err := fn(r); err != nil {
			return err
		}
		r.Updated = time.Now()
		return writeRecord(tx, b, r)
	})
	if errors.Is(err, errNoChange) {
		err = nil
	}
	return out, err
}

// errNoChange lets an Update callback leave the record untouched.
var errNoChange = errors.New("no change")

// Step returns step n, or nil when it was never begun.
func (j *Journal) Step(id string, n uint64) (*stepRecord, error) {
	var s *stepRecord
	err := j.view(id, func(b *bolt.Bucket) error {
		var st stepRecord
		ok, err := getJSON(b, stepKey(n), &st)
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

// BeginStep journals the intent of step n. When step n exists it is
// returned unchanged (a replay). Otherwise plan is called, in the same
// transaction, with the signals not yet delivered; it returns the step to
// store, and the signals it lists are marked delivered by step n. The
// record's current agent follows the step.
func (j *Journal) BeginStep(id string, n uint64, plan func(b *bolt.Bucket, r *record, pending []*signalRecord) (*stepRecord, error), also ...writeFn) (*stepRecord, bool, error) {
	var (
		out    *stepRecord
		replay bool
	)
	err := j.update(func(tx *bolt.Tx) error {
		b := wfBucket(tx, id)
		if b == nil {
			return notFound(id)
		}
		var st stepRecord
		ok, err := getJSON(b, stepKey(n), &st)
		if err != nil {
			return err
		}
		if ok {
			out, replay = &st, true
			return nil
		}
		r, err := readRecord(b)
		if err != nil {
			return err
		}
		pending, err := pendingSignals(b)
		if err != nil {
			return err
		}
		if err := each(b, also); err != nil {
			return err
		}
		s, err := plan(b, r, pending)
		if err != nil {
			return err
		}
		for _, sig := range pending {
			for _, seq := range s.Signals {
				if seq == sig.Seq {
					sig.Step = n
					if err := putJSON(b, append([]byte{prefixSignal}, u64(seq)...), sig); err != nil {
						return err
					}
					r.Pending--
				}
			}
		}
		if err := putJSON(b, stepKey(n), s); err != nil {
			return err
		}
		r.Updated = time.Now()
		out = s
		return writeRecord(tx, b, r)
	})
	return out, replay, err
}

// FinishStep stores step n's result and applies update to the record in
// the same transaction.
func (j *Journal) FinishStep(id string, n uint64, s *stepRecord, update func(r *record), also ...writeFn) error {
	return j.update(func(tx *bolt.Tx) error {
		b := wfBucket(tx, id)
		if b == nil {
			return notFound(id)
		}
		if err := each(b, also); err != nil {
			return err
		}
		if err := putJSON(b, stepKey(n), s); err != nil {
			return err
		}
		r, err := readRecord(b)
		if err != nil {
			return err
		}
		update(r)
		r.Updated = time.Now()
		return writeRecord(tx, b, r)
	})
}

// writeFn is an extra write into a workflow's bucket, made in the same
// transaction as the journal write it is passed to.
type writeFn func(b *bolt.Bucket) error

func each(b *bolt.Bucket, fns []writeFn) error {
	for _, fn := range fns {
		if err := fn(b); err != nil {
			return err
		}
	}
	return nil
}

func getU64(b *bolt.Bucket, key []byte) uint64 {
	if v := b.Get(key); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// appendEvents records evs at the next positions of the workflow's event
// log, setting each one's WorkflowSequence.
func appendEvents(b *bolt.Bucket, evs ...*lifecyclev1.LifecycleEvent) error {
	pos := getU64(b, keyLogEnd)
	for _, ev := range evs {
		pos++
		ev.WorkflowSequence = pos
		raw, err := proto.Marshal(ev)
		if err != nil {
			return err
		}
		if err := b.Put(append([]byte{prefixEvent}, u64(pos)...), raw); err != nil {
			return err
		}
	}
	return b.Put(keyLogEnd, u64(pos))
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
		for k, v := c.Seek(append([]byte{prefixEvent}, u64(after+1)...)); k != nil && k[0] == prefixEvent; k, v = c.Next() {
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

// stepOutput decodes step n's output from b; nil when it has none.
func stepOutput(b *bolt.Bucket, n uint64) (*stepRecord, error) {
	var st stepRecord
	ok, err := getJSON(b, stepKey(n), &st)
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
		ok, err := getJSON(b, append([]byte{prefixEffect}, key...), &rec)
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

// RecordEffect stores an effect's outcome. Concurrent calls share a commit.
func (j *Journal) RecordEffect(id, key string, e *effectRecord, also ...writeFn) error {
	return j.update(func(tx *bolt.Tx) error {
		b := wfBucket(tx, id)
		if b == nil {
			return notFound(id)
		}
		if err := each(b, also); err != nil {
			return err
		}
		return putJSON(b, append([]byte{prefixEffect}, key...), e)
	})
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
	err = j.update(func(tx *bolt.Tx) error {
		b := wfBucket(tx, id)
		if b == nil {
			return notFound(id)
		}
		if key != "" {
			if v := b.Get(append([]byte{prefixSigKey}, key...)); len(v) == 8 {
				seq, duplicate = binary.BigEndian.Uint64(v), true
				return nil
			}
		}
		r, err := readRecord(b)
		if err != nil {
			return err
		}
		if r.terminal() {
			return fmt.Errorf("workflow %q has ended (%s); signals go to running workflows: %w",
				id, orchestrator.StatusName(r.Status), errs.FailedPrecondition)
		}
		r.SignalSeq++
		seq = r.SignalSeq
		r.Pending++
		if r.Status == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED {
			r.Status = orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING
			resumed = true
		}
		r.Updated = time.Now()
		sig := &signalRecord{Seq: seq, Payload: payload, Key: key, Accepted: r.Updated}
		if err := putJSON(b, append([]byte{prefixSignal}, u64(seq)...), sig); err != nil {
			return err
		}
		if key != "" {
			if err := b.Put(append([]byte{prefixSigKey}, key...), u64(seq)); err != nil {
				return err
			}
		}
		if err := appendEvents(b, accepted(seq)); err != nil {
			return err
		}
		return writeRecord(tx, b, r)
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

// errAlreadyEnded: the workflow reached a terminal status meanwhile (a
// CancelWorkflow).
var errAlreadyEnded = errors.New("the workflow has already ended")

// EndUnlessMore sets the workflow's status to status (COMPLETED or
// SUSPENDED) unless step next is journaled or signals are pending, in
// which case it changes nothing and returns more=true. Signal takes the
// same lock, so a signal accepted before this commits is never stranded.
func (j *Journal) EndUnlessMore(id string, next uint64, status orchestratorv1.WorkflowStatus, ending writeFn, also ...writeFn) (more bool, err error) {
	err = j.update(func(tx *bolt.Tx) error {
		more = false
		b := wfBucket(tx, id)
		if b == nil {
			return notFound(id)
		}
		if err := each(b, also); err != nil {
			return err
		}
		r, err := readRecord(b)
		if err != nil {
			return err
		}
		if r.terminal() {
			return errAlreadyEnded
		}
		if b.Get(stepKey(next)) != nil || r.Pending > 0 {
			more = true
			return nil
		}
		if err := ending(b); err != nil {
			return err
		}
		r.Status = status
		r.Updated = time.Now()
		return writeRecord(tx, b, r)
	})
	return more, err
}
