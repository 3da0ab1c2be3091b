package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/a2a"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/gateway"
)

func TestLanesOrder(t *testing.T) {
	t.Parallel()
	l := gateway.NewLanes(1000)
	var mu sync.Mutex
	var got []int
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		if err := l.Submit("u", func() {
			defer wg.Done()
			mu.Lock()
			got = append(got, i)
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	for i, v := range got {
		if v != i {
			t.Fatalf("job %d ran at position %d: %v", v, i, got)
		}
	}
}

// Jobs of different keys run at once: a job of a waits for one of b,
// which could never run if lanes were one queue.
func TestLanesParallel(t *testing.T) {
	t.Parallel()
	l := gateway.NewLanes(0)
	bRan := make(chan struct{})
	aDone := make(chan struct{})
	ctx := ctxFor(t, 30*time.Second)
	if err := l.Submit("a", func() {
		defer close(aDone)
		select {
		case <-bRan:
		case <-ctx.Done():
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.Submit("b", func() { close(bRan) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-aDone:
	case <-ctx.Done():
		t.Fatal("the job of lane b never ran while lane a's job waited for it")
	}
	select {
	case <-bRan:
	default:
		t.Fatal("lane a's job gave up before b ran")
	}
}

// A full lane refuses a message with RESOURCE_EXHAUSTED and drops
// nothing it accepted.
func TestLanesFull(t *testing.T) {
	t.Parallel()
	l := gateway.NewLanes(2)
	release := make(chan struct{})
	running := make(chan struct{})
	var ran sync.WaitGroup
	ran.Add(3)
	if err := l.Submit("u", func() { close(running); <-release; ran.Done() }); err != nil {
		t.Fatal(err)
	}
	<-running
	for range 2 {
		if err := l.Submit("u", ran.Done); err != nil {
			t.Fatal(err)
		}
	}
	err := l.Submit("u", func() { t.Error("a refused job ran") })
	if !errors.Is(err, errs.ResourceExhausted) || !strings.Contains(err.Error(), "2 waiting") {
		t.Fatalf("the fourth job: %v, want RESOURCE_EXHAUSTED naming the depth", err)
	}
	if err := l.Submit("other", func() {}); err != nil {
		t.Fatalf("another lane is not full: %v", err)
	}
	close(release)
	ran.Wait()
	if n := l.Waiting("u"); n != 0 {
		t.Fatalf("%d jobs left waiting", n)
	}
}

// The done-when of the lanes: 50 users send 5 messages each at once
// (over A2A JSON-RPC, not waiting for answers); each user's workflows
// ran one after the other in the order sent, and users ran in parallel,
// as the orchestrator's transcripts record them.
func TestLanes50Users(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOptions{}, scriptedAgent("paced", map[string]any{"text": "noted", "delay": "20ms"}))
	c := a2aClients(t, s, "paced")["jsonrpc"]
	ctx := ctxFor(t, 4*time.Minute)
	const users, perUser = 50, 5
	ids := make([][]a2a.TaskID, users)
	var wg sync.WaitGroup
	errc := make(chan error, users)
	for u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range perUser {
				p := userText(fmt.Sprintf("user-%02d", u), fmt.Sprintf("message %d", m))
				p.Config = &a2a.MessageSendConfig{Blocking: new(bool)}
				r, err := c.SendMessage(ctx, p)
				if err != nil {
					errc <- fmt.Errorf("user %d message %d: %w", u, m, err)
					return
				}
				ids[u] = append(ids[u], r.(*a2a.Task).ID)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	type span struct{ start, end time.Time }
	spans := make([][]span, users)
	for u := range users {
		for _, id := range ids[u] {
			wf := waitEnded(t, ctx, s, string(id))
			if wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED || gateway.Answer(wf) != "noted" {
				t.Fatalf("workflow %s: %s %q", id, wf.GetStatus(), gateway.Answer(wf))
			}
			tr, err := s.orch.GetTranscript(ctx, &orchestratorv1.GetTranscriptRequest{WorkflowId: string(id)})
			if err != nil || len(tr.GetSteps()) != 1 {
				t.Fatalf("transcript of %s: %v %v", id, tr, err)
			}
			st := tr.GetSteps()[0]
			spans[u] = append(spans[u], span{st.GetStartTime().AsTime(), st.GetEndTime().AsTime()})
		}
	}
	for u := range users {
		for m := 1; m < perUser; m++ {
			if spans[u][m].start.Before(spans[u][m-1].end) {
				t.Fatalf("user %d: message %d started at %v, before message %d ended at %v", u, m, spans[u][m].start, m-1, spans[u][m-1].end)
			}
		}
	}
	overlaps := 0
	for u := range users {
		for v := u + 1; v < users; v++ {
			for _, a := range spans[u] {
				for _, b := range spans[v] {
					if a.start.Before(b.end) && b.start.Before(a.end) {
						overlaps++
					}
				}
			}
		}
	}
	if overlaps == 0 {
		t.Fatal("no two users' messages ran at the same time: the users were serialized")
	}
	t.Logf("%d overlapping pairs of messages of different users", overlaps)
}

// waitEnded polls the orchestrator until workflow id has ended.
func waitEnded(t *testing.T, ctx context.Context, s *stack, id string) *orchestratorv1.Workflow {
	t.Helper()
	for {
		resp, err := s.orch.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
		if err == nil {
			switch resp.GetWorkflow().GetStatus() {
			case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_RUNNING, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED:
			default:
				return resp.GetWorkflow()
			}
		} else if status.Code(err) != codes.NotFound {
			t.Fatalf("GetWorkflow %s: %v", id, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("workflow %s did not end: %v", id, err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// A full lane answers RESOURCE_EXHAUSTED on A2A gRPC, an A2A error
// naming the lane on JSON-RPC, and 429 on the chat endpoint; other
// sessions go on.
func TestLaneFullRefuses(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOptions{laneDepth: 1}, scriptedAgent("slow", map[string]any{"text": "late", "delay": "1h"}), echoAgent("echo"))
	clients := a2aClients(t, s, "slow")
	ctx := ctxFor(t, 60*time.Second)
	for name, c := range clients {
		refused := 0
		for i := range 3 {
			p := userText("busy-"+name, fmt.Sprintf("message %d", i))
			p.Config = &a2a.MessageSendConfig{Blocking: new(bool)}
			_, err := c.SendMessage(ctx, p)
			if err == nil {
				continue
			}
			refused++
			if !strings.Contains(err.Error(), "waiting messages") {
				t.Fatalf("%s: the refusal does not say why: %v", name, err)
			}
			if name == "grpc" && status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("grpc: refused with %v, want RESOURCE_EXHAUSTED", err)
			}
		}
		if refused == 0 {
			t.Fatalf("%s: three messages fit a lane of one running and one waiting", name)
		}
	}
	body := `{"agent": "slow", "session": "busy-jsonrpc", "message": "one more"}`
	resp, err := http.Post(s.httpURL+"/v1/chat", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("chat on a full lane: HTTP %d, want 429", resp.StatusCode)
	}
	echo := a2aClients(t, s, "echo")["jsonrpc"]
	if task := asTask(t)(echo.SendMessage(ctx, userText("", "still there?"))); task.Status.State != a2a.TaskStateCompleted {
		t.Fatalf("another session: %s", task.Status.State)
	}
}
