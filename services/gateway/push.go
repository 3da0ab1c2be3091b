package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/a2a"
	"github.com/a2aproject/a2a-go/a2asrv/push"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// A2A push notifications. A task's push-notification config is a record
// in the State service (scope StateScope, key pushPrefix+task+"/"+id)
// with the task state it last delivered. A watcher per task (started
// when a config is set, and at start for every stored config) follows
// the task's workflow and, on each change of the task's state, POSTs the
// task (JSON, as the SDK's HTTPPushSender does: the config's token in
// X-A2A-Notification-Token, its credentials as Authorization Bearer or
// Basic) to every config's URL, retrying with backoff until the receiver
// answers 2xx or the attempts run out; a delivered state is recorded so
// a restart does not send it again.

// pushPrefix is the State key prefix of the push-notification configs.
const pushPrefix = "push/"

// Push delivery: attempts per notification, and the first pause
// between attempts (doubling).
const (
	pushAttempts = 6
	pushBackoff  = 100 * time.Millisecond
)

// pushRecord is a stored push-notification config.
type pushRecord struct {
	TaskID    string         `json:"task_id"`
	Config    a2a.PushConfig `json:"config"`
	Delivered string         `json:"delivered,omitempty"` // the task state last delivered
}

// pusher keeps push-notification configs and delivers notifications.
type pusher struct {
	g      *Gateway
	kv     *kv
	sender *push.HTTPPushSender

	mu       sync.Mutex
	watching map[string]bool // task id → a watcher runs
}

func newPusher(g *Gateway, store *kv) *pusher {
	return &pusher{g: g, kv: store, sender: push.NewHTTPPushSender(&push.HTTPSenderConfig{Timeout: 10 * time.Second, FailOnError: true}),
		watching: map[string]bool{}}
}

func pushKey(task a2a.TaskID, id string) string { return pushPrefix + string(task) + "/" + id }

// set stores a task's config (its id defaults to the task id) and
// starts watching the task.
func (p *pusher) set(ctx context.Context, c *a2a.TaskPushConfig) (*a2a.TaskPushConfig, error) {
	if c == nil || c.TaskID == "" {
		return nil, fmt.Errorf("no task id: %w", errs.InvalidArgument)
	}
	u, err := url.Parse(c.Config.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("push notification url %q: give an absolute http or https URL: %w", clip(c.Config.URL, 200), errs.InvalidArgument)
	}
	if strings.Contains(c.Config.ID, "/") {
		return nil, fmt.Errorf("push notification config id %q: no slashes: %w", clip(c.Config.ID, 100), errs.InvalidArgument)
	}
	out := *c
	if out.Config.ID == "" {
		out.Config.ID = string(c.TaskID)
	}
	key := pushKey(out.TaskID, out.Config.ID)
	for range casAttempts {
		var old pushRecord
		rev, err := p.kv.get(ctx, key, &old)
		if err != nil {
			return nil, err
		}
		ok, err := p.kv.put(ctx, key, pushRecord{TaskID: string(out.TaskID), Config: out.Config}, rev)
		if err != nil {
			return nil, err
		}
		if ok {
			p.watch(string(out.TaskID))
			return &out, nil
		}
	}
	return nil, fmt.Errorf("push notification config %q kept changing; set it again: %w", out.Config.ID, errs.Retryable)
}

// get returns a task's config id (empty: its first).
func (p *pusher) get(ctx context.Context, task a2a.TaskID, id string) (*a2a.TaskPushConfig, error) {
	list, err := p.list(ctx, task)
	if err != nil {
		return nil, err
	}
	for _, c := range list {
		if id == "" || c.Config.ID == id {
			return c, nil
		}
	}
	return nil, fmt.Errorf("task %q has no push notification config %q: %w", task, id, errs.NotFound)
}

// list returns a task's configs.
func (p *pusher) list(ctx context.Context, task a2a.TaskID) ([]*a2a.TaskPushConfig, error) {
	items, err := p.kv.list(ctx, pushPrefix+string(task)+"/")
	if err != nil {
		return nil, err
	}
	out := []*a2a.TaskPushConfig{}
	for _, it := range items {
		var r pushRecord
		if decodeValue(it.value, &r) == nil {
			out = append(out, &a2a.TaskPushConfig{TaskID: task, Config: r.Config})
		}
	}
	return out, nil
}

// del removes a task's config.
func (p *pusher) del(ctx context.Context, task a2a.TaskID, id string) error {
	existed, err := p.kv.delAny(ctx, pushKey(task, id))
	if err != nil {
		return err
	}
	if !existed {
		return fmt.Errorf("task %q has no push notification config %q: %w", task, id, errs.NotFound)
	}
	return nil
}

// resume watches every task with a stored config.
func (p *pusher) resume(ctx context.Context) {
	for pause := time.Duration(0); sleepCtx(ctx, pause); pause = backoff(pause) {
		items, err := p.kv.list(ctx, pushPrefix)
		if err != nil {
			p.g.log.Warn("resuming push notifications", "err", err)
			continue
		}
		for _, it := range items {
			var r pushRecord
			if decodeValue(it.value, &r) == nil && r.TaskID != "" {
				p.watch(r.TaskID)
			}
		}
		return
	}
}

// watch makes sure a watcher follows task id.
func (p *pusher) watch(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watching[id] {
		return
	}
	p.watching[id] = true
	go p.follow(id)
}

// follow delivers task id's state changes until it has ended and the
// end is delivered (or it has no config left).
func (p *pusher) follow(id string) {
	ctx := p.g.ctx
	defer func() {
		p.mu.Lock()
		delete(p.watching, id)
		p.mu.Unlock()
	}()
	var after uint64
	for pause := time.Duration(0); sleepCtx(ctx, pause); pause = backoff(pause) {
		// The task as it is (it may have moved while nobody watched).
		if done, err := p.notify(ctx, id); err != nil || done {
			if err != nil && !retryable(err) {
				p.g.log.Warn("push notifications: giving up on a task", "task", id, "err", err)
				return
			}
			if done {
				return
			}
			continue
		}
		stream, err := p.g.orch.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{WorkflowId: id, AfterSequence: after, OmitProgress: true})
		if err != nil {
			continue
		}
		for {
			msg, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					pause = 0
				}
				break
			}
			ev := msg.GetEvent()
			if ev == nil {
				continue
			}
			after = max(after, ev.GetWorkflowSequence())
			if done, err := p.notify(ctx, id); done || (err != nil && !retryable(err)) {
				return
			}
			pause = 0
		}
	}
}

// notify delivers task id's current state to each of its configs that
// has not had it; done once the task has ended (or has no config).
func (p *pusher) notify(ctx context.Context, id string) (bool, error) {
	var task *a2a.Task
	if m, ok := p.g.Queued(id); ok {
		task = &a2a.Task{ID: a2a.TaskID(id), ContextID: m.Session, Status: a2a.TaskStatus{State: a2a.TaskStateSubmitted, Timestamp: now()}}
	} else {
		wf, err := p.g.getWorkflow(ctx, id)
		if status.Code(err) == codes.NotFound {
			return false, fmt.Errorf("task %q: %w", id, errs.Retryable) // accepted, about to start
		}
		if err != nil {
			return false, err
		}
		task = taskOf(wf)
	}
	items, err := p.kv.list(ctx, pushPrefix+id+"/")
	if err != nil {
		return false, err
	}
	if len(items) == 0 {
		return true, nil
	}
	state := string(task.Status.State)
	for _, it := range items {
		var r pushRecord
		if decodeValue(it.value, &r) != nil || r.Delivered == state {
			continue
		}
		if err := p.deliver(ctx, &r.Config, task); err != nil {
			p.g.log.Warn("push notification not delivered", "task", id, "config", r.Config.ID, "state", state, "err", err)
		}
		r.Delivered = state // delivered, or given up on: either way not sent again
		if _, err := p.kv.put(ctx, it.key, r, it.revision); err != nil {
			p.g.log.Warn("recording a delivered push notification", "task", id, "err", err)
		}
	}
	return task.Status.State.Terminal(), nil
}

// deliver POSTs task to c's URL, retrying with backoff.
func (p *pusher) deliver(ctx context.Context, c *a2a.PushConfig, task *a2a.Task) error {
	var err error
	pause := pushBackoff
	for attempt := range pushAttempts {
		if attempt > 0 {
			if !sleepCtx(ctx, pause) {
				return ctx.Err()
			}
			pause *= 2
		}
		if err = p.sender.SendPush(ctx, c, task); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%d attempts: %w", pushAttempts, err)
}

// Push-notification configs of the A2A request handler.

// OnSetTaskPushConfig stores a task's push-notification config.
func (h *A2AHandler) OnSetTaskPushConfig(ctx context.Context, c *a2a.TaskPushConfig) (*a2a.TaskPushConfig, error) {
	if h.G.push == nil {
		return nil, a2a.ErrPushNotificationNotSupported
	}
	if c != nil {
		if _, err := h.getTask(ctx, string(c.TaskID)); err != nil {
			return nil, err
		}
	}
	out, err := h.G.push.set(ctx, c)
	return out, a2aError(err)
}

// OnGetTaskPushConfig returns a task's push-notification config.
func (h *A2AHandler) OnGetTaskPushConfig(ctx context.Context, q *a2a.GetTaskPushConfigParams) (*a2a.TaskPushConfig, error) {
	if h.G.push == nil {
		return nil, a2a.ErrPushNotificationNotSupported
	}
	if q == nil || q.TaskID == "" {
		return nil, a2aError(fmt.Errorf("no task id: %w", errs.InvalidArgument))
	}
	out, err := h.G.push.get(ctx, q.TaskID, q.ConfigID)
	return out, a2aError(err)
}

// OnListTaskPushConfig lists a task's push-notification configs.
func (h *A2AHandler) OnListTaskPushConfig(ctx context.Context, q *a2a.ListTaskPushConfigParams) ([]*a2a.TaskPushConfig, error) {
	if h.G.push == nil {
		return nil, a2a.ErrPushNotificationNotSupported
	}
	if q == nil || q.TaskID == "" {
		return nil, a2aError(fmt.Errorf("no task id: %w", errs.InvalidArgument))
	}
	out, err := h.G.push.list(ctx, q.TaskID)
	return out, a2aError(err)
}

// OnDeleteTaskPushConfig deletes a task's push-notification config.
func (h *A2AHandler) OnDeleteTaskPushConfig(ctx context.Context, q *a2a.DeleteTaskPushConfigParams) error {
	if h.G.push == nil {
		return a2a.ErrPushNotificationNotSupported
	}
	if q == nil || q.TaskID == "" || q.ConfigID == "" {
		return a2aError(fmt.Errorf("name the task and the config: %w", errs.InvalidArgument))
	}
	return a2aError(h.G.push.del(ctx, q.TaskID, q.ConfigID))
}

// pushOnSend stores the push-notification config a message's send
// configuration carries for its new task.
func (h *A2AHandler) pushOnSend(ctx context.Context, id string, c *a2a.MessageSendConfig) error {
	if c == nil || c.PushConfig == nil {
		return nil
	}
	if h.G.push == nil {
		return a2a.ErrPushNotificationNotSupported
	}
	_, err := h.G.push.set(ctx, &a2a.TaskPushConfig{TaskID: a2a.TaskID(id), Config: *c.PushConfig})
	return a2aError(err)
}

// jsonrpcDeleteFix answers a successful tasks/pushNotificationConfig/delete
// with a JSON-RPC result (null): a2a-go v0.3.3's JSON-RPC handler writes
// no body for it, and its client then fails ("failed to decode response:
// EOF") although the config was deleted.
func jsonrpcDeleteFix(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
		if err != nil {
			httpError(w, fmt.Errorf("reading the request: %v: %w", err, errs.InvalidArgument))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			Method string          `json:"method"`
			ID     json.RawMessage `json:"id"`
		}
		if json.Unmarshal(body, &req) != nil || req.Method != "tasks/pushNotificationConfig/delete" {
			next.ServeHTTP(w, r)
			return
		}
		cw := &countingWriter{ResponseWriter: w}
		next.ServeHTTP(cw, r)
		if cw.n == 0 && !cw.wroteHeader {
			id := req.ID
			if len(id) == 0 {
				id = json.RawMessage("null")
			}
			writeJSON(w, map[string]any{"jsonrpc": "2.0", "id": id, "result": nil})
		}
	})
}

// countingWriter notes whether anything was written.
type countingWriter struct {
	http.ResponseWriter
	n           int
	wroteHeader bool
}

func (c *countingWriter) WriteHeader(code int) {
	c.wroteHeader = true
	c.ResponseWriter.WriteHeader(code)
}
func (c *countingWriter) Write(b []byte) (int, error) {
	c.n += len(b)
	return c.ResponseWriter.Write(b)
}
