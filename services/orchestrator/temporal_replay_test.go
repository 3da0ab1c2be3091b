package orchestrator_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/temporalproto"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/temporal"
)

// The workflow must stay deterministic: a history recorded by an
// earlier build must replay on this one. testdata/temporal-histories
// holds histories recorded from a Temporal dev server by the tests that
// call replay (set NEURON_RECORD_HISTORIES=1 to record them again, after
// a deliberate, versioned change to the workflow); the temporal
// package's TestReplayRecordedHistories replays them on every run, and
// every run against a dev server also replays the histories it just made.
const historyDir = "testdata/temporal-histories"

// replayer replays histories on this build's workflow code.
func replayer(t *testing.T) worker.WorkflowReplayer {
	t.Helper()
	r := worker.NewWorkflowReplayer()
	// Replay runs none of the workflow's side effects (registry lookups,
	// budget decisions come from the history), so the backend needs no
	// client, caller or State service.
	reg, err := orchestrator.ParseRegistry([]byte(`{"agents": [{"id": "replay", "operator": "127.0.0.1:1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	temporal.New(nil, orchestrator.Deps{Registry: reg}, temporal.Options{}).RegisterWorkflow(r)
	return r
}

func quietTemporal() tlog.Logger { return tlog.NewStructuredLogger(slog.New(slog.DiscardHandler)) }

// replayHistory fetches workflow id's history from c and replays it on
// this build; with NEURON_RECORD_HISTORIES=1 it also records it as
// testdata/temporal-histories/<name>.json.
func replayHistory(t *testing.T, c client.Client, id, name string) {
	t.Helper()
	ctx := context.Background()
	it := c.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	h := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatalf("history of %s: %v", id, err)
		}
		h.Events = append(h.Events, ev)
	}
	if err := replayer(t).ReplayWorkflowHistory(quietTemporal(), h); err != nil {
		t.Errorf("the history of workflow %s does not replay (the workflow is not deterministic): %v", id, err)
	}
	if os.Getenv("NEURON_RECORD_HISTORIES") != "1" {
		return
	}
	b, err := temporalproto.CustomJSONMarshalOptions{Indent: "  "}.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(historyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(historyDir, name+".json")
	if err := os.WriteFile(path, append(bytes.TrimSpace(b), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %s (%d events)", path, len(h.Events))
}
