package hook

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
)

// Remote is a hook served by a layer0.operator.v1.HookService. It is safe
// for concurrent use.
type Remote struct {
	client  operatorv1.HookServiceClient
	name    string
	points  []operatorv1.HookPoint
	timeout time.Duration
}

// DialRemote asks the HookService on cc for its name and points, within
// timeout (<= 0: DefaultTimeout), and returns the hook. It fails when
// Describe fails (the service is down, not ready or too slow) or describes
// no points or an undefined or unspecified point. Duplicate points are
// ignored. A hook that gives no name is named after cc's target.
//
// Every OnHook call is bounded by timeout too. cc stays the caller's.
func DialRemote(ctx context.Context, cc grpc.ClientConnInterface, timeout time.Duration) (*Remote, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	where := "remote hook"
	if t, ok := cc.(interface{ Target() string }); ok {
		where = "remote hook at " + t.Target()
	}
	client := operatorv1.NewHookServiceClient(cc)
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := client.Describe(dctx, &operatorv1.DescribeRequest{})
	if err != nil {
		return nil, fmt.Errorf("%s: Describe failed (is the hook service running and reachable?): %w", where, err)
	}
	name := resp.GetName()
	if name == "" {
		name = where
	} else {
		where = fmt.Sprintf("%s (%q)", where, name)
	}
	if len(resp.GetPoints()) == 0 {
		return nil, fmt.Errorf("%s: Describe lists no hook points", where)
	}
	var points []operatorv1.HookPoint
	for _, p := range resp.GetPoints() {
		if !ValidPoint(p) {
			return nil, fmt.Errorf("%s: Describe lists invalid hook point %v", where, p)
		}
		if !slices.Contains(points, p) {
			points = append(points, p)
		}
	}
	return &Remote{client: client, name: name, points: points, timeout: timeout}, nil
}

// Name implements Hook: the name the service described.
func (r *Remote) Name() string { return r.name }

// Points implements Hook: the points the service described.
func (r *Remote) Points() []operatorv1.HookPoint { return slices.Clone(r.points) }

// OnHook implements Hook: one OnHook call bounded by the remote's timeout.
// A call error, or an action that fails CheckAction, is an error.
func (r *Remote) OnHook(ctx context.Context, hc *operatorv1.HookContext) (*operatorv1.HookAction, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.client.OnHook(ctx, &operatorv1.OnHookRequest{Context: hc})
	if err != nil {
		return nil, fmt.Errorf("remote hook %q: OnHook: %w", r.name, err)
	}
	act := resp.GetAction()
	if err := CheckAction(act); err != nil {
		return nil, fmt.Errorf("remote hook %q returned an invalid action: %w", r.name, err)
	}
	return act, nil
}
