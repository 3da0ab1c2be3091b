package state

import (
	"crypto/sha256"
	"fmt"
	"time"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// This file holds the write semantics both backends share: idempotency,
// compare-and-set and revision assignment, over the small txn interface
// that a bbolt transaction and the memory maps implement.

// opKind is the operation an idempotency record belongs to.
type opKind byte

const (
	opWrite  opKind = 1
	opDelete opKind = 2
)

// txn is the storage a mutation runs against, inside one transaction.
type txn interface {
	// revision returns the current revision of the key at ck.
	revision(ck []byte) (rev uint64, ok bool, err error)
	// put stores raw (a marshalled structpb.Value) at ck with revision
	// rev, full-text indexed unless unindexed, with the embedding vec
	// (normalized; nil: none).
	put(ck []byte, rev uint64, raw []byte, unindexed bool, vec []float32) error
	// del removes ck; seq is the revision number the deletion consumed.
	del(ck []byte, seq uint64) error
	// nextRevision takes the next number of the store's counter.
	nextRevision() (uint64, error)
	// idem returns the idempotency record at ik.
	idem(ik []byte) (idemRecord, bool, error)
	// putIdem stores r at ik; prev is the expired record it replaces, if any.
	putIdem(ik []byte, r idemRecord, prev *idemRecord) error
}

// idemRecord is the remembered result of a mutation made with an
// idempotency key.
type idemRecord struct {
	created     time.Time
	op          opKind
	fingerprint [16]byte // of the state key, so a reused key is detected
	revision    uint64
	existed     bool
}

// mutation is one Write or Delete, validated and encoded.
type mutation struct {
	op       opKind
	scopeEnc []byte
	scope    *typesv1.Scope // for messages (scopeName)
	key      string
	raw      []byte // Write only
	guard    Guard  // Guard.Unindexed: Write only
	now      time.Time
}

// outcome is what a mutation did.
type outcome struct {
	revision uint64 // Write: the key's revision
	existed  bool   // Delete: the key existed
	replayed bool
	seq      uint64 // the counter value consumed; 0 when nothing changed
}

// scopeName is the scope for a message; only refusals build it.
func (m *mutation) scopeName() string { return scope.String(m.scope) }

func (m *mutation) ck() []byte { return append(append([]byte(nil), m.scopeEnc...), m.key...) }

func (m *mutation) ik() []byte {
	return append(append([]byte(nil), m.scopeEnc...), m.guard.IdempotencyKey...)
}

func (m *mutation) fingerprint() [16]byte {
	sum := sha256.Sum256([]byte(m.key))
	var fp [16]byte
	copy(fp[:], sum[:])
	return fp
}

// apply runs m against tx. It returns an error wrapping an errs kind for
// an outcome the caller must see (stale revision, reused idempotency
// key), before changing anything, and a plain error when the storage
// fails. It is safe to re-run on a rolled-back transaction: it keeps no
// state outside tx.
func apply(tx txn, m *mutation, retention time.Duration) (outcome, error) {
	var (
		ik   []byte
		prev *idemRecord
	)
	if m.guard.IdempotencyKey != "" {
		ik = m.ik()
		r, ok, err := tx.idem(ik)
		if err != nil {
			return outcome{}, err
		}
		if ok && m.now.Sub(r.created) < retention {
			if r.op != m.op || r.fingerprint != m.fingerprint() {
				return outcome{}, fmt.Errorf("idempotency key %q was already used in %s for a different operation or key; a retry must repeat the same operation on the same key: %w",
					truncate(m.guard.IdempotencyKey), m.scopeName(), errs.InvalidArgument)
			}
			return outcome{revision: r.revision, existed: r.existed, replayed: true}, nil
		}
		if ok {
			prev = &r
		}
	}

	ck := m.ck()
	cur, exists, err := tx.revision(ck)
	if err != nil {
		return outcome{}, err
	}
	if err := checkExpected(m, cur, exists); err != nil {
		return outcome{}, err
	}

	var out outcome
	switch m.op {
	case opWrite:
		rev, err := tx.nextRevision()
		if err != nil {
			return outcome{}, err
		}
		if err := tx.put(ck, rev, m.raw, m.guard.Unindexed, m.guard.Embedding); err != nil {
			return outcome{}, err
		}
		out = outcome{revision: rev, seq: rev}
	case opDelete:
		if exists {
			seq, err := tx.nextRevision()
			if err != nil {
				return outcome{}, err
			}
			if err := tx.del(ck, seq); err != nil {
				return outcome{}, err
			}
			out = outcome{existed: true, seq: seq}
		}
	}

	if m.guard.IdempotencyKey != "" {
		r := idemRecord{created: m.now, op: m.op, fingerprint: m.fingerprint(), revision: out.revision, existed: out.existed}
		if err := tx.putIdem(ik, r, prev); err != nil {
			return outcome{}, err
		}
	}
	return out, nil
}

func checkExpected(m *mutation, cur uint64, exists bool) error {
	want := m.guard.ExpectedRevision
	if want == nil {
		return nil
	}
	k := truncate(m.key)
	switch {
	case *want == 0 && exists:
		return fmt.Errorf("key %q in %s exists at revision %d; expected it not to exist: %w", k, m.scopeName(), cur, errs.StaleRevision)
	case *want != 0 && !exists:
		return fmt.Errorf("key %q in %s does not exist; expected revision %d: %w", k, m.scopeName(), *want, errs.StaleRevision)
	case *want != 0 && cur != *want:
		return fmt.Errorf("key %q in %s is at revision %d; expected %d: %w", k, m.scopeName(), cur, *want, errs.StaleRevision)
	}
	return nil
}
