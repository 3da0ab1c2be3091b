package environment

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"context"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment/workspace"
)

// workspaceOf returns the workspace that lasts an invocation of in with
// spec works in, or nil for a fresh one. The session or workflow comes
// from the input, as the orchestrator dispatched it: the service trusts
// its caller for them, as for the state bridge's scopes.
func (s *Server) workspaceOf(in *operatorv1.OperatorInput, spec *environmentv1.EnvironmentSpec, b Backend) (*Workspace, error) {
	var n string
	switch sc := spec.GetWorkspace().GetScope(); sc {
	case environmentv1.WorkspaceScope_WORKSPACE_SCOPE_UNSPECIFIED, environmentv1.WorkspaceScope_WORKSPACE_SCOPE_INVOCATION:
		return nil, nil
	case environmentv1.WorkspaceScope_WORKSPACE_SCOPE_SESSION:
		if in.GetSessionId() == "" {
			return nil, fmt.Errorf("spec.workspace.scope is SESSION, but the input names no session_id: %w", errs.InvalidArgument)
		}
		n = workspace.SessionName(in.GetSessionId())
	case environmentv1.WorkspaceScope_WORKSPACE_SCOPE_WORKFLOW:
		if in.GetDispatch().GetWorkflowId() == "" {
			return nil, fmt.Errorf("spec.workspace.scope is WORKFLOW, but the input's dispatch names no workflow_id: %w", errs.InvalidArgument)
		}
		n = workspace.WorkflowName(in.GetDispatch().GetWorkflowId())
	default:
		return nil, fmt.Errorf("spec.workspace.scope %v is not known to this environment service: %w", sc, errs.InvalidArgument)
	}
	if s.cfg.Workspaces == nil {
		return nil, fmt.Errorf("spec.workspace asks for a workspace that lasts, but this environment service keeps none: %w", errs.FailedPrecondition)
	}
	if p, ok := b.(Persistent); !ok || !p.PersistentWorkspaces() {
		return nil, fmt.Errorf("spec.workspace asks for a workspace that lasts, which the %s backend does not keep (the process, docker and kubernetes backends do): %w", b.Name(), errs.FailedPrecondition)
	}
	return &Workspace{Name: n, store: s.cfg.Workspaces}, nil
}

// store returns the workspace store and the name ref names.
func (s *Server) store(ref *environmentv1.WorkspaceRef) (*workspace.Store, string, error) {
	if s.cfg.Workspaces == nil {
		return nil, "", fmt.Errorf("this environment service keeps no workspaces: %w", errs.FailedPrecondition)
	}
	n, err := workspace.Name(ref)
	return s.cfg.Workspaces, n, err
}

// ListWorkspaceFiles implements EnvironmentService.ListWorkspaceFiles.
func (s *Server) ListWorkspaceFiles(ctx context.Context, req *environmentv1.ListWorkspaceFilesRequest) (*environmentv1.ListWorkspaceFilesResponse, error) {
	st, n, err := s.store(req.GetWorkspace())
	if err != nil {
		return nil, err
	}
	if h, err := s.hostOf(ctx, n, false); err != nil || h != nil {
		if err != nil {
			return nil, err
		}
		unlock, err := st.Lock(ctx, n)
		if err != nil {
			return nil, err
		}
		defer unlock()
		files, truncated, total, err := h.ListWorkspace(ctx, n, req.GetPath())
		if err != nil {
			return nil, err
		}
		return &environmentv1.ListWorkspaceFilesResponse{Files: files, Truncated: truncated, TotalBytes: total}, nil
	}
	files, truncated, total, err := st.List(n, req.GetPath())
	if err != nil {
		return nil, err
	}
	return &environmentv1.ListWorkspaceFilesResponse{Files: files, Truncated: truncated, TotalBytes: total}, nil
}

// ReadWorkspaceFile implements EnvironmentService.ReadWorkspaceFile.
func (s *Server) ReadWorkspaceFile(req *environmentv1.ReadWorkspaceFileRequest, stream environmentv1.EnvironmentService_ReadWorkspaceFileServer) error {
	st, n, err := s.store(req.GetWorkspace())
	if err != nil {
		return err
	}
	if h, err := s.hostOf(stream.Context(), n, false); err != nil || h != nil {
		if err != nil {
			return err
		}
		unlock, err := st.Lock(stream.Context(), n)
		if err != nil {
			return err
		}
		defer unlock()
		return h.ReadWorkspace(stream.Context(), n, req.GetPath(), &downloadWriter{stream: stream})
	}
	f, err := st.Open(n, req.GetPath())
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, workspace.ChunkSize)
	for {
		k, err := f.Read(buf)
		if k > 0 {
			if serr := stream.Send(&environmentv1.ReadWorkspaceFileResponse{Data: buf[:k]}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %v: %w", req.GetPath(), err, errs.Internal)
		}
	}
}

// WriteWorkspaceFile implements EnvironmentService.WriteWorkspaceFile.
func (s *Server) WriteWorkspaceFile(stream environmentv1.EnvironmentService_WriteWorkspaceFileServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return fmt.Errorf("the first message of WriteWorkspaceFile must be its header: %w", errs.InvalidArgument)
	}
	st, n, err := s.store(h.GetWorkspace())
	if err != nil {
		return err
	}
	host, err := s.hostOf(stream.Context(), n, true)
	if err != nil {
		return err
	}
	var size int64
	if host != nil {
		unlock, err := st.Lock(stream.Context(), n)
		if err != nil {
			return err
		}
		defer unlock()
		size, err = host.WriteWorkspace(stream.Context(), n, h.GetPath(), os.FileMode(h.GetMode()), &uploadReader{stream: stream}, st.Cap())
		if err != nil {
			return err
		}
	} else if size, err = st.Write(stream.Context(), n, h.GetPath(), os.FileMode(h.GetMode()), &uploadReader{stream: stream}); err != nil {
		return err
	}
	return stream.SendAndClose(&environmentv1.WriteWorkspaceFileResponse{Size: uint64(size)})
}

// uploadReader reads the data messages of a WriteWorkspaceFile stream.
type uploadReader struct {
	stream environmentv1.EnvironmentService_WriteWorkspaceFileServer
	rest   []byte
}

func (u *uploadReader) Read(p []byte) (int, error) {
	for len(u.rest) == 0 {
		m, err := u.stream.Recv()
		if err != nil {
			return 0, err // io.EOF at the end
		}
		if m.GetHeader() != nil {
			return 0, fmt.Errorf("WriteWorkspaceFile: a second header: %w", errs.InvalidArgument)
		}
		u.rest = m.GetData()
	}
	k := copy(p, u.rest)
	u.rest = u.rest[k:]
	return k, nil
}

// DeleteWorkspace implements EnvironmentService.DeleteWorkspace.
func (s *Server) DeleteWorkspace(ctx context.Context, req *environmentv1.DeleteWorkspaceRequest) (*environmentv1.DeleteWorkspaceResponse, error) {
	st, n, err := s.store(req.GetWorkspace())
	if err != nil {
		return nil, err
	}
	existed, err := st.Delete(ctx, n)
	if err != nil {
		return nil, err
	}
	// A workspace on a backend's platform (a volume, a claim) too.
	for _, h := range s.hosts() {
		unlock, err := st.Lock(ctx, n)
		if err != nil {
			return nil, err
		}
		gone, err := h.DeleteWorkspace(ctx, n)
		unlock()
		if err != nil {
			return nil, err
		}
		existed = existed || gone
	}
	return &environmentv1.DeleteWorkspaceResponse{Existed: existed}, nil
}

// hosts returns the backends that keep workspaces on their own platform,
// the default backend's first, then the container backend's, then the
// others by name.
func (s *Server) hosts() []WorkspaceHost {
	names := []string{s.cfg.Default, s.cfg.Container}
	rest := make([]string, 0, len(s.backends))
	for n := range s.backends {
		rest = append(rest, n)
	}
	sort.Strings(rest)
	var out []WorkspaceHost
	seen := map[string]bool{}
	for _, n := range append(names, rest...) {
		b, ok := s.backends[n]
		if !ok || seen[n] {
			continue
		}
		seen[n] = true
		if h, ok := b.(WorkspaceHost); ok {
			out = append(out, h)
		}
	}
	return out
}

// hostOf returns the backend keeping workspace n on its platform, or nil
// when the service's store keeps it. A workspace in the store is the
// store's; else the first host that has it. For a write (create) to a
// workspace nobody has yet: the default backend's host when it is one,
// else the store when a backend uses it, else the first host.
func (s *Server) hostOf(ctx context.Context, n string, create bool) (WorkspaceHost, error) {
	hosts := s.hosts()
	if len(hosts) == 0 || s.cfg.Workspaces.Exists(n) {
		return nil, nil
	}
	for _, h := range hosts {
		ok, err := h.HasWorkspace(ctx, n)
		if err != nil {
			return nil, err
		}
		if ok {
			return h, nil
		}
	}
	if !create {
		return nil, nil // the store answers NOT_FOUND
	}
	if h, ok := s.backends[s.cfg.Default].(WorkspaceHost); ok {
		return h, nil
	}
	for _, b := range s.backends {
		if _, host := b.(WorkspaceHost); host {
			continue
		}
		if p, ok := b.(Persistent); ok && p.PersistentWorkspaces() {
			return nil, nil
		}
	}
	return hosts[0], nil
}

// downloadWriter sends what is written to it as ReadWorkspaceFile
// messages of at most workspace.ChunkSize bytes.
type downloadWriter struct {
	stream environmentv1.EnvironmentService_ReadWorkspaceFileServer
}

func (d *downloadWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), workspace.ChunkSize)
		if err := d.stream.Send(&environmentv1.ReadWorkspaceFileResponse{Data: p[:k]}); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}
