package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/flagenv"
)

const eventsHelp = `Tail the orchestrator's lifecycle events: budget (cost of every operator
call, warnings, decisions), compaction, and observability (workflows
started and ended, operator calls, effects applied, logs). One line per
event: sequence, time, workflow, agent, what happened. Runs until Ctrl-C,
--count events or --idle time without one.

--after N first replays the buffered events after sequence N (--after 0:
everything still buffered), so a reconnecting tail misses nothing.`

// keptSequence finds the sequence an OUT_OF_RANGE Subscribe error names
// (the proto promises that the message names the oldest one kept).
var keptSequence = regexp.MustCompile(`(?:oldest sequence kept|next sequence) is (\d+)`)

// cmdEvents is `neuron events`: it tails the lifecycle events.
func (c *cli) cmdEvents(ctx context.Context, args []string) error {
	var (
		cn             conn
		after          *uint64
		workflow, agnt string
		kinds, sources string
		count          int
		idle           time.Duration
	)
	fs := newFlagSet("events", "neuron events [--after N] [--workflow ID] [--agent ID] [--kind K,...] [flags]", eventsHelp, c.stdout)
	cn.bind(fs, c, "orchestrator", "NEURON_ORCHESTRATOR_ADDR", defaultOrchestratorAddr, 0)
	fs.Func("after", "replay the buffered events with a sequence above `N` first", func(s string) error {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return errors.New("want a sequence number")
		}
		after = &n
		return nil
	})
	fs.StringVar(&workflow, "workflow", "", "only the events of this workflow")
	fs.StringVar(&agnt, "agent", "", "only the events about this agent")
	fs.StringVar(&kinds, "kind", "", "only these kinds, comma-separated: budget, compaction, observable")
	fs.StringVar(&sources, "source", "", "only observable events from these sources, comma-separated: operator, orchestrator, state, environment, middleware")
	fs.IntVar(&count, "count", 0, "exit after this many events (0: no limit)")
	fs.DurationVar(&idle, "idle", 0, "exit after this long without an event (0: never)")
	pos, err := parseArgs(fs, "events", args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("events", "unexpected arguments %q", pos)
	}
	req := &lifecyclev1.SubscribeRequest{WorkflowId: workflow, AgentId: agnt, AfterSequence: after}
	for _, k := range flagenv.SplitList(kinds) {
		v, ok := lifecyclev1.EventKind_value["EVENT_KIND_"+strings.ToUpper(k)]
		if !ok || v == 0 {
			return usageErrorf("events", "--kind %q: want budget, compaction or observable", k)
		}
		req.Kinds = append(req.Kinds, lifecyclev1.EventKind(v))
	}
	for _, s := range flagenv.SplitList(sources) {
		v, ok := lifecyclev1.EventSource_value["EVENT_SOURCE_"+strings.ToUpper(s)]
		if !ok || v == 0 {
			return usageErrorf("events", "--source %q: want operator, orchestrator, state, environment or middleware", s)
		}
		req.Sources = append(req.Sources, lifecyclev1.EventSource(v))
	}
	if cn.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cn.timeout)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cc, err := cn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	cn.hints = map[codes.Code]string{codes.OutOfRange: "pass a later --after, or none to tail live events"}
	client := lifecyclev1.NewLifecycleServiceClient(cc)

	var idleTimer *time.Timer
	if idle > 0 {
		idleTimer = time.AfterFunc(idle, cancel)
		defer idleTimer.Stop()
	}
	seen, retried := 0, false
	for {
		stream, err := client.Subscribe(ctx, req)
		if err != nil {
			return c.endOfEvents(ctx, &cn, err)
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				// Events before the buffer: start from the oldest kept.
				if m := keptSequence.FindStringSubmatch(status.Convert(err).Message()); status.Code(err) == codes.OutOfRange && seen == 0 && !retried && m != nil {
					oldest, _ := strconv.ParseUint(m[1], 10, 64)
					if *req.AfterSequence > 0 {
						fmt.Fprintf(c.stderr, "neuron events: events after %d are no longer buffered; starting from %d, the oldest kept\n", *req.AfterSequence, oldest)
					}
					from := oldest - 1
					req.AfterSequence, retried = &from, true
					break
				}
				return c.endOfEvents(ctx, &cn, err)
			}
			if idleTimer != nil {
				idleTimer.Reset(idle)
			}
			if n := resp.GetDropped(); n > 0 && !cn.json {
				fmt.Fprintf(c.stdout, "(%d event(s) dropped: this tail fell behind)\n", n)
			}
			if cn.json {
				printJSONLine(c.stdout, resp)
			} else {
				fmt.Fprintln(c.stdout, eventLine(resp.GetEvent()))
			}
			seen++
			if count > 0 && seen >= count {
				return nil
			}
		}
	}
}

// endOfEvents turns the end of the stream into the command's result: the
// user's Ctrl-C, --idle or --timeout is a normal end.
func (c *cli) endOfEvents(ctx context.Context, cn *conn, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return cn.wrap(err)
}
