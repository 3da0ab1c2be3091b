package journal

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
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
	for name, bad := range uncanonical(token) {
		t.Run(name, func(t *testing.T) {
			if _, err := j.openToken(bad, status); errs.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "page_token") {
				t.Errorf("openToken(%q) = %v, want INVALID_ARGUMENT naming page_token", bad, err)
			}
		})
	}
}
