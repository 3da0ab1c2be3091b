package gateway

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
)

// Scheduled runs. A schedule (a name, an agent, a cron expression and a
// message) is a record in the State service (scope StateScope, key
// schedulePrefix+name). Each tick is one workflow whose id is made of
// the schedule and the tick's time (ScheduleTaskID), started with
// StartWorkflow: a second start of a tick, by a restarted gateway or by
// another replica, answers ALREADY_EXISTS and is taken as done. After
// the start the record's last_tick moves on with compare-and-set.
//
// Missed ticks (the gateway was down, or the check came late): only the
// latest missed tick runs, once; the earlier ones are skipped and the
// count is logged. Ticks run in their own session (ScheduleSession), so
// they never wait behind a person's messages, nor hold them up.

// schedulePrefix is the State key prefix of the schedules.
const schedulePrefix = "schedule/"

// DefaultScheduleCheck is how often the gateway looks for due ticks.
const DefaultScheduleCheck = time.Second

// maxSkippedTicks bounds the walk over ticks missed while down.
const maxSkippedTicks = 1 << 20

var scheduleNamePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// Schedule is an agent's cron schedule.
type Schedule struct {
	// Name names it (1 to 100 letters, digits and . _ -).
	Name string `json:"name"`
	// Agent is the agent each tick runs.
	Agent string `json:"agent"`
	// Cron is a standard five-field cron expression ("*/5 * * * *") or a
	// descriptor ("@hourly", "@every 10m"), optionally after
	// "CRON_TZ=<zone> "; without a zone, UTC.
	Cron string `json:"cron"`
	// Message is the text each tick sends the agent.
	Message string `json:"message"`
	// CreatedAt is when it was created: the first tick is the first one
	// after it.
	CreatedAt time.Time `json:"created_at"`
	// LastTick is the latest tick run (zero: none yet).
	LastTick time.Time `json:"last_tick,omitzero"`
	// NextTick is the next tick due (filled in by List, not stored).
	NextTick time.Time `json:"next_tick,omitzero"`
}

// ScheduleSession is the session of schedule name's runs.
func ScheduleSession(name string) string { return "sched." + name }

// ScheduleTaskID is the workflow id of schedule name's tick at: the
// same for every gateway and every restart.
func ScheduleTaskID(name string, at time.Time) string {
	return fmt.Sprintf("%s~%016x", ScheduleSession(name), at.Unix())
}

// Scheduler keeps the schedules and starts their ticks.
type Scheduler struct {
	g   *Gateway
	kv  *kv
	now func() time.Time
}

// parseCron parses a schedule's cron expression, in UTC unless it names
// a zone.
func parseCron(expr string) (cron.Schedule, error) {
	e := strings.TrimSpace(expr)
	if e != "" && !strings.HasPrefix(e, "CRON_TZ=") && !strings.HasPrefix(e, "TZ=") {
		e = "CRON_TZ=UTC " + e
	}
	sc, err := cron.ParseStandard(e)
	if err != nil || expr == "" {
		if err == nil {
			err = errors.New("empty")
		}
		return nil, fmt.Errorf("cron expression %q: %v (use five fields, minute hour day-of-month month day-of-week, e.g. \"*/5 * * * *\", or @hourly, @daily, @every 10m): %w",
			clip(expr, 100), err, errs.InvalidArgument)
	}
	return sc, nil
}

// Create stores a new schedule. It fails INVALID_ARGUMENT for a bad
// name, cron expression or empty message, NOT_FOUND for an unknown
// agent, ALREADY_EXISTS when the name is taken.
func (s *Scheduler) Create(ctx context.Context, sc Schedule) (Schedule, error) {
	if !scheduleNamePattern.MatchString(sc.Name) {
		return Schedule{}, fmt.Errorf("schedule name %q: use 1 to 100 letters, digits and . _ -: %w", clip(sc.Name, 80), errs.InvalidArgument)
	}
	spec, err := parseCron(sc.Cron)
	if err != nil {
		return Schedule{}, err
	}
	if strings.TrimSpace(sc.Message) == "" {
		return Schedule{}, fmt.Errorf("schedule %q has no message: give the text each run sends the agent: %w", sc.Name, errs.InvalidArgument)
	}
	if sc.Agent == "" {
		return Schedule{}, fmt.Errorf("schedule %q names no agent: %w", sc.Name, errs.InvalidArgument)
	}
	if err := s.g.agents.Check(ctx, sc.Agent); err != nil {
		return Schedule{}, err
	}
	sc.CreatedAt, sc.LastTick, sc.NextTick = s.now().UTC(), time.Time{}, time.Time{}
	ok, err := s.kv.put(ctx, schedulePrefix+sc.Name, sc, 0)
	if err != nil {
		return Schedule{}, err
	}
	if !ok {
		return Schedule{}, fmt.Errorf("schedule %q already exists: delete it first, or choose another name: %w", sc.Name, errs.AlreadyExists)
	}
	sc.NextTick = spec.Next(sc.CreatedAt)
	return sc, nil
}

// List returns every schedule, by name, with its next tick.
func (s *Scheduler) List(ctx context.Context) ([]Schedule, error) {
	items, err := s.kv.list(ctx, schedulePrefix)
	if err != nil {
		return nil, err
	}
	out := make([]Schedule, 0, len(items))
	for _, it := range items {
		var sc Schedule
		if err := decodeValue(it.value, &sc); err != nil {
			continue
		}
		if spec, err := parseCron(sc.Cron); err == nil {
			sc.NextTick = spec.Next(sc.from())
		}
		out = append(out, sc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Delete removes schedule name: no tick of it starts after. NOT_FOUND
// when there is none.
func (s *Scheduler) Delete(ctx context.Context, name string) error {
	existed, err := s.kv.delAny(ctx, schedulePrefix+name)
	if err != nil {
		return err
	}
	if !existed {
		return fmt.Errorf("no schedule %q: %w", clip(name, 100), errs.NotFound)
	}
	return nil
}

// from is when the next tick is counted from.
func (sc Schedule) from() time.Time {
	if !sc.LastTick.IsZero() {
		return sc.LastTick
	}
	return sc.CreatedAt
}

// Tick starts the due tick of every schedule (the latest one, when
// several were missed) and returns the ids of the workflows it started
// or found started.
func (s *Scheduler) Tick(ctx context.Context) ([]string, error) {
	items, err := s.kv.list(ctx, schedulePrefix)
	if err != nil {
		return nil, err
	}
	now := s.now()
	var ids []string
	var errList []error
	for _, it := range items {
		var sc Schedule
		if err := decodeValue(it.value, &sc); err != nil {
			errList = append(errList, fmt.Errorf("schedule record %s: %w", it.key, err))
			continue
		}
		id, err := s.fire(ctx, sc, it.revision, now)
		if err != nil {
			errList = append(errList, fmt.Errorf("schedule %q: %w", sc.Name, err))
		}
		if id != "" {
			ids = append(ids, id)
		}
	}
	return ids, errors.Join(errList...)
}

// fire runs sc's latest due tick, if any.
func (s *Scheduler) fire(ctx context.Context, sc Schedule, rev uint64, now time.Time) (string, error) {
	spec, err := parseCron(sc.Cron)
	if err != nil {
		return "", err
	}
	tick := spec.Next(sc.from())
	if tick.IsZero() || tick.After(now) {
		return "", nil
	}
	skipped := 0
	for skipped < maxSkippedTicks {
		n := spec.Next(tick)
		if n.IsZero() || n.After(now) {
			break
		}
		tick = n
		skipped++
	}
	if skipped > 0 {
		s.g.log.Warn("schedule missed ticks: running the latest only", "schedule", sc.Name, "skipped", skipped, "tick", tick)
	}
	id := ScheduleTaskID(sc.Name, tick)
	session := ScheduleSession(sc.Name)
	md, _ := structpb.NewStruct(map[string]any{"schedule": sc.Name, "tick": tick.UTC().Format(time.RFC3339)})
	in := &operatorv1.OperatorInput{Message: content.Text(sc.Message), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_SCHEDULE, SessionId: &session, Metadata: md}
	_, err = s.g.orch.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{WorkflowId: id, AgentId: sc.Agent, Input: in})
	if err != nil && status.Code(err) != codes.AlreadyExists { // ALREADY_EXISTS: this tick ran (a restart, another replica)
		return "", fmt.Errorf("starting tick %s: %w", tick.UTC().Format(time.RFC3339), errs.FromGRPC(err))
	}
	sc.LastTick, sc.NextTick = tick.UTC(), time.Time{}
	if _, err := s.kv.put(ctx, schedulePrefix+sc.Name, sc, rev); err != nil { // stale: another replica moved it on
		return id, err
	}
	return id, nil
}

// run checks for due ticks every interval until ctx ends.
func (s *Scheduler) run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultScheduleCheck
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := s.Tick(ctx); err != nil && ctx.Err() == nil {
			s.g.log.Warn("schedules", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
