package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

// Write is the "write" tool: it creates or replaces a file of the
// workspace.
type Write struct{ ws *Workspace }

// NewWrite returns the write tool of ws.
func NewWrite(ws *Workspace) *Write { return &Write{ws: ws} }

// Spec implements tool.Tool.
func (*Write) Spec() tool.Spec {
	return tool.Spec{
		Name: "write",
		Description: "Write a file in the workspace: create it, or replace its whole content if it exists. " +
			"Missing parent directories are created. To change part of an existing file, use edit instead.",
		Schema: json.RawMessage(`{
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to write, relative to the workspace root (an absolute path inside the workspace also works)."},
    "content": {"type": "string", "description": "The complete new content of the file."}
  },
  "required": ["path", "content"],
  "additionalProperties": false
}`),
		Tier: tool.SideEffecting,
	}
}

// Call implements tool.Tool.
func (t *Write) Call(ctx context.Context, in json.RawMessage) (string, error) {
	var args struct {
		Path    string  `json:"path"`
		Content *string `json:"content"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return "", err
	}
	if args.Content == nil {
		return "", missing("content")
	}
	rel, err := t.ws.rel(args.Path)
	if err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if dir := filepath.Dir(rel); dir != "." {
		if err := t.ws.root.MkdirAll(dir, 0o755); err != nil {
			if errors.Is(err, fs.ErrExist) {
				// MkdirAll met a file where a directory should be.
				return "", tool.Errorf(errs.InvalidArgument, "%q: a parent of it is a file, not a directory", args.Path)
			}
			return "", t.ws.pathError(args.Path, err)
		}
	}
	existed, err := t.ws.writeFile(args.Path, rel, *args.Content, true)
	if err != nil {
		return "", err
	}
	verb := "Created"
	if existed {
		verb = "Replaced"
	}
	return fmt.Sprintf("%s %q (%d bytes).", verb, args.Path, len(*args.Content)), nil
}
