package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/gateway"
)

// fakeClock is the schedules' clock in tests: it moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// runGateway runs a gateway in process in front of s's services with
// the schedules' clock; stop ends it (a restart, or a replica going
// away) and returns once it has.
func runGateway(t *testing.T, s *stack, clock *fakeClock) (httpURL string, stop func()) {
	t.Helper()
	httpURL, _, stop = runGatewayAt(t, s, clock)
	return httpURL, stop
}

// runGatewayAt is runGateway, returning the gRPC address too.
func runGatewayAt(t *testing.T, s *stack, clock *fakeClock) (httpURL, grpcAddr string, stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	cfg := gateway.Config{
		Server:       grpcserver.Config{Name: "gateway", Dev: true, ShutdownTimeout: 2 * time.Second},
		Listener:     lis,
		HTTPListener: hlis,
		Orchestrator: grpcclient.Config{Target: s.orchAddr},
		State:        grpcclient.Config{Target: s.stateAddr},
		Agents:       s.registry,
		Log:          harness.Quiet(),
		Clock:        clock.Now,
		// A fake clock's ticks are found at once.
		ScheduleCheck: 10 * time.Millisecond,
		Ready:         func(string, string) { close(ready) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gateway.Run(ctx, cfg) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("gateway: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("gateway: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return "http://" + hlis.Addr().String(), lis.Addr().String(), stop
}

// postJSON posts body to url and decodes the answer into out.
func postJSON(t *testing.T, method, url string, body any, out any) int {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(method, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// scheduleRuns are the ids of schedule name's workflows, sorted.
func scheduleRuns(t *testing.T, ctx context.Context, s *stack, name string) []string {
	t.Helper()
	list, err := s.orch.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, wf := range list.GetWorkflows() {
		if gateway.SessionOf(wf.GetWorkflowId()) == gateway.ScheduleSession(name) {
			ids = append(ids, wf.GetWorkflowId())
		}
	}
	slices.Sort(ids)
	return ids
}

// waitWorkflow waits until workflow id exists and has ended.
func waitWorkflow(t *testing.T, ctx context.Context, s *stack, id string) *orchestratorv1.Workflow {
	t.Helper()
	return waitEnded(t, ctx, s, id)
}

// A schedule fires on its tick as a workflow with the tick's id; two
// gateways (replicas) and a restart run each tick once; ticks missed
// while nothing checked run as one (the latest); a bad cron expression
// is INVALID_ARGUMENT naming it; the API lists and deletes.
func TestSchedules(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOptions{noGateway: true}, echoAgent("echo"))
	ctx := ctxFor(t, 3*time.Minute)
	t0 := time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC)
	clock := &fakeClock{t: t0}
	urlA, stopA := runGateway(t, s, clock)
	urlB, _ := runGateway(t, s, clock) // a second replica, checking the same schedules

	var bad struct {
		Error struct{ Code, Message string }
	}
	if code := postJSON(t, http.MethodPost, urlA+"/v1/schedules", map[string]any{"name": "bad", "agent": "echo", "cron": "61 * * * *", "message": "x"}, &bad); code != http.StatusBadRequest ||
		bad.Error.Code != codes.InvalidArgument.String() || !strings.Contains(bad.Error.Message, `"61 * * * *"`) {
		t.Fatalf("a bad cron expression: HTTP %d %+v, want 400 INVALID_ARGUMENT naming it", code, bad)
	}
	if code := postJSON(t, http.MethodPost, urlA+"/v1/schedules", map[string]any{"name": "nobody", "agent": "ghost", "cron": "@hourly", "message": "x"}, nil); code != http.StatusNotFound {
		t.Fatalf("an unknown agent: HTTP %d, want 404", code)
	}
	var created gateway.Schedule
	if code := postJSON(t, http.MethodPost, urlA+"/v1/schedules", map[string]any{"name": "minutely", "agent": "echo", "cron": "* * * * *", "message": "tick"}, &created); code != http.StatusCreated {
		t.Fatalf("create: HTTP %d", code)
	}
	if want := t0.Truncate(time.Minute).Add(time.Minute); !created.NextTick.Equal(want) {
		t.Fatalf("next tick %v, want %v", created.NextTick, want)
	}
	if code := postJSON(t, http.MethodPost, urlB+"/v1/schedules", map[string]any{"name": "minutely", "agent": "echo", "cron": "@daily", "message": "again"}, nil); code != http.StatusConflict {
		t.Fatalf("a second schedule of the same name: HTTP %d, want 409", code)
	}

	tick := func(min int) string {
		return gateway.ScheduleTaskID("minutely", time.Date(2026, 1, 1, 0, min, 0, 0, time.UTC))
	}
	clock.Set(t0.Add(time.Minute)) // 00:01:30: the 00:01 tick is due
	if wf := waitWorkflow(t, ctx, s, tick(1)); wf.GetStatus() != orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED {
		t.Fatalf("the 00:01 tick: %s", wf.GetStatus())
	}
	clock.Set(t0.Add(4 * time.Minute)) // 00:04:30: 00:02, 00:03 and 00:04 were missed; only 00:04 runs
	waitWorkflow(t, ctx, s, tick(4))

	stopA() // a restart: A goes, C comes, B stays
	urlC, _ := runGateway(t, s, clock)
	clock.Set(t0.Add(5 * time.Minute)) // 00:05:30
	waitWorkflow(t, ctx, s, tick(5))
	if got, want := scheduleRuns(t, ctx, s, "minutely"), []string{tick(1), tick(4), tick(5)}; !slices.Equal(got, want) {
		t.Fatalf("the schedule's workflows: %v, want %v (each tick once, the missed ones as the latest)", got, want)
	}

	var list struct{ Schedules []gateway.Schedule }
	if code := postJSON(t, http.MethodGet, urlC+"/v1/schedules", nil, &list); code != http.StatusOK || len(list.Schedules) != 1 ||
		!list.Schedules[0].LastTick.Equal(time.Date(2026, 1, 1, 0, 5, 0, 0, time.UTC)) {
		t.Fatalf("list: HTTP %d %+v", code, list)
	}
	if code := postJSON(t, http.MethodDelete, urlC+"/v1/schedules/minutely", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: HTTP %d", code)
	}
	if code := postJSON(t, http.MethodDelete, urlC+"/v1/schedules/minutely", nil, nil); code != http.StatusNotFound {
		t.Fatalf("delete again: HTTP %d, want 404", code)
	}
	if _, err := s.orch.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: tick(2)}); status.Code(err) != codes.NotFound {
		t.Fatalf("the missed 00:02 tick ran: %v", err)
	}
}
