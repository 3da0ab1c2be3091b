package environment

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment/workspace"
)

// Sandbox session bounds.
const (
	// DefaultSandboxIdle is how long an unused sandbox lasts when
	// CreateSandbox sets no idle_timeout.
	DefaultSandboxIdle = 10 * time.Minute
	// MaxExecStdin is the most standard input one Exec takes.
	MaxExecStdin = 16 << 20
	// MaxSandboxes is the most sandbox sessions a service keeps.
	MaxSandboxes = 256
	// execChunk is the largest output chunk Exec sends.
	execChunk = 64 << 10
)

// sandboxSession is one CreateSandbox.
type sandboxSession struct {
	id      string
	spec    *environmentv1.EnvironmentSpec
	backend string
	idle    time.Duration
	timer   *time.Timer
}

// sandboxes are a server's sandbox sessions.
type sandboxes struct {
	mu  sync.Mutex
	all map[string]*sandboxSession
}

// CreateSandbox implements EnvironmentService.CreateSandbox.
func (s *Server) CreateSandbox(_ context.Context, req *environmentv1.CreateSandboxRequest) (*environmentv1.CreateSandboxResponse, error) {
	if req.GetSpec() == nil {
		return nil, fmt.Errorf("spec is required: %w", errs.InvalidArgument)
	}
	spec := proto.Clone(req.GetSpec()).(*environmentv1.EnvironmentSpec)
	spec.Workspace = nil // the sandbox has its own
	if s.cfg.Workspaces == nil {
		return nil, fmt.Errorf("this environment service keeps no workspaces, which sandboxes need: %w", errs.FailedPrecondition)
	}
	// Everything Run would refuse is refused now, not at the first Exec.
	if _, err := s.cfg.Defaults.ParseTimeout(spec); err != nil {
		return nil, err
	}
	if _, err := s.cfg.Defaults.ParseLimits(spec.GetResources()); err != nil {
		return nil, err
	}
	if _, err := ParseNetwork(spec); err != nil {
		return nil, err
	}
	b, err := s.choose(spec)
	if err != nil {
		return nil, err
	}
	if _, ok := b.(Executor); !ok {
		return nil, fmt.Errorf("the %s backend runs no sandbox sessions (the process backend does): %w", b.Name(), errs.FailedPrecondition)
	}
	idle := DefaultSandboxIdle
	if d := req.GetIdleTimeout(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() <= 0 || d.AsDuration() > 24*time.Hour {
			return nil, fmt.Errorf("idle_timeout %v: want a duration up to 24h: %w", d, errs.InvalidArgument)
		}
		idle = d.AsDuration()
	}
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	sb := &sandboxSession{id: "sbx-" + hex.EncodeToString(raw[:]), spec: spec, backend: b.Name(), idle: idle}
	if err := os.Mkdir(s.cfg.Workspaces.Path(workspace.SandboxName(sb.id)), 0o700); err != nil {
		return nil, fmt.Errorf("creating the sandbox's workspace: %v: %w", err, errs.Internal)
	}
	s.sb.mu.Lock()
	if s.sb.all == nil {
		s.sb.all = map[string]*sandboxSession{}
	}
	if len(s.sb.all) >= MaxSandboxes {
		s.sb.mu.Unlock()
		_, _ = s.cfg.Workspaces.Delete(context.Background(), workspace.SandboxName(sb.id))
		return nil, fmt.Errorf("this environment service already keeps %d sandboxes; close one first: %w", MaxSandboxes, errs.ResourceExhausted)
	}
	s.sb.all[sb.id] = sb
	sb.timer = time.AfterFunc(idle, func() {
		s.cfg.Log.Info("sandbox idle: closed", "sandbox", sb.id, "idle_timeout", idle.String())
		s.closeSandbox(sb.id)
	})
	s.sb.mu.Unlock()
	s.cfg.Log.Info("sandbox created", "sandbox", sb.id, "backend", b.Name(), "idle_timeout", idle.String())
	return &environmentv1.CreateSandboxResponse{SandboxId: sb.id, Backend: b.Name()}, nil
}

// CloseSandbox implements EnvironmentService.CloseSandbox.
func (s *Server) CloseSandbox(_ context.Context, req *environmentv1.CloseSandboxRequest) (*environmentv1.CloseSandboxResponse, error) {
	return &environmentv1.CloseSandboxResponse{Existed: s.closeSandbox(req.GetSandboxId())}, nil
}

// closeSandbox forgets sandbox id and removes its workspace (after a
// command running in it ends).
func (s *Server) closeSandbox(id string) bool {
	s.sb.mu.Lock()
	sb, ok := s.sb.all[id]
	delete(s.sb.all, id)
	s.sb.mu.Unlock()
	if !ok {
		return false
	}
	sb.timer.Stop()
	if _, err := s.cfg.Workspaces.Delete(context.Background(), workspace.SandboxName(id)); err != nil {
		s.cfg.Log.Warn("removing a sandbox's workspace", "sandbox", id, "error", err.Error())
	}
	return true
}

// lookup returns sandbox id, its idle timer stopped while a command
// runs (touch restarts it).
func (s *Server) lookup(id string) (*sandboxSession, error) {
	s.sb.mu.Lock()
	defer s.sb.mu.Unlock()
	sb, ok := s.sb.all[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %q does not exist (never created, closed, or idle past its idle_timeout): %w", id, errs.NotFound)
	}
	sb.timer.Stop()
	return sb, nil
}

// touch restarts the idle timer of sb, when it still exists.
func (s *Server) touch(sb *sandboxSession) {
	s.sb.mu.Lock()
	defer s.sb.mu.Unlock()
	if s.sb.all[sb.id] == sb {
		sb.timer.Reset(sb.idle)
	}
}

// Exec implements EnvironmentService.Exec.
func (s *Server) Exec(stream environmentv1.EnvironmentService_ExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return fmt.Errorf("the first message of Exec must be start: %w", errs.InvalidArgument)
	}
	if start.GetTty() {
		return fmt.Errorf("a pseudo-terminal is not available on this environment service yet; run the command without tty: %w", errs.FailedPrecondition)
	}
	sb, err := s.lookup(start.GetSandboxId())
	if err != nil {
		return err
	}
	defer s.touch(sb)
	// Standard input, whole, up to its cap.
	var stdin []byte
	closed := false
	for !closed {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		switch k := m.GetKind().(type) {
		case *environmentv1.ExecRequest_Stdin:
			if len(stdin)+len(k.Stdin) > MaxExecStdin {
				return fmt.Errorf("standard input past %d bytes; write larger input as a file (WriteWorkspaceFile) and read it from there: %w", MaxExecStdin, errs.ResourceExhausted)
			}
			stdin = append(stdin, k.Stdin...)
		case *environmentv1.ExecRequest_CloseStdin:
			closed = true
		case *environmentv1.ExecRequest_Signal:
			return fmt.Errorf("signal %s before the command started: it was not run: %w", k.Signal, errs.Canceled)
		default:
			return fmt.Errorf("a second start: %w", errs.InvalidArgument)
		}
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	// A signal (or the caller going away) stops the command: every
	// process of it is killed.
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					cancel()
				}
				return
			}
			if m.GetSignal() != "" {
				s.cfg.Log.Info("sandbox command signalled: stopping it", "sandbox", sb.id, "signal", m.GetSignal())
				cancel()
				return
			}
		}
	}()
	select {
	case s.running <- struct{}{}:
		defer func() { <-s.running }()
	default:
		return fmt.Errorf("this environment service is already running its limit of %d concurrent invocations (max-concurrent); retry later: %w", s.cfg.MaxConcurrent, errs.ResourceExhausted)
	}
	inv, backend, err := s.prepare(ctx, &environmentv1.RunRequest{Input: &operatorv1.OperatorInput{}, Spec: sb.spec})
	if err != nil {
		return err
	}
	exe, ok := backend.(Executor)
	if !ok {
		return fmt.Errorf("the %s backend runs no sandbox sessions: %w", backend.Name(), errs.FailedPrecondition)
	}
	inv.Workspace = &Workspace{Name: workspace.SandboxName(sb.id), store: s.cfg.Workspaces}
	unlock, err := s.cfg.Workspaces.Lock(ctx, inv.Workspace.Name)
	if err != nil {
		return s.scrubError(inv.scrubber, err)
	}
	defer unlock()
	inv.Log.Info("sandbox exec", "sandbox", sb.id, "backend", backend.Name(), "argv0", start.GetArgv()[0])
	res, err := exe.Exec(ctx, inv, start.GetArgv(), stdin)
	if res == nil && err != nil {
		return s.scrubError(inv.scrubber, err)
	}
	// What comes back is scrubbed like a Run's output: the command may
	// print an injected credential.
	for _, part := range []struct {
		data []byte
		msg  func([]byte) *environmentv1.ExecResponse
	}{
		{res.Stdout, func(b []byte) *environmentv1.ExecResponse {
			return &environmentv1.ExecResponse{Kind: &environmentv1.ExecResponse_Stdout{Stdout: b}}
		}},
		{res.Stderr, func(b []byte) *environmentv1.ExecResponse {
			return &environmentv1.ExecResponse{Kind: &environmentv1.ExecResponse_Stderr{Stderr: b}}
		}},
	} {
		data := inv.scrubber.Bytes(part.data)
		for len(data) > 0 {
			n := min(len(data), execChunk)
			if err := stream.Send(part.msg(data[:n])); err != nil {
				return err
			}
			data = data[n:]
		}
	}
	if err != nil {
		return s.scrubError(inv.scrubber, err)
	}
	return stream.Send(&environmentv1.ExecResponse{Kind: &environmentv1.ExecResponse_Exit{Exit: &environmentv1.ExecExit{
		Code: int32(res.Code), Signal: res.Signal, TimedOut: res.TimedOut, LimitsHit: res.LimitsHit,
	}}})
}
