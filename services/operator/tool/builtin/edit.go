package builtin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

// Edit is the "edit" tool: it replaces an exact string in a file of the
// workspace.
type Edit struct{ ws *Workspace }

// NewEdit returns the edit tool of ws.
func NewEdit(ws *Workspace) *Edit { return &Edit{ws: ws} }

// Spec implements tool.Tool.
func (*Edit) Spec() tool.Spec {
	return tool.Spec{
		Name: "edit",
		Description: "Replace an exact string in a text file of the workspace. old_string must match the file exactly, " +
			"including whitespace and indentation (without the line-number prefixes read shows), and must occur " +
			"exactly once unless replace_all is true. Include enough surrounding lines to make it unique.",
		Schema: json.RawMessage(`{
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to edit, relative to the workspace root (an absolute path inside the workspace also works)."},
    "old_string": {"type": "string", "minLength": 1, "description": "The exact text to replace."},
    "new_string": {"type": "string", "description": "The text to put in its place; it must differ from old_string."},
    "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of exactly one (default false)."}
  },
  "required": ["path", "old_string", "new_string"],
  "additionalProperties": false
}`),
		Tier: tool.SideEffecting,
	}
}

// Call implements tool.Tool.
func (t *Edit) Call(ctx context.Context, in json.RawMessage) (string, error) {
	var args struct {
		Path       string  `json:"path"`
		OldString  string  `json:"old_string"`
		NewString  *string `json:"new_string"`
		ReplaceAll bool    `json:"replace_all"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return "", err
	}
	switch {
	case args.OldString == "":
		return "", tool.Errorf(errs.InvalidArgument, "old_string is empty; give the exact text to replace (to create a file, use write)")
	case args.NewString == nil:
		return "", missing("new_string")
	case *args.NewString == args.OldString:
		return "", tool.Errorf(errs.InvalidArgument, "old_string and new_string are the same; there is nothing to change")
	}
	rel, err := t.ws.rel(args.Path)
	if err != nil {
		return "", err
	}
	text, err := t.ws.readText(args.Path, rel)
	if err != nil {
		return "", err
	}
	n := strings.Count(text, args.OldString)
	switch {
	case n == 0:
		return "", tool.Errorf(errs.NotFound, "old_string was not found in %q; it must match the file exactly, including whitespace and indentation, "+
			"and without the line-number prefixes read shows. Read the file again to see its current content", args.Path)
	case n > 1 && !args.ReplaceAll:
		return "", tool.Errorf(errs.InvalidArgument, "old_string occurs %d times in %q; include more surrounding lines to make it unique, "+
			"or set replace_all to true to replace every occurrence", n, args.Path)
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	count := 1
	if args.ReplaceAll {
		count = -1
	}
	replaced := strings.Replace(text, args.OldString, *args.NewString, count)
	if _, err := t.ws.writeFile(args.Path, rel, replaced, false); err != nil {
		return "", err
	}
	if n == 1 {
		return fmt.Sprintf("Replaced 1 occurrence in %q.", args.Path), nil
	}
	return fmt.Sprintf("Replaced %d occurrences in %q.", n, args.Path), nil
}

func missing(name string) error {
	return tool.Errorf(errs.InvalidArgument, "missing required property %q", name)
}
