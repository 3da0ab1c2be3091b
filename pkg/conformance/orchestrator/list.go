package orchestrator

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
)

// defaultPageSize is ListWorkflows' page size for page_size 0.
const defaultPageSize = 100

// maxPages bounds a walk through ListWorkflows.
const maxPages = 2000

// listed is what the listing must show of one of the suite's workflows.
type listed struct {
	id     string
	status orchestratorv1.WorkflowStatus
}

// testList checks ListWorkflows with three workflows of its own,
// created in this order: a running one (the Slow agent's) and two
// completed ones (the Answer agent's). Newest first, they list as
// completed, completed, running.
func testList(t *testing.T, s *suite) {
	running := s.id("list-running")
	s.start(t, &orchestratorv1.StartWorkflowRequest{WorkflowId: running, AgentId: s.agents.Slow, Input: input("Take your time.")})
	var done []string
	for range 2 {
		time.Sleep(20 * time.Millisecond) // distinct creation times
		id := s.id("list-done")
		s.dispatch(t, &orchestratorv1.DispatchRequest{AgentId: s.agents.Answer, WorkflowId: id, Input: input("Be listed.")})
		done = append(done, id)
	}
	// Newest first.
	want := []listed{
		{done[1], orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED},
		{done[0], orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED},
		{running, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING},
	}
	s.run(t, "NewestFirst", func(t *testing.T) {
		all := s.listUntil(t, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED, 0, want)
		wantOrder(t, "ListWorkflows", all, want)
		for i := 1; i < len(all); i++ {
			prev, cur := all[i-1].GetCreateTime().AsTime(), all[i].GetCreateTime().AsTime()
			if cur.After(prev) {
				t.Fatalf("ListWorkflows is not newest first: %q (created %v) is listed after %q (created %v)",
					all[i].GetWorkflowId(), cur.Format(time.RFC3339Nano), all[i-1].GetWorkflowId(), prev.Format(time.RFC3339Nano))
			}
		}
		for _, wf := range all {
			if wf.GetWorkflowId() == done[0] && wf.GetRootAgentId() != s.agents.Answer {
				t.Fatalf("ListWorkflows shows workflow %q with root agent %q; want %q", done[0], wf.GetRootAgentId(), s.agents.Answer)
			}
		}
	})
	s.run(t, "StatusFilter", func(t *testing.T) {
		for _, st := range []orchestratorv1.WorkflowStatus{
			orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED,
			orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING,
		} {
			var wantSt []listed
			for _, w := range want {
				if w.status == st {
					wantSt = append(wantSt, w)
				}
			}
			all := s.listUntil(t, st, 2, wantSt)
			for _, wf := range all {
				if wf.GetStatus() != st {
					t.Fatalf("ListWorkflows(status %v) listed workflow %q, %s", st, wf.GetWorkflowId(), describe(wf))
				}
			}
			wantOrder(t, fmt.Sprintf("ListWorkflows(status %v)", st), all, wantSt)
		}
	})
	// Order is NewestFirst's to check: here only that each workflow is
	// listed once (walk fails on a repeat) and none is missed.
	s.run(t, "PageSize1", func(t *testing.T) {
		s.listUntil(t, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED, 1, want)
	})
}

// listUntil walks ListWorkflows (status, page_size size) until it shows
// every workflow of want in its status, for at most the suite's list
// wait, and returns the last walk.
func (s *suite) listUntil(t *testing.T, status orchestratorv1.WorkflowStatus, size int32, want []listed) []*orchestratorv1.Workflow {
	t.Helper()
	deadline := time.Now().Add(s.listWait)
	for {
		all := s.walk(t, status, size)
		missing := missingFrom(all, want)
		if len(missing) == 0 {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("ListWorkflows(status %v, page_size %d) did not show %s within %v; it listed %d workflows: %s",
				status, size, strings.Join(missing, ", "), s.listWait, len(all), ids(all, s.ns))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// walk pages through ListWorkflows, checking that pages keep to
// page_size and no workflow is listed twice.
func (s *suite) walk(t *testing.T, status orchestratorv1.WorkflowStatus, size int32) []*orchestratorv1.Workflow {
	t.Helper()
	limit := int(size)
	if limit == 0 {
		limit = defaultPageSize
	}
	var all []*orchestratorv1.Workflow
	seen := map[string]int{}
	token := ""
	for page := 0; ; page++ {
		if page == maxPages {
			t.Fatalf("ListWorkflows(status %v, page_size %d) still returns a next_page_token after %d pages", status, size, maxPages)
		}
		res, err := s.c.ListWorkflows(ctx(t), &orchestratorv1.ListWorkflowsRequest{Status: status, PageSize: size, PageToken: token})
		if err != nil {
			t.Fatalf("ListWorkflows(status %v, page_size %d, page %d): %v", status, size, page, err)
		}
		if n := len(res.GetWorkflows()); n > limit {
			t.Fatalf("ListWorkflows(status %v, page_size %d) returned a page of %d workflows", status, size, n)
		}
		for _, wf := range res.GetWorkflows() {
			if p, dup := seen[wf.GetWorkflowId()]; dup {
				t.Fatalf("ListWorkflows(status %v, page_size %d) listed workflow %q on page %d and again on page %d", status, size, wf.GetWorkflowId(), p, page)
			}
			seen[wf.GetWorkflowId()] = page
			all = append(all, wf)
		}
		if token = res.GetNextPageToken(); token == "" {
			return all
		}
	}
}

// missingFrom names the workflows of want that all lacks, or lists in
// another status.
func missingFrom(all []*orchestratorv1.Workflow, want []listed) []string {
	var missing []string
	for _, w := range want {
		i := slices.IndexFunc(all, func(wf *orchestratorv1.Workflow) bool { return wf.GetWorkflowId() == w.id })
		switch {
		case i < 0:
			missing = append(missing, fmt.Sprintf("%q (%v)", w.id, w.status))
		case all[i].GetStatus() != w.status:
			missing = append(missing, fmt.Sprintf("%q as %v (listed as %v)", w.id, w.status, all[i].GetStatus()))
		}
	}
	return missing
}

// wantOrder fails t unless all lists the workflows of want in want's
// order.
func wantOrder(t *testing.T, what string, all []*orchestratorv1.Workflow, want []listed) {
	t.Helper()
	var got, order []string
	for _, w := range want {
		order = append(order, w.id)
	}
	for _, wf := range all {
		if slices.Contains(order, wf.GetWorkflowId()) {
			got = append(got, wf.GetWorkflowId())
		}
	}
	if !slices.Equal(got, order) {
		t.Fatalf("%s lists the suite's workflows in the order %q; want newest first, %q", what, got, order)
	}
}

// ids renders the ids of a listing for messages, those of this run
// (starting with ns) with their status; others are counted.
func ids(all []*orchestratorv1.Workflow, ns string) string {
	var out []string
	others := 0
	for _, wf := range all {
		if !strings.HasPrefix(wf.GetWorkflowId(), ns) {
			others++
			continue
		}
		out = append(out, fmt.Sprintf("%s (%s)", wf.GetWorkflowId(), statusName(wf.GetStatus())))
	}
	if others > 0 {
		out = append(out, fmt.Sprintf("and %d of other runs", others))
	}
	return "[" + strings.Join(out, ", ") + "]"
}
