package temporal

import (
	"log/slog"
	"path/filepath"
	"testing"

	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	"github.com/secbear/neuron/services/orchestrator"
)

// historyDir holds histories recorded from a Temporal dev server by the
// parent package's end-to-end tests (see its temporal_replay_test.go).
const historyDir = "../testdata/temporal-histories"

func quietTemporal() tlog.Logger { return tlog.NewStructuredLogger(slog.New(slog.DiscardHandler)) }

// The workflow must stay deterministic: a history recorded by an earlier
// build must replay on this one, command for command.
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(historyDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no recorded histories in %s", historyDir)
	}
	// Replay runs none of the workflow's side effects (registry lookups
	// and budget decisions come from the history), so the engine needs no
	// client, caller or State service.
	reg, err := orchestrator.ParseRegistry([]byte(`{"agents": [{"id": "replay", "operator": "127.0.0.1:1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := worker.NewWorkflowReplayer()
	New(nil, orchestrator.Deps{Registry: reg}, Options{}).RegisterWorkflow(r)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if err := r.ReplayWorkflowHistoryFromJSONFile(quietTemporal(), f); err != nil {
				t.Errorf("history %s does not replay on this build (a non-deterministic change to the workflow?): %v", f, err)
			}
		})
	}
}
