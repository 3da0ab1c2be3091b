package console

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
)

// A probe asks a service whether the caller may call one method, without
// doing anything: every service authorizes a call before it validates
// the request (pkg/grpcserver's chain), so a request that can never be
// valid answers PERMISSION_DENIED to a principal the policy does not
// allow the method, UNAUTHENTICATED to an unknown token, and
// INVALID_ARGUMENT to one it allows. The services stay the only source
// of truth of who may do what; the console hides what they would refuse.
type probe func(ctx context.Context, s *Server, opts []grpc.CallOption) error

// probes are the methods the pages use, by the names /api/me reports.
var probes = map[string]probe{
	"ListWorkflows": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.orch.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{PageSize: -1}, o...)
		return err
	},
	"GetWorkflow": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.orch.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{}, o...)
		return err
	},
	"WatchWorkflow": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		st, err := s.orch.WatchWorkflow(ctx, &orchestratorv1.WatchWorkflowRequest{}, o...)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	},
	"GetTranscript": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.orch.GetTranscript(ctx, &orchestratorv1.GetTranscriptRequest{PageSize: -1}, o...)
		return err
	},
	"ListApprovals": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.orch.ListApprovals(ctx, &orchestratorv1.ListApprovalsRequest{PageSize: -1}, o...)
		return err
	},
	"DecideApprovals": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.orch.DecideApprovals(ctx, &orchestratorv1.DecideApprovalsRequest{}, o...)
		return err
	},
	"UpdateWorkflowLimits": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.orch.UpdateWorkflowLimits(ctx, &orchestratorv1.UpdateWorkflowLimitsRequest{}, o...)
		return err
	},
	"CancelWorkflow": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.orch.CancelWorkflow(ctx, &orchestratorv1.CancelWorkflowRequest{}, o...)
		return err
	},
	"Signal": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.orch.Signal(ctx, &orchestratorv1.SignalRequest{}, o...)
		return err
	},
	"StartWorkflow": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.orch.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{}, o...)
		return err
	},
	"ListAgents": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.agents.ListAgents(ctx, &agentv1.ListAgentsRequest{PageSize: -1}, o...)
		return err
	},
	"GetAgent": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.agents.GetAgent(ctx, &agentv1.GetAgentRequest{}, o...)
		return err
	},
	"CreateAgent": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.agents.CreateAgent(ctx, &agentv1.CreateAgentRequest{}, o...)
		return err
	},
	"UpdateAgent": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.agents.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{}, o...)
		return err
	},
	"StateList": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.state.List(ctx, &statev1.ListRequest{}, o...)
		return err
	},
	"StateRead": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.state.Read(ctx, &statev1.ReadRequest{}, o...)
		return err
	},
	"StateSearch": func(ctx context.Context, s *Server, o []grpc.CallOption) error {
		_, err := s.state.Search(ctx, &statev1.SearchRequest{}, o...)
		return err
	},
}

// probeTimeout bounds the probes of one login.
const probeTimeout = 10 * time.Second

// probeResult is what the probes of one token found.
type probeResult struct {
	can map[string]bool
	// known: at least one service took the token (answered anything but
	// UNAUTHENTICATED or UNAVAILABLE).
	known bool
	// unauthenticated: at least one service said it does not know it.
	unauthenticated bool
}

// probeAll runs every probe with opts, concurrently.
func (s *Server) probeAll(ctx context.Context, opts []grpc.CallOption) probeResult {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		res = probeResult{can: map[string]bool{}}
	)
	for name, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := status.Code(p(ctx, s, opts))
			mu.Lock()
			defer mu.Unlock()
			switch code {
			case codes.Unauthenticated:
				res.unauthenticated = true
				res.can[name] = false
			case codes.PermissionDenied:
				res.known = true
				res.can[name] = false
			case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
				// Not known; the pages show it and the call says why.
			default:
				res.known = true
				res.can[name] = true
			}
		}()
	}
	wg.Wait()
	return res
}
