package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// spinner frames of the live status line.
var spinner = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

// textProgress prints a dispatch for a person: one line per event, then
// the result. live adds a status line redrawn in place below the events
// (for a terminal); quiet prints the answer's text only.
type textProgress struct {
	w      io.Writer
	agent  string
	live   bool
	quiet  bool
	kinds  effectKinds
	ticker *time.Ticker
	halt   chan struct{}
	wg     sync.WaitGroup

	mu    sync.Mutex // guards what follows and writes to w
	began time.Time
	wf    string
	calls int
	spent string
	frame int
	shown bool // the status line is on screen
}

// newTextProgress returns the text view of a dispatch of agent.
func newTextProgress(w io.Writer, agent string, live, quiet bool) *textProgress {
	return &textProgress{w: w, agent: agent, live: live, quiet: quiet, kinds: effectKinds{}, began: time.Now()}
}

func (t *textProgress) start(workflowID string) {
	t.mu.Lock()
	t.wf, t.began = workflowID, time.Now()
	if !t.quiet {
		fmt.Fprintf(t.w, "dispatching %s in workflow %s\n", t.agent, workflowID)
	}
	t.mu.Unlock()
	if !t.live {
		return
	}
	t.ticker = time.NewTicker(120 * time.Millisecond)
	t.halt = make(chan struct{})
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		for {
			select {
			case <-t.halt:
				return
			case <-t.ticker.C:
				t.mu.Lock()
				t.frame++
				t.drawStatus()
				t.mu.Unlock()
			}
		}
	}()
}

// drawStatus redraws the status line; callers hold t.mu.
func (t *textProgress) drawStatus() {
	spent := t.spent
	if spent == "" {
		spent = "0"
	}
	fmt.Fprintf(t.w, "\r\033[K%s %s running · %.1fs · %d operator call(s) · spent %s",
		spinner[t.frame%len(spinner)], t.agent, time.Since(t.began).Seconds(), t.calls, usd(spent))
	t.shown = true
}

// clearStatus erases the status line; callers hold t.mu.
func (t *textProgress) clearStatus() {
	if t.shown {
		fmt.Fprint(t.w, "\r\033[K")
		t.shown = false
	}
}

func (t *textProgress) event(ev *lifecyclev1.LifecycleEvent) {
	t.kinds.learn(ev)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case ev.GetObservable().GetEventType() == eventDispatchDone:
		t.calls++
	case ev.GetBudget().GetCostIncurred() != nil:
		t.spent = ev.GetBudget().GetCostIncurred().GetCumulative().GetAmount()
	}
	if t.quiet || ev.GetObservable().GetEventType() == eventRunRequested {
		return
	}
	agent := ev.GetAgentId()
	if agent == "" {
		agent = "-"
	}
	t.clearStatus()
	fmt.Fprintf(t.w, "  %-7s %-12s %s\n", elapsed(time.Since(t.began)), agent, describe(ev))
	if t.live {
		t.drawStatus()
	}
}

// stopLive stops the status line.
func (t *textProgress) stopLive() {
	if t.ticker != nil {
		t.ticker.Stop()
		close(t.halt)
		t.wg.Wait()
		t.ticker = nil
	}
	t.mu.Lock()
	t.clearStatus()
	t.mu.Unlock()
}

func (t *textProgress) done(resp *orchestratorv1.DispatchResponse) {
	t.stopLive()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.quiet {
		fmt.Fprintln(t.w, strings.TrimSpace(content.TextOf(resp.GetOutput().GetMessage())))
		return
	}
	printResult(t.w, t.agent, resp, t.kinds)
}

func (t *textProgress) fail(error) { t.stopLive() }
