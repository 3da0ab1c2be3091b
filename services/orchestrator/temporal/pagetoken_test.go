package temporal

import (
	"context"
	"encoding/base64"
	"testing"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc/codes"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/tokentest"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/orchestrator"
)

// listClient answers ListWorkflow with an empty page; every other call
// of the Temporal client is unused here.
type listClient struct {
	client.Client
	calls int
}

func (l *listClient) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	l.calls++
	return &workflowservice.ListWorkflowExecutionsResponse{}, nil
}

// A Temporal ListWorkflows page token is taken only exactly as issued:
// anything else is INVALID_ARGUMENT and never reaches Temporal.
func TestPageTokenCanonical(t *testing.T) {
	c := &listClient{}
	e := New(c, orchestrator.Deps{}, Options{})
	status := orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED
	token := base64.RawURLEncoding.EncodeToString(append([]byte{byte(status)}, "temporal-next-page-token-bytes"...))
	list := func(tok string) error {
		_, _, err := e.List(context.Background(), status, 10, tok)
		return err
	}
	if err := list(token); err != nil || c.calls != 1 {
		t.Fatalf("the token as issued: %v (%d calls)", err, c.calls)
	}
	for name, bad := range tokentest.Uncanonical(token) {
		t.Run(name, func(t *testing.T) {
			c.calls = 0
			if err := list(bad); errs.Code(err) != codes.InvalidArgument || c.calls != 0 {
				t.Errorf("ListWorkflows(%q) = %v after %d Temporal calls, want INVALID_ARGUMENT and none", bad, err, c.calls)
			}
		})
	}
}
