package environment

import (
	"errors"
	"fmt"
	"io"
	"os"

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
		return nil, fmt.Errorf("spec.workspace asks for a workspace that lasts, which the %s backend does not keep (the process backend does): %w", b.Name(), errs.FailedPrecondition)
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
func (s *Server) ListWorkspaceFiles(_ context.Context, req *environmentv1.ListWorkspaceFilesRequest) (*environmentv1.ListWorkspaceFilesResponse, error) {
	st, n, err := s.store(req.GetWorkspace())
	if err != nil {
		return nil, err
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
	size, err := st.Write(stream.Context(), n, h.GetPath(), os.FileMode(h.GetMode()), &uploadReader{stream: stream})
	if err != nil {
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
	return &environmentv1.DeleteWorkspaceResponse{Existed: existed}, nil
}
