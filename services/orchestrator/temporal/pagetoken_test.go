package temporal

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc/codes"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/orchestrator"
)

// uncanonical returns forms of token that decode to the same bytes with
// a lenient base64 decoder but are not the token as issued.
func uncanonical(token string) map[string]string {
	mid := len(token) / 2
	out := map[string]string{
		"line feed inside":       token[:mid] + "\n" + token[mid:],
		"crlf inside":            token[:mid] + "\r\n" + token[mid:],
		"line feed at the end":   token + "\n",
		"line feed at the start": "\n" + token,
		"padding added":          token + strings.Repeat("=", (4-len(token)%4)%4),
		"too much padding":       token + "====",
	}
	// A last character whose unused low bits are set decodes to the
	// same bytes (when the length leaves unused bits).
	if len(token)%4 != 0 {
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
		last := strings.IndexByte(alphabet, token[len(token)-1])
		unused := map[int]int{2: 4, 3: 2}[len(token)%4]
		out["unused bits set"] = token[:len(token)-1] + string(alphabet[last|(1<<unused-1)])
	}
	return out
}

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
	for name, bad := range uncanonical(token) {
		t.Run(name, func(t *testing.T) {
			c.calls = 0
			if err := list(bad); errs.Code(err) != codes.InvalidArgument || c.calls != 0 {
				t.Errorf("ListWorkflows(%q) = %v after %d Temporal calls, want INVALID_ARGUMENT and none", bad, err, c.calls)
			}
		})
	}
}
