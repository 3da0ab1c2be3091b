package environment_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// inWorkflow runs command through the bash tool as a step of workflow
// wf, in a workspace of scope.
func (e *env) inWorkflow(t *testing.T, wf string, scope environmentv1.WorkspaceScope, command string) (string, error) {
	t.Helper()
	args, _ := json.Marshal(map[string]any{"command": command, "timeout_seconds": 30})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := e.client.Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{Message: content.Text("/tool bash " + string(args)), Dispatch: &operatorv1.DispatchContext{WorkflowId: wf, AgentId: "a"}},
		Spec:  &environmentv1.EnvironmentSpec{Workspace: &environmentv1.WorkspaceSpec{Scope: scope}},
	})
	return text(resp), err
}

func workflowRef(wf string) *environmentv1.WorkspaceRef {
	return &environmentv1.WorkspaceRef{Kind: &environmentv1.WorkspaceRef_WorkflowId{WorkflowId: wf}}
}

// readFile reads a workspace file through ReadWorkspaceFile.
func (e *env) readFile(t *testing.T, ref *environmentv1.WorkspaceRef, p string) (string, error) {
	t.Helper()
	st, err := e.client.ReadWorkspaceFile(context.Background(), &environmentv1.ReadWorkspaceFileRequest{Workspace: ref, Path: p})
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return b.String(), nil
		}
		if err != nil {
			return b.String(), err
		}
		b.Write(m.GetData())
	}
}

// TestWorkspaceLastsAcrossSteps: with spec.workspace WORKFLOW, a file
// one step of a workflow writes in the sandbox is there for the next
// step and for the file API; another workflow and a workspace per
// invocation do not see it; an upload is seen by the next step.
func TestWorkspaceLastsAcrossSteps(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	wf := environmentv1.WorkspaceScope_WORKSPACE_SCOPE_WORKFLOW
	if out, err := e.inWorkflow(t, "wf-1", wf, "mkdir -p sub && echo step-one > sub/notes.md && ln -s /etc/shadow leak"); err != nil {
		t.Fatalf("step 1: %v (%s)", err, out)
	}
	if out, err := e.inWorkflow(t, "wf-1", wf, "cat sub/notes.md"); err != nil || !strings.Contains(out, "step-one") {
		t.Fatalf("step 2 did not find step 1's file: %q, %v", out, err)
	}
	if out, _ := e.inWorkflow(t, "wf-2", wf, "cat sub/notes.md"); strings.Contains(out, "step-one") {
		t.Errorf("another workflow saw the file: %q", out)
	}
	if out, _ := e.inWorkflow(t, "wf-1", environmentv1.WorkspaceScope_WORKSPACE_SCOPE_INVOCATION, "cat sub/notes.md"); strings.Contains(out, "step-one") {
		t.Errorf("a workspace per invocation saw the file: %q", out)
	}
	ref := workflowRef("wf-1")
	if got, err := e.readFile(t, ref, "sub/notes.md"); err != nil || got != "step-one\n" {
		t.Errorf("ReadWorkspaceFile: %q, %v", got, err)
	}
	ls, err := e.client.ListWorkspaceFiles(context.Background(), &environmentv1.ListWorkspaceFilesRequest{Workspace: ref})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range ls.GetFiles() {
		paths = append(paths, f.GetPath())
	}
	if got := strings.Join(paths, ","); !strings.Contains(got, "sub/notes.md") || !strings.Contains(got, "leak") {
		t.Errorf("listed %s", got)
	}
	// The link the sandbox left to /etc/shadow is not followed.
	_, err = e.readFile(t, ref, "leak")
	wantCode(t, err, codes.InvalidArgument, "leaves the workspace")
	_, err = e.readFile(t, ref, "../../etc/passwd")
	wantCode(t, err, codes.InvalidArgument)

	// An upload is there for the next step.
	up, err := e.client.WriteWorkspaceFile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = up.Send(&environmentv1.WriteWorkspaceFileRequest{Kind: &environmentv1.WriteWorkspaceFileRequest_Header{Header: &environmentv1.WorkspaceFileHeader{Workspace: ref, Path: "in/data.txt"}}})
	_ = up.Send(&environmentv1.WriteWorkspaceFileRequest{Kind: &environmentv1.WriteWorkspaceFileRequest_Data{Data: []byte("uploaded")}})
	if r, err := up.CloseAndRecv(); err != nil || r.GetSize() != 8 {
		t.Fatalf("WriteWorkspaceFile: %v, %v", r, err)
	}
	if out, err := e.inWorkflow(t, "wf-1", wf, "cat in/data.txt"); err != nil || !strings.Contains(out, "uploaded") {
		t.Errorf("the step did not see the upload: %q, %v", out, err)
	}
	if r, err := e.client.DeleteWorkspace(context.Background(), &environmentv1.DeleteWorkspaceRequest{Workspace: ref}); err != nil || !r.GetExisted() {
		t.Fatalf("DeleteWorkspace: %v, %v", r, err)
	}
	_, err = e.readFile(t, ref, "sub/notes.md")
	wantCode(t, err, codes.NotFound)
}

// TestWorkspaceRefusals: a workflow workspace without a workflow id is
// INVALID_ARGUMENT; a run leaving more than the workspace cap is
// RESOURCE_EXHAUSTED and the stored workspace stays as it was.
func TestWorkspaceRefusals(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{workspaceMax: 64 << 10})
	wf := environmentv1.WorkspaceScope_WORKSPACE_SCOPE_WORKFLOW
	_, err := e.inWorkflow(t, "", wf, "true")
	wantCode(t, err, codes.InvalidArgument, "workflow_id")
	_, err = e.run(t, "hi", &environmentv1.EnvironmentSpec{Workspace: &environmentv1.WorkspaceSpec{Scope: environmentv1.WorkspaceScope_WORKSPACE_SCOPE_SESSION}})
	wantCode(t, err, codes.InvalidArgument, "session_id")
	if _, err := e.inWorkflow(t, "wf-cap", wf, "echo small > keep.txt"); err != nil {
		t.Fatal(err)
	}
	_, err = e.inWorkflow(t, "wf-cap", wf, "head -c 200000 /dev/zero > big && rm keep.txt")
	wantCode(t, err, codes.ResourceExhausted, "size cap")
	if got, err := e.readFile(t, workflowRef("wf-cap"), "keep.txt"); err != nil || got != "small\n" {
		t.Errorf("the workspace changed after a refused run: %q, %v", got, err)
	}
}
