package orchestrator

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// testTranscript checks GetTranscript: what a step holds, paging, and
// bad requests.
func testTranscript(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"AnswerStep", testTranscriptAnswer},
		{"Paging", testTranscriptPaging},
		{"UnknownWorkflowIsNotFound", testTranscriptUnknown},
		{"BadPaging", testTranscriptBad},
	})
}

// transcript walks every page of workflow id's transcript with page
// size size.
func (s *suite) transcript(t *testing.T, id string, size int32) []*orchestratorv1.TranscriptStep {
	t.Helper()
	var all []*orchestratorv1.TranscriptStep
	token := ""
	for page := 0; ; page++ {
		if page > 1000 {
			t.Fatalf("GetTranscript(%q, page_size %d): more than 1000 pages; next_page_token never empty", id, size)
		}
		res, err := s.c.GetTranscript(ctx(t), &orchestratorv1.GetTranscriptRequest{WorkflowId: id, PageSize: size, PageToken: token})
		if err != nil {
			t.Fatalf("GetTranscript(%q, page_size %d, page %d): %v", id, size, page+1, err)
		}
		if size > 0 && len(res.GetSteps()) > int(size) {
			t.Fatalf("GetTranscript(%q, page_size %d): page %d has %d steps", id, size, page+1, len(res.GetSteps()))
		}
		all = append(all, res.GetSteps()...)
		if token = res.GetNextPageToken(); token == "" {
			return all
		}
	}
}

// transcriptOf returns workflow id's transcript once it has n steps,
// waiting up to the list wait for an implementation that keeps it a
// moment after the step.
func (s *suite) transcriptOf(t *testing.T, id string, n int) []*orchestratorv1.TranscriptStep {
	t.Helper()
	deadline := time.Now().Add(s.listWait)
	for {
		steps := s.transcript(t, id, 0)
		if len(steps) >= n || time.Now().After(deadline) {
			return steps
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wantSteps fails t unless steps are numbered 1..n, in order, each of
// agent and with its times.
func wantSteps(t *testing.T, what string, steps []*orchestratorv1.TranscriptStep, n int, agent string) {
	t.Helper()
	if len(steps) != n {
		var nums []uint64
		for _, st := range steps {
			nums = append(nums, st.GetStep())
		}
		t.Fatalf("%s: %d steps (numbered %v); want %d", what, len(steps), nums, n)
	}
	for i, st := range steps {
		if st.GetStep() != uint64(i+1) || st.GetAgentId() != agent || st.GetDispatchId() == "" || st.GetDepth() != 0 {
			t.Fatalf("%s: entry %d is step %d of agent %q, dispatch_id %q, depth %d; want step %d of %q with a dispatch_id, depth 0",
				what, i, st.GetStep(), st.GetAgentId(), st.GetDispatchId(), st.GetDepth(), i+1, agent)
		}
		if st.GetStartTime() == nil || st.GetEndTime() == nil || st.GetEndTime().AsTime().Before(st.GetStartTime().AsTime()) {
			t.Fatalf("%s: step %d start_time %v, end_time %v; want both set, end not before start", what, i+1, st.GetStartTime(), st.GetEndTime())
		}
		if st.GetError() != nil || st.GetOutput() == nil {
			t.Fatalf("%s: step %d has error %v, output %v; want its output and no error", what, i+1, st.GetError(), st.GetOutput())
		}
	}
}

// testTranscriptAnswer: an Answer dispatch's transcript is one step with
// the input as given and the output as returned.
func testTranscriptAnswer(t *testing.T, s *suite) {
	id := s.id("transcript")
	text := "Transcribe this: " + id
	res := s.dispatch(t, &orchestratorv1.DispatchRequest{AgentId: s.agents.Answer, WorkflowId: id, Input: input(text)})
	steps := s.transcriptOf(t, id, 1)
	what := "GetTranscript(" + id + ")"
	wantSteps(t, what, steps, 1, s.agents.Answer)
	st := steps[0]
	if got := content.TextOf(st.GetInput().GetMessage()); got != text {
		t.Fatalf("%s: step 1's input message %q; want the input's text %q", what, got, text)
	}
	if got := st.GetInput().GetDispatch().GetWorkflowId(); got != id {
		t.Fatalf("%s: step 1's input has dispatch context %v (workflow %q); want the one the operator was given, of workflow %q", what, st.GetInput().GetDispatch(), got, id)
	}
	if !proto.Equal(st.GetOutput(), res.GetOutput()) {
		t.Fatalf("%s: step 1's output %v; Dispatch returned %v", what, st.GetOutput(), res.GetOutput())
	}
}

// testTranscriptPaging: a Suspend workflow resumed once has two steps;
// pages of one list each once, in order, and the second step's input is
// the resumed one.
func testTranscriptPaging(t *testing.T, s *suite) {
	wf := s.suspended(t)
	id := wf.GetWorkflowId()
	s.signal(t, id, s.id("key"), "go on")
	s.waitResumed(t, id, wf.GetSteps())
	if n := s.get(t, id).GetSteps(); n != 2 {
		t.Fatalf("workflow %q made %d operator calls after one signal; want 2", id, n)
	}
	all := s.transcriptOf(t, id, 2)
	wantSteps(t, "GetTranscript("+id+")", all, 2, s.agents.Suspend)
	paged := s.transcript(t, id, 1)
	wantSteps(t, "GetTranscript("+id+", page_size 1)", paged, 2, s.agents.Suspend)
	for i := range all {
		if !proto.Equal(all[i], paged[i]) {
			t.Fatalf("GetTranscript(%q): step %d is %v in one page, %v in pages of one", id, i+1, all[i], paged[i])
		}
	}
	if all[0].GetInput().GetResume() != nil || all[1].GetInput().GetResume() == nil {
		t.Fatalf("GetTranscript(%q): steps' input.resume %v, %v; want the first call's unset and the resumed call's set (the exact inputs)",
			id, all[0].GetInput().GetResume(), all[1].GetInput().GetResume())
	}
}

func testTranscriptUnknown(t *testing.T, s *suite) {
	ghost := s.ns + "-no-such-workflow"
	_, err := s.c.GetTranscript(ctx(t), &orchestratorv1.GetTranscriptRequest{WorkflowId: ghost})
	wantCode(t, "GetTranscript of unknown workflow "+ghost, err, codes.NotFound, ghost)
}

func testTranscriptBad(t *testing.T, s *suite) {
	get := func(size int32, token string) func(*testing.T, *suite) error {
		return func(t *testing.T, s *suite) error {
			_, err := s.c.GetTranscript(ctx(t), &orchestratorv1.GetTranscriptRequest{WorkflowId: s.completed(t), PageSize: size, PageToken: token})
			return err
		}
	}
	runBad(t, s, []badCall{
		{name: "PageSizeNegative", code: codes.InvalidArgument, call: get(-1, "")},
		{name: "PageSizeOver100", code: codes.InvalidArgument, call: get(101, "")},
		{name: "GarbagePageToken", code: codes.InvalidArgument, call: get(0, "not a page token!")},
	})
}
