package environment

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment/workspace"
)

// hostBackend keeps workspaces on its own "platform": a map of
// workspace name to files.
type hostBackend struct {
	name  string
	files map[string]map[string]string
}

func (h *hostBackend) Name() string                                      { return h.name }
func (h *hostBackend) Check(*environmentv1.EnvironmentSpec) error        { return nil }
func (h *hostBackend) Run(context.Context, *Invocation) (*Result, error) { return nil, errs.Internal }
func (h *hostBackend) PersistentWorkspaces() bool                        { return true }

func (h *hostBackend) HasWorkspace(_ context.Context, n string) (bool, error) {
	_, ok := h.files[n]
	return ok, nil
}

func (h *hostBackend) ListWorkspace(_ context.Context, n, _ string) ([]*environmentv1.WorkspaceFile, bool, uint64, error) {
	var out []*environmentv1.WorkspaceFile
	for p, c := range h.files[n] {
		out = append(out, &environmentv1.WorkspaceFile{Path: p, Size: uint64(len(c))})
	}
	return out, false, 0, nil
}

func (h *hostBackend) ReadWorkspace(_ context.Context, n, p string, w io.Writer) error {
	c, ok := h.files[n][p]
	if !ok {
		return errs.NotFound
	}
	_, err := io.WriteString(w, c)
	return err
}

func (h *hostBackend) WriteWorkspace(_ context.Context, n, p string, _ os.FileMode, r io.Reader, _ int64) (int64, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	if h.files[n] == nil {
		h.files[n] = map[string]string{}
	}
	h.files[n][p] = string(b)
	return int64(len(b)), nil
}

func (h *hostBackend) DeleteWorkspace(_ context.Context, n string) (bool, error) {
	_, ok := h.files[n]
	delete(h.files, n)
	return ok, nil
}

// readStream and writeStream are the server sides of the file streams.
type readStream struct {
	grpc.ServerStream
	got strings.Builder
}

func (s *readStream) Context() context.Context { return context.Background() }
func (s *readStream) Send(m *environmentv1.ReadWorkspaceFileResponse) error {
	s.got.Write(m.GetData())
	return nil
}

type writeStream struct {
	grpc.ServerStream
	msgs []*environmentv1.WriteWorkspaceFileRequest
	resp *environmentv1.WriteWorkspaceFileResponse
}

func (s *writeStream) Context() context.Context { return context.Background() }
func (s *writeStream) Recv() (*environmentv1.WriteWorkspaceFileRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}
func (s *writeStream) SendAndClose(r *environmentv1.WriteWorkspaceFileResponse) error {
	s.resp = r
	return nil
}

// TestWorkspaceHostRouting: the file RPCs reach a workspace a backend
// keeps on its platform through that backend, one in the service's
// store through the store, an upload to a new workspace goes to the
// default backend's platform, and DeleteWorkspace deletes it everywhere.
func TestWorkspaceHostRouting(t *testing.T) {
	store, err := workspace.Open(t.TempDir(), 1<<20, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	host := &hostBackend{name: "docker", files: map[string]map[string]string{
		workspace.WorkflowName("on-host"): {"notes.md": "from the volume"},
	}}
	s, err := NewServer(ServerConfig{Backends: []Backend{host}, Default: "docker", Workspaces: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ref := func(wf string) *environmentv1.WorkspaceRef {
		return &environmentv1.WorkspaceRef{Kind: &environmentv1.WorkspaceRef_WorkflowId{WorkflowId: wf}}
	}
	read := func(wf, p string) (string, error) {
		st := &readStream{}
		err := s.ReadWorkspaceFile(&environmentv1.ReadWorkspaceFileRequest{Workspace: ref(wf), Path: p}, st)
		return st.got.String(), err
	}

	if got, err := read("on-host", "notes.md"); err != nil || got != "from the volume" {
		t.Fatalf("read from the host: %q, %v", got, err)
	}
	ls, err := s.ListWorkspaceFiles(ctx, &environmentv1.ListWorkspaceFilesRequest{Workspace: ref("on-host")})
	if err != nil || len(ls.GetFiles()) != 1 || ls.GetFiles()[0].GetPath() != "notes.md" {
		t.Fatalf("list from the host: %v, %v", ls, err)
	}
	// In the store: the store's.
	if _, err := store.Write(ctx, workspace.WorkflowName("in-store"), "a.txt", 0, strings.NewReader("from the store")); err != nil {
		t.Fatal(err)
	}
	if got, err := read("in-store", "a.txt"); err != nil || got != "from the store" {
		t.Fatalf("read from the store: %q, %v", got, err)
	}
	// Nowhere: NOT_FOUND.
	if _, err := read("nowhere", "a.txt"); errs.Code(err) != codes.NotFound {
		t.Fatalf("read of a workspace nobody has: %v, want NOT_FOUND", err)
	}
	// An upload to a new workspace: the default backend's platform.
	ws := &writeStream{msgs: []*environmentv1.WriteWorkspaceFileRequest{
		{Kind: &environmentv1.WriteWorkspaceFileRequest_Header{Header: &environmentv1.WorkspaceFileHeader{Workspace: ref("new"), Path: "in.csv"}}},
		{Kind: &environmentv1.WriteWorkspaceFileRequest_Data{Data: []byte("1,2")}},
	}}
	if err := s.WriteWorkspaceFile(ws); err != nil || ws.resp.GetSize() != 3 {
		t.Fatalf("upload: %v, %v", ws.resp, err)
	}
	if host.files[workspace.WorkflowName("new")]["in.csv"] != "1,2" || store.Exists(workspace.WorkflowName("new")) {
		t.Fatalf("the upload did not go to the default backend's platform: host %v, in store %v", host.files, store.Exists(workspace.WorkflowName("new")))
	}
	// Delete: everywhere.
	for _, wf := range []string{"on-host", "in-store"} {
		resp, err := s.DeleteWorkspace(ctx, &environmentv1.DeleteWorkspaceRequest{Workspace: ref(wf)})
		if err != nil || !resp.GetExisted() {
			t.Fatalf("delete %s: %v, %v", wf, resp, err)
		}
	}
	if _, ok := host.files[workspace.WorkflowName("on-host")]; ok || store.Exists(workspace.WorkflowName("in-store")) {
		t.Fatal("a deleted workspace is still there")
	}
}
