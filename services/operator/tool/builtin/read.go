package builtin

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

// Limits of read's output.
const (
	// DefaultReadLimit is how many lines read returns without a limit.
	DefaultReadLimit = 2000
	// MaxLineBytes is the longest line read shows whole; longer lines
	// are cut with a marker.
	MaxLineBytes = 2000
	// maxReadOutput bounds read's output, in bytes, below the registry's
	// default limit so that the continuation notice is never cut off.
	maxReadOutput = 50_000
)

// Read is the "read" tool: it reads a text file of the workspace.
type Read struct{ ws *Workspace }

// NewRead returns the read tool of ws.
func NewRead(ws *Workspace) *Read { return &Read{ws: ws} }

// Spec implements tool.Tool.
func (*Read) Spec() tool.Spec {
	return tool.Spec{
		Name: "read",
		Description: "Read a text file from the workspace. Returns its lines, each prefixed with its line number " +
			"right-aligned in 6 columns and a tab (the prefix is not part of the file). Returns at most 2000 lines " +
			"per call and says how to continue; use offset and limit to read a part of a long file.",
		Schema: json.RawMessage(`{
  "type": "object",
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file to read, relative to the workspace root (an absolute path inside the workspace also works)."},
    "offset": {"type": "integer", "minimum": 1, "description": "The line number to start at, 1-based (default 1)."},
    "limit": {"type": "integer", "minimum": 1, "description": "The most lines to return (default 2000)."}
  },
  "required": ["path"],
  "additionalProperties": false
}`),
		Tier: tool.ReadOnly,
	}
}

// Call implements tool.Tool.
func (t *Read) Call(ctx context.Context, in json.RawMessage) (string, error) {
	var args struct {
		Path   string      `json:"path"`
		Offset json.Number `json:"offset"`
		Limit  json.Number `json:"limit"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return "", err
	}
	offset, err := positive("offset", args.Offset, 1)
	if err != nil {
		return "", err
	}
	limit, err := positive("limit", args.Limit, DefaultReadLimit)
	if err != nil {
		return "", err
	}
	rel, err := t.ws.rel(args.Path)
	if err != nil {
		return "", err
	}
	text, err := t.ws.readText(args.Path, rel)
	if err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if text == "" {
		return fmt.Sprintf("(%q is empty)", args.Path), nil
	}
	lines := strings.Split(text, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1] // the final newline ends the last line
	}
	total := len(lines)
	if offset > total {
		return "", tool.Errorf(errs.OutOfRange, "offset %d is past the end of %q, which has %d lines", offset, args.Path, total)
	}
	var b strings.Builder
	last := offset - 1 // the last line shown, 1-based
	for i := offset - 1; i < total && i-(offset-1) < limit; i++ {
		line := lines[i]
		if len(line) > MaxLineBytes {
			cut := MaxLineBytes
			for cut > 0 && !isRuneStart(line[cut]) {
				cut--
			}
			line = fmt.Sprintf("%s… [line cut: %d of %d bytes shown]", line[:cut], cut, len(line))
		}
		entry := fmt.Sprintf("%6d\t%s\n", i+1, line)
		if b.Len() > 0 && b.Len()+len(entry) > maxReadOutput {
			break
		}
		b.WriteString(entry)
		last = i + 1
	}
	if last < total {
		fmt.Fprintf(&b, "[showing lines %d-%d of %d; call read with offset=%d to continue]\n", offset, last, total, last+1)
	}
	return b.String(), nil
}

func isRuneStart(c byte) bool { return c&0xC0 != 0x80 }

// positive parses an optional positive integer argument.
func positive(name string, n json.Number, def int) (int, error) {
	if n == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(n.String(), 64)
	if err != nil || f != math.Trunc(f) || f < 1 {
		return 0, tool.Errorf(errs.InvalidArgument, "%s must be a whole number of at least 1, got %s", name, n)
	}
	return int(min(f, math.MaxInt32)), nil
}
