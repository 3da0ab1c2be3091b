package journal

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// putJSON writes v as schema version 2 wrote its records (JSON), for
// tests of files that version wrote.
func putJSON(b *bolt.Bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, raw)
}

// appendEvents records evs, as the journal does, at the next positions of the workflow's event
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
		if err := b.Put(eventKey(pos), raw); err != nil {
			return err
		}
	}
	return b.Put(keyLogEnd, u64(pos))
}

// sample is a value of each record type with every field set.
func samples() []codec {
	t0 := time.Date(2026, 11, 27, 20, 52, 39, 123456789, time.UTC)
	return []codec{
		&record{ID: "wf-1", Status: orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED, RootAgent: "planner", CurrentAgent: "writer",
			Steps: 4, Spent: decimal.RequireFromString("0.0042"), Budget: decimal.NewNullDecimal(decimal.RequireFromString("0")), LastOutput: []byte{1, 2, 3},
			Failure: &failure{Code: 9, Message: "m", Reason: "R", Meta: map[string]string{"a": "b"}}, Created: t0, Updated: t0.Add(time.Second),
			Fingerprint: "f00d", Input: []byte("in"), Deadline: t0.Add(time.Minute), Trace: map[string]string{"traceparent": "00-1-2-01", "x": ""},
			SignalSeq: 7, Pending: 2, Detached: true, MaxDepth: 3, MaxSteps: 99, WarnFraction: "0.8",
			RootRevision: 5, AskLimits: true, Limit: decimal.NewNullDecimal(decimal.RequireFromString("2.5")), LimitSteps: 120, Asking: "budget"},
		&stepRecord{Agent: "echo", Input: []byte("in"), Output: []byte("out"), Error: &failure{Code: 4, Message: "late"}, Signals: []uint64{1, 300, 5}, Started: t0},
		&effectRecord{Applied: true, Detail: "written", Events: [][]byte{{1}, {2, 3}}, Step: 2, Time: t0},
		&signalRecord{Seq: 3, Payload: []byte("p"), Key: "k", Step: 9, Accepted: t0},
		&lookupRecord{Err: "no agent", Code: 5, Model: "m", DowngradeModel: "d", Attempts: 3, Initial: time.Second, MaxBackoff: time.Minute},
	}
}

// Every record type survives its binary form, field for field; the JSON
// of schema version 2 still reads; and an empty record is read as the
// zero value.
func TestCodecRoundTrip(t *testing.T) {
	for _, want := range samples() {
		typ := reflect.TypeOf(want).Elem()
		t.Run(typ.Name(), func(t *testing.T) {
			raw := want.marshal()
			if isJSON(raw) {
				t.Fatalf("the binary form starts with '{': %x", raw)
			}
			got := reflect.New(typ).Interface().(codec)
			if err := got.unmarshal(raw); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("binary round trip:\n got %+v\nwant %+v", got, want)
			}
			js, err := json.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			fromJSON := reflect.New(typ).Interface().(codec)
			if err := fromJSON.unmarshal(js); err != nil {
				t.Fatalf("a version 2 (JSON) record: %v", err)
			}
			if !reflect.DeepEqual(fromJSON.marshal(), want.marshal()) {
				t.Errorf("the JSON record reads as another:\n got %+v\nwant %+v", fromJSON, want)
			}
			zero := reflect.New(typ).Interface().(codec)
			if err := zero.unmarshal(nil); err != nil || !reflect.DeepEqual(zero, reflect.New(typ).Interface()) {
				t.Errorf("empty record: %+v, %v", zero, err)
			}
		})
	}
}

// An output that encodes to no bytes is still an output: the step is
// done (JSON lost this: it left such a step to be called again).
func TestCodecEmptyOutput(t *testing.T) {
	var got stepRecord
	if err := got.unmarshal((&stepRecord{Agent: "echo", Output: []byte{}}).marshal()); err != nil || !got.done() {
		t.Fatalf("a step with an empty output: %+v, %v; want it done", got, err)
	}
}

// A field this build does not know (a later build's) is skipped; a
// record cut short is an error, not a half-read record.
func TestCodecUnknownAndCorrupt(t *testing.T) {
	r := samples()[0].(*record)
	raw := append(r.marshal(), 0xf8, 0x07, 0x2a) // field 127, varint 42
	var got record
	if err := got.unmarshal(raw); err != nil || got.ID != r.ID || got.WarnFraction != r.WarnFraction {
		t.Fatalf("a record with an unknown field: %+v, %v", got, err)
	}
	full := r.marshal()
	if err := new(record).unmarshal(full[:len(full)-3]); err == nil {
		t.Error("a record cut short was read")
	}
}

// A file of schema version 2, its records in JSON, opens in this build
// and is stamped version 3 without being rewritten: a finished workflow
// reads as it was, a RUNNING one in its operator call is resumed and
// calls again with its journaled input, a SUSPENDED one resumes when
// signaled, and each is written in binary once it changes.
func TestVersion2File(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openT(t, path)
	created := time.Now().Add(-time.Minute)
	input := func(id string) []byte {
		raw, err := proto.Marshal(&operatorv1.OperatorInput{Message: content.Text("go"),
			Dispatch: &operatorv1.DispatchContext{WorkflowId: id, DispatchId: id + "#1", AgentId: "echo", CorrelationId: id}})
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	doneOut, err := proto.Marshal(&operatorv1.OperatorOutput{Message: content.Text("old answer"),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE}})
	if err != nil {
		t.Fatal(err)
	}
	err = j.db.Update(func(tx *bolt.Tx) error {
		for _, w := range []struct {
			id, agent string
			status    orchestratorv1.WorkflowStatus
			step      *stepRecord
		}{
			{"done", "echo", completed, &stepRecord{Agent: "echo", Input: input("done"), Output: doneOut, Started: created}},
			{"running", "echo", running, &stepRecord{Agent: "echo", Input: input("running"), Started: created}},
			{"asking", "ask", suspended, nil},
		} {
			b, err := tx.Bucket(bucketWorkflows).CreateBucket([]byte(w.id))
			if err != nil {
				return err
			}
			r := &record{ID: w.id, Status: w.status, RootAgent: w.agent, CurrentAgent: w.agent, Created: created, Updated: created,
				Input: input(w.id), Detached: true, Spent: decimal.Zero, WarnFraction: "0.8", MaxDepth: 8, MaxSteps: 256}
			if w.status == completed {
				r.Steps, r.LastOutput = 1, doneOut
			}
			if w.step != nil {
				if err := putJSON(b, stepKey(1), w.step); err != nil {
					return err
				}
			}
			if err := putJSON(b, []byte("l"+w.agent), &lookupRecord{Attempts: 3, Initial: time.Second, MaxBackoff: time.Minute}); err != nil {
				return err
			}
			if err := putJSON(b, keyRecord, r); err != nil {
				return err
			}
			if err := indexStatus(tx, r); err != nil {
				return err
			}
		}
		return putJSON(tx.Bucket(bucketWorkflows).Bucket([]byte("done")), effectKey("done#1/effect/0"), &effectRecord{Applied: true, Detail: "written", Step: 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	setSchema(t, path, u64(2))

	j = openT(t, path)
	defer j.Close()
	_ = j.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keySchema); string(v) != string(u64(schemaVersion)) {
			t.Errorf("schema version after opening a version 2 file = %x; want %d", v, schemaVersion)
		}
		return nil
	})
	done, err := j.Get("done")
	if err != nil || done.Status != completed || done.Steps != 1 || !bytes.Equal(done.LastOutput, doneOut) {
		t.Fatalf("the finished workflow: %+v, %v", done, err)
	}
	if e, err := j.Effect("done", "done#1/effect/0"); err != nil || e == nil || !e.Applied || e.Detail != "written" {
		t.Fatalf("its effect: %+v, %v", e, err)
	}

	caller := newFakeCaller()
	e := newEngine(t, j, caller)
	defer e.Close()
	if n, err := e.Resume(); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want the RUNNING workflow", n, err)
	}
	waitFor(t, e, "running", completed)
	if n := caller.callsOf("running"); n != 1 {
		t.Errorf("the RUNNING workflow called its operator %d times; want once, its journaled step 1", n)
	}
	if _, _, err := e.Signal(context.Background(), "asking", []byte{}, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, e, "asking", completed)
	_ = j.db.View(func(tx *bolt.Tx) error {
		for _, id := range []string{"running", "asking"} {
			if raw := wfBucket(tx, id).Get(keyRecord); isJSON(raw) {
				t.Errorf("%s: its record is still JSON once it changed", id)
			}
		}
		if raw := wfBucket(tx, "done").Get(keyRecord); !isJSON(raw) {
			t.Error("the finished workflow was rewritten")
		}
		return nil
	})
	wf, err := e.Get(context.Background(), "running")
	if err != nil || wf.Steps != 1 || content.TextOf(wf.LastOutput.GetMessage()) != "done" {
		t.Errorf("the resumed workflow: %+v, %v", wf, err)
	}
}
