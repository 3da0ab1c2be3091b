package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/encoding/protowire"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
)

// The journal's records in their binary form (schema version 3): each is
// a protobuf message in the wire format, written field by field with
// protowire (protoc --decode_raw shows one), so no generated code stands
// between the structs of journal.go and the bytes. The field numbers
// below are the stored format: a field may be added under a new number
// (older builds skip it, as a protobuf parser does), never renumbered or
// given another meaning. Times are Unix nanoseconds (absent: the zero
// time), decimals their strings, durations nanoseconds.
//
// Files of schema version 2 hold JSON records; they are read as they are
// (a JSON record starts with '{', which no record here does: 0x7B would
// be field 15 opening a group) and rewritten in the binary form the next
// time they change.

// codec is a record type of the journal.
type codec interface {
	marshal() []byte
	unmarshal(raw []byte) error
}

// isJSON says whether raw is a record of schema version 2 or before.
func isJSON(raw []byte) bool { return len(raw) > 0 && raw[0] == '{' }

// errField is a field of an unexpected wire type.
var errField = errors.New("unexpected wire type")

// enc appends fields to a message.
type enc struct{ b []byte }

func (e *enc) uint(n protowire.Number, v uint64) {
	if v != 0 {
		e.b = protowire.AppendTag(e.b, n, protowire.VarintType)
		e.b = protowire.AppendVarint(e.b, v)
	}
}

func (e *enc) int(n protowire.Number, v int64) { e.uint(n, uint64(v)) }

func (e *enc) bool(n protowire.Number, v bool) {
	if v {
		e.uint(n, 1)
	}
}

func (e *enc) str(n protowire.Number, s string) {
	if s != "" {
		e.b = protowire.AppendTag(e.b, n, protowire.BytesType)
		e.b = protowire.AppendString(e.b, s)
	}
}

// bytes writes v unless it is nil: an empty slice is kept (an output that
// encodes to nothing is still an output).
func (e *enc) bytes(n protowire.Number, v []byte) {
	if v != nil {
		e.b = protowire.AppendTag(e.b, n, protowire.BytesType)
		e.b = protowire.AppendBytes(e.b, v)
	}
}

func (e *enc) time(n protowire.Number, t time.Time) {
	if !t.IsZero() {
		e.int(n, t.UnixNano())
	}
}

func (e *enc) msg(n protowire.Number, m []byte) {
	e.b = protowire.AppendTag(e.b, n, protowire.BytesType)
	e.b = protowire.AppendBytes(e.b, m)
}

// strMap writes each entry as a message {1: key, 2: value}, as protobuf
// writes a map<string, string>, in key order.
func (e *enc) strMap(n protowire.Number, m map[string]string) {
	if len(m) == 0 {
		return
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		var kv enc
		kv.str(1, k)
		kv.str(2, m[k])
		e.msg(n, kv.b)
	}
}

// dec reads the fields of a message.
type dec struct {
	b   []byte
	n   protowire.Number
	typ protowire.Type
	err error
}

// next moves to the next field; false at the end or on an error (err).
func (d *dec) next() bool {
	if d.err != nil || len(d.b) == 0 {
		return false
	}
	n, typ, l := protowire.ConsumeTag(d.b)
	if l < 0 {
		d.err = protowire.ParseError(l)
		return false
	}
	d.b, d.n, d.typ = d.b[l:], n, typ
	return true
}

func (d *dec) fail(l int) {
	if d.err == nil {
		d.err = fmt.Errorf("field %d: %w", d.n, protowire.ParseError(l))
	}
}

func (d *dec) uint() uint64 {
	if d.typ != protowire.VarintType {
		d.err = fmt.Errorf("field %d: %w", d.n, errField)
		return 0
	}
	v, l := protowire.ConsumeVarint(d.b)
	if l < 0 {
		d.fail(l)
		return 0
	}
	d.b = d.b[l:]
	return v
}

func (d *dec) int() int64 { return int64(d.uint()) }

func (d *dec) bool() bool { return d.uint() != 0 }

// raw is a length-delimited field's bytes, not copied.
func (d *dec) raw() []byte {
	if d.typ != protowire.BytesType {
		d.err = fmt.Errorf("field %d: %w", d.n, errField)
		return nil
	}
	v, l := protowire.ConsumeBytes(d.b)
	if l < 0 {
		d.fail(l)
		return nil
	}
	d.b = d.b[l:]
	return v
}

func (d *dec) str() string { return string(d.raw()) }

// bytes is a copy: bbolt's memory is valid only in its transaction.
func (d *dec) bytes() []byte { return append([]byte{}, d.raw()...) }

func (d *dec) time() time.Time { return time.Unix(0, d.int()).UTC() }

func (d *dec) decimal() decimal.Decimal {
	s := d.str()
	v, err := decimal.NewFromString(s)
	if err != nil && d.err == nil {
		d.err = fmt.Errorf("field %d: %w", d.n, err)
	}
	return v
}

// strEntry reads one entry of a map<string, string> into m.
func (d *dec) strEntry(m map[string]string) {
	kv := dec{b: d.raw()}
	if d.err != nil {
		return
	}
	var k, v string
	for kv.next() {
		switch kv.n {
		case 1:
			k = kv.str()
		case 2:
			v = kv.str()
		default:
			kv.skip()
		}
	}
	if kv.err != nil && d.err == nil {
		d.err = kv.err
	}
	m[k] = v
}

// skip passes over a field this build does not know.
func (d *dec) skip() {
	l := protowire.ConsumeFieldValue(d.n, d.typ, d.b)
	if l < 0 {
		d.fail(l)
		return
	}
	d.b = d.b[l:]
}

func (d *dec) done(what string) error {
	if d.err != nil {
		return fmt.Errorf("%s: %w", what, d.err)
	}
	return nil
}

// The record's fields.
const (
	recID protowire.Number = iota + 1
	recStatus
	recRootAgent
	recCurrentAgent
	recSteps
	recSpent
	recBudget
	recLastOutput
	recFailure
	recCreated
	recUpdated
	recFingerprint
	recInput
	recDeadline
	recTrace
	recSignalSeq
	recPending
	recDetached
	recMaxDepth
	recMaxSteps
	recWarnFraction
	recRootRevision
	recAskLimits
	recLimit
	recLimitSteps
	recAsking
)

func (r *record) marshal() []byte {
	e := enc{b: make([]byte, 0, 160+len(r.ID)+len(r.Input)+len(r.LastOutput)+len(r.Fingerprint))}
	e.str(recID, r.ID)
	e.uint(recStatus, uint64(r.Status))
	e.str(recRootAgent, r.RootAgent)
	e.str(recCurrentAgent, r.CurrentAgent)
	e.uint(recSteps, uint64(r.Steps))
	if !r.Spent.IsZero() {
		e.str(recSpent, r.Spent.String())
	}
	if r.Budget.Valid {
		e.msg(recBudget, []byte(r.Budget.Decimal.String()))
	}
	e.bytes(recLastOutput, r.LastOutput)
	if r.Failure != nil {
		e.msg(recFailure, r.Failure.marshal())
	}
	e.time(recCreated, r.Created)
	e.time(recUpdated, r.Updated)
	e.str(recFingerprint, r.Fingerprint)
	e.bytes(recInput, r.Input)
	e.time(recDeadline, r.Deadline)
	e.strMap(recTrace, r.Trace)
	e.uint(recSignalSeq, r.SignalSeq)
	e.uint(recPending, uint64(r.Pending))
	e.bool(recDetached, r.Detached)
	e.uint(recMaxDepth, uint64(r.MaxDepth))
	e.uint(recMaxSteps, r.MaxSteps)
	e.str(recWarnFraction, r.WarnFraction)
	e.uint(recRootRevision, r.RootRevision)
	e.bool(recAskLimits, r.AskLimits)
	if r.Limit.Valid {
		e.msg(recLimit, []byte(r.Limit.Decimal.String()))
	}
	e.uint(recLimitSteps, r.LimitSteps)
	e.str(recAsking, r.Asking)
	return e.b
}

func (r *record) unmarshal(raw []byte) error {
	if isJSON(raw) {
		return json.Unmarshal(raw, r)
	}
	d := dec{b: raw}
	for d.next() {
		switch d.n {
		case recID:
			r.ID = d.str()
		case recStatus:
			r.Status = orchestratorv1.WorkflowStatus(d.uint())
		case recRootAgent:
			r.RootAgent = d.str()
		case recCurrentAgent:
			r.CurrentAgent = d.str()
		case recSteps:
			r.Steps = uint32(d.uint())
		case recSpent:
			r.Spent = d.decimal()
		case recBudget:
			r.Budget = decimal.NewNullDecimal(d.decimal())
		case recLastOutput:
			r.LastOutput = d.bytes()
		case recFailure:
			r.Failure = &failure{}
			if err := r.Failure.unmarshal(d.raw()); err != nil && d.err == nil {
				d.err = err
			}
		case recCreated:
			r.Created = d.time()
		case recUpdated:
			r.Updated = d.time()
		case recFingerprint:
			r.Fingerprint = d.str()
		case recInput:
			r.Input = d.bytes()
		case recDeadline:
			r.Deadline = d.time()
		case recTrace:
			if r.Trace == nil {
				r.Trace = map[string]string{}
			}
			d.strEntry(r.Trace)
		case recSignalSeq:
			r.SignalSeq = d.uint()
		case recPending:
			r.Pending = uint32(d.uint())
		case recDetached:
			r.Detached = d.bool()
		case recMaxDepth:
			r.MaxDepth = uint32(d.uint())
		case recMaxSteps:
			r.MaxSteps = d.uint()
		case recWarnFraction:
			r.WarnFraction = d.str()
		case recRootRevision:
			r.RootRevision = d.uint()
		case recAskLimits:
			r.AskLimits = d.bool()
		case recLimit:
			r.Limit = decimal.NewNullDecimal(d.decimal())
		case recLimitSteps:
			r.LimitSteps = d.uint()
		case recAsking:
			r.Asking = d.str()
		default:
			d.skip()
		}
	}
	return d.done("record")
}

func (f *failure) marshal() []byte {
	var e enc
	e.int(1, int64(f.Code))
	e.str(2, f.Message)
	e.str(3, f.Reason)
	e.strMap(4, f.Meta)
	return e.b
}

func (f *failure) unmarshal(raw []byte) error {
	d := dec{b: raw}
	for d.next() {
		switch d.n {
		case 1:
			f.Code = int32(d.int())
		case 2:
			f.Message = d.str()
		case 3:
			f.Reason = d.str()
		case 4:
			if f.Meta == nil {
				f.Meta = map[string]string{}
			}
			d.strEntry(f.Meta)
		default:
			d.skip()
		}
	}
	return d.done("failure")
}

func (s *stepRecord) marshal() []byte {
	e := enc{b: make([]byte, 0, 32+len(s.Agent)+len(s.Input)+len(s.Output))}
	e.str(1, s.Agent)
	e.bytes(2, s.Input)
	e.bytes(3, s.Output)
	if s.Error != nil {
		e.msg(4, s.Error.marshal())
	}
	if len(s.Signals) > 0 {
		var packed []byte
		for _, seq := range s.Signals {
			packed = protowire.AppendVarint(packed, seq)
		}
		e.msg(5, packed)
	}
	e.time(6, s.Started)
	return e.b
}

func (s *stepRecord) unmarshal(raw []byte) error {
	if isJSON(raw) {
		return json.Unmarshal(raw, s)
	}
	d := dec{b: raw}
	for d.next() {
		switch d.n {
		case 1:
			s.Agent = d.str()
		case 2:
			s.Input = d.bytes()
		case 3:
			s.Output = d.bytes()
		case 4:
			s.Error = &failure{}
			if err := s.Error.unmarshal(d.raw()); err != nil && d.err == nil {
				d.err = err
			}
		case 5:
			packed := d.raw()
			for len(packed) > 0 {
				v, l := protowire.ConsumeVarint(packed)
				if l < 0 {
					d.fail(l)
					break
				}
				s.Signals = append(s.Signals, v)
				packed = packed[l:]
			}
		case 6:
			s.Started = d.time()
		default:
			d.skip()
		}
	}
	return d.done("step")
}

func (e *effectRecord) marshal() []byte {
	var w enc
	w.bool(1, e.Applied)
	w.str(2, e.Detail)
	for _, ev := range e.Events {
		w.msg(3, ev)
	}
	w.uint(4, e.Step)
	w.time(5, e.Time)
	return w.b
}

func (e *effectRecord) unmarshal(raw []byte) error {
	if isJSON(raw) {
		return json.Unmarshal(raw, e)
	}
	d := dec{b: raw}
	for d.next() {
		switch d.n {
		case 1:
			e.Applied = d.bool()
		case 2:
			e.Detail = d.str()
		case 3:
			e.Events = append(e.Events, d.bytes())
		case 4:
			e.Step = d.uint()
		case 5:
			e.Time = d.time()
		default:
			d.skip()
		}
	}
	return d.done("effect")
}

func (s *signalRecord) marshal() []byte {
	var e enc
	e.uint(1, s.Seq)
	e.bytes(2, s.Payload)
	e.str(3, s.Key)
	e.uint(4, s.Step)
	e.time(5, s.Accepted)
	return e.b
}

func (s *signalRecord) unmarshal(raw []byte) error {
	if isJSON(raw) {
		return json.Unmarshal(raw, s)
	}
	d := dec{b: raw}
	for d.next() {
		switch d.n {
		case 1:
			s.Seq = d.uint()
		case 2:
			s.Payload = d.bytes()
		case 3:
			s.Key = d.str()
		case 4:
			s.Step = d.uint()
		case 5:
			s.Accepted = d.time()
		default:
			d.skip()
		}
	}
	return d.done("signal")
}

func (l *lookupRecord) marshal() []byte {
	var e enc
	e.str(1, l.Err)
	e.int(2, int64(l.Code))
	e.str(3, l.Model)
	e.str(4, l.DowngradeModel)
	e.int(5, int64(l.Attempts))
	e.int(6, int64(l.Initial))
	e.int(7, int64(l.MaxBackoff))
	e.uint(8, l.Revision)
	e.bool(9, l.Restricted)
	for _, a := range l.AllowedAgents {
		e.str(10, a)
	}
	return e.b
}

func (l *lookupRecord) unmarshal(raw []byte) error {
	if isJSON(raw) {
		return json.Unmarshal(raw, l)
	}
	d := dec{b: raw}
	for d.next() {
		switch d.n {
		case 1:
			l.Err = d.str()
		case 2:
			l.Code = int32(d.int())
		case 3:
			l.Model = d.str()
		case 4:
			l.DowngradeModel = d.str()
		case 5:
			l.Attempts = int(d.int())
		case 6:
			l.Initial = time.Duration(d.int())
		case 7:
			l.MaxBackoff = time.Duration(d.int())
		case 8:
			l.Revision = d.uint()
		case 9:
			l.Restricted = d.bool()
		case 10:
			l.AllowedAgents = append(l.AllowedAgents, d.str())
		default:
			d.skip()
		}
	}
	return d.done("lookup")
}
