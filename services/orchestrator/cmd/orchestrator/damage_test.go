//go:build unix

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/boltdamage"
	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
)

// TestDamagedJournal starts the real binary on copies of a journal.db it
// wrote, each damaged another way. A damaged journal must be refused at
// start, with exit status 1 and one line naming it and saying what to
// do: before the check, a journal cut into its used data died of SIGBUS
// inside bbolt at every start (a crash loop), and a page of garbage
// panicked or faulted at open. One zeroed meta page must start, at the
// older transaction, with the fallback logged at ERROR, and go on
// running workflows.
func TestDamagedJournal(t *testing.T) {
	const workflows = 24
	h := newHarness(t, testenv.Seed(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*crashBudget)
	defer cancel()

	healthy := h.backend[1]
	p := h.start(ctx)
	var wg sync.WaitGroup
	for i := range workflows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("damage-%02d", i)
			h.startWorkflow(ctx, id, "planner", fmt.Sprintf("write a report on topic %d", i))
			h.waitStatus(ctx, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	p.Terminate(t)

	l := boltdamage.Inspect(t, filepath.Join(healthy, "journal.db"))
	ps, hwm := int64(l.PageSize), int64(l.HighWater())
	if hwm < 12 || !l.Has("leaf") {
		t.Fatalf("the healthy journal is too small to damage interestingly: %v", l.Types)
	}
	t.Logf("healthy journal.db: txid %d, %d pages of %d: %v", l.Txid, hwm, ps, l.Types)

	type damage struct {
		name string
		do   func(t *testing.T, path string)
	}
	cases := []damage{
		{"cut inside meta page 1", func(t *testing.T, p string) { boltdamage.Truncate(t, p, ps+100) }},
		{"cut after the meta pages", func(t *testing.T, p string) { boltdamage.Truncate(t, p, 2*ps) }},
		{"cut at half", func(t *testing.T, p string) { boltdamage.Truncate(t, p, hwm/2*ps) }},
		{"cut two pages into the pages in use", func(t *testing.T, p string) { boltdamage.Truncate(t, p, int64(l.LastInUse()-1)*ps) }},
		{"cut inside the last page in use", func(t *testing.T, p string) { boltdamage.Truncate(t, p, int64(l.LastInUse())*ps+ps/2) }},
		{"both meta pages zeroed", func(t *testing.T, p string) {
			boltdamage.ZeroPage(t, p, l, 0)
			boltdamage.ZeroPage(t, p, l, 1)
		}},
		{"garbage leaf page", func(t *testing.T, p string) { boltdamage.GarbagePage(t, p, l, l.Last(t, "leaf")) }},
		{"zeroed leaf page", func(t *testing.T, p string) { boltdamage.ZeroPage(t, p, l, l.Last(t, "leaf")) }},
	}
	if l.Has("branch") {
		cases = append(cases, damage{"garbage branch page", func(t *testing.T, p string) { boltdamage.GarbagePage(t, p, l, l.Last(t, "branch")) }})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := boltdamage.CopyDir(t, healthy)
			path := filepath.Join(dir, "journal.db")
			c.do(t, path)
			line := boltdamage.ExpectRefusal(t, h.bin, envPrefix, path, "orchestrator: open journal "+path+": ",
				"--dev", "--addr", proc.FreeAddr(t), "--agents", h.agents, "--state-addr", h.stateAddr, "--data-dir", dir)
			t.Log(line)
		})
	}

	t.Run("newer meta page zeroed", func(t *testing.T) {
		dir := boltdamage.CopyDir(t, healthy)
		path := filepath.Join(dir, "journal.db")
		boltdamage.ZeroPage(t, path, l, l.NewerMeta())
		h.backend = []string{"--data-dir", dir}
		p := h.start(ctx)
		var warning string
		for line := range strings.Lines(p.Log()) {
			if strings.Contains(line, "DAMAGED META PAGE") {
				warning = strings.TrimSpace(line)
			}
		}
		t.Log(warning)
		// The service's own JSON log line.
		for _, want := range []string{`"level":"ERROR"`, fmt.Sprintf("%q:%q", "file", path), fmt.Sprintf(`"opened_txid":%d`, l.Txid-1),
			fmt.Sprintf(`"possibly_missing_txid":%d`, l.Txid), fmt.Sprintf(`"bad_meta_page":%d`, l.NewerMeta())} {
			if !strings.Contains(warning, want) {
				t.Errorf("the fallback warning %q does not say %q", warning, want)
			}
		}
		// It serves: the journaled workflows are there, and a new one
		// runs to the end (its writes commit).
		h.waitStatus(ctx, "damage-00", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
		h.startWorkflow(ctx, "after-fallback", "planner", "write a report after the fallback")
		h.waitStatus(ctx, "after-fallback", orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
		p.Terminate(t)
	})
}
