package environment

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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
	// MaxSandboxes is the most sandbox sessions a service keeps.
	MaxSandboxes = 256
	// execChunk is the largest output chunk Exec sends, and what it
	// reads from the command's output at once.
	execChunk = 32 << 10
)

// sandboxSession is one CreateSandbox.
type sandboxSession struct {
	id      string
	spec    *environmentv1.EnvironmentSpec
	backend string
	idle    time.Duration
	timer   *time.Timer
	// host keeps the sandbox on the backend's platform; nil: the
	// service's store keeps its workspace and each command gets a
	// fresh sandbox.
	host SandboxHost
}

// sandboxCloseTimeout bounds the removal of a sandbox a backend keeps.
const sandboxCloseTimeout = time.Minute

// sandboxes are a server's sandbox sessions.
type sandboxes struct {
	mu  sync.Mutex
	all map[string]*sandboxSession
	// opening counts sandboxes being made.
	opening int
}

// CreateSandbox implements EnvironmentService.CreateSandbox.
func (s *Server) CreateSandbox(ctx context.Context, req *environmentv1.CreateSandboxRequest) (*environmentv1.CreateSandboxResponse, error) {
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
	if _, ok := b.(StreamExecutor); !ok {
		return nil, fmt.Errorf("the %s backend runs no sandbox sessions (the process and docker backends do): %w", b.Name(), errs.FailedPrecondition)
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
	sb.host, _ = b.(SandboxHost)
	// The slot is taken before anything is made, so that no more than
	// MaxSandboxes are ever being made or kept.
	s.sb.mu.Lock()
	if s.sb.all == nil {
		s.sb.all = map[string]*sandboxSession{}
	}
	if len(s.sb.all)+s.sb.opening >= MaxSandboxes {
		s.sb.mu.Unlock()
		return nil, fmt.Errorf("this environment service already keeps %d sandboxes; close one first: %w", MaxSandboxes, errs.ResourceExhausted)
	}
	s.sb.opening++
	s.sb.mu.Unlock()
	if err := s.openSandbox(ctx, sb); err != nil {
		s.sb.mu.Lock()
		s.sb.opening--
		s.sb.mu.Unlock()
		return nil, err
	}
	s.sb.mu.Lock()
	s.sb.opening--
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
	if sb.host != nil {
		// After a command running in it ends (Exec holds the lock).
		ctx, cancel := context.WithTimeout(context.Background(), sandboxCloseTimeout)
		defer cancel()
		name := workspace.SandboxName(id)
		unlock, err := s.cfg.Workspaces.Lock(ctx, name)
		if err == nil {
			defer unlock()
		}
		if err := sb.host.CloseSandbox(ctx, name); err != nil {
			s.cfg.Log.Warn("removing a sandbox", "sandbox", id, "backend", sb.backend, "error", err.Error())
		}
		return true
	}
	if _, err := s.cfg.Workspaces.Delete(context.Background(), workspace.SandboxName(id)); err != nil {
		s.cfg.Log.Warn("removing a sandbox's workspace", "sandbox", id, "error", err.Error())
	}
	return true
}

// openSandbox makes sandbox sb's workspace, in the service's store, or,
// on a backend that keeps sandboxes itself, the sandbox on its platform.
func (s *Server) openSandbox(ctx context.Context, sb *sandboxSession) error {
	name := workspace.SandboxName(sb.id)
	if sb.host == nil {
		if err := os.Mkdir(s.cfg.Workspaces.Path(name), 0o700); err != nil {
			return fmt.Errorf("creating the sandbox's workspace: %v: %w", err, errs.Internal)
		}
		return nil
	}
	inv, _, err := s.prepare(ctx, &environmentv1.RunRequest{Input: &operatorv1.OperatorInput{}, Spec: sb.spec})
	if err != nil {
		return err
	}
	inv.Workspace = &Workspace{Name: name, store: s.cfg.Workspaces}
	if err := sb.host.OpenSandbox(ctx, inv); err != nil {
		return s.scrubError(inv.scrubber, err)
	}
	return nil
}

// closeSandboxes closes every sandbox (the service is stopping).
func (s *Server) closeSandboxes() {
	s.sb.mu.Lock()
	ids := make([]string, 0, len(s.sb.all))
	for id := range s.sb.all {
		ids = append(ids, id)
	}
	s.sb.mu.Unlock()
	for _, id := range ids {
		s.closeSandbox(id)
	}
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
