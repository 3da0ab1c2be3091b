package journal

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/tokentest"
	"github.com/secbear/neuron/pkg/errs"
)

// A journal page token is taken only exactly as issued.
func TestJournalPageTokenCanonical(t *testing.T) {
	j, err := Open(filepath.Join(t.TempDir(), "journal.db"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	status := orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED
	token := j.issueToken([]byte("\x00\x00\x00\x00\x00\x00\x00\x07wf-7"), status)
	if _, err := j.openToken(token, status); err != nil {
		t.Fatalf("the token as issued: %v", err)
	}
	for name, bad := range tokentest.Uncanonical(token) {
		t.Run(name, func(t *testing.T) {
			if _, err := j.openToken(bad, status); errs.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "page_token") {
				t.Errorf("openToken(%q) = %v, want INVALID_ARGUMENT naming page_token", bad, err)
			}
		})
	}
}
