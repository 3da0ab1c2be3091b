package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

// mcpTool is one tool of an MCP server, as a tool.Tool.
type mcpTool struct {
	client  *Client
	mcpName string // the name the server knows it by
	spec    tool.Spec
}

var _ tool.Tool = (*mcpTool)(nil)

func (t *mcpTool) Spec() tool.Spec {
	s := t.spec
	s.Schema = append(json.RawMessage(nil), s.Schema...)
	return s
}

// Call calls the tool on the server with input (already validated by the
// registry) and renders the result as text (see FormatResult). A result
// flagged isError is returned as an error (wrapping errs.FailedPrecondition)
// whose text is the rendered result, so the model sees the server's
// message. A protocol error (unknown tool, invalid parameters) wraps
// errs.InvalidArgument; a broken connection errs.Unavailable; a result
// asking for more input (which the operator cannot give) errs.Unimplemented.
// When ctx ends, the error wraps ctx's cause.
func (t *mcpTool) Call(ctx context.Context, input json.RawMessage) (string, error) {
	if len(input) == 0 {
		input = json.RawMessage("{}")
	}
	c := t.client
	res, err := c.session.CallTool(ctx, &sdk.CallToolParams{Name: t.mcpName, Arguments: input})
	if err != nil {
		return "", c.callError(ctx, t.mcpName, err)
	}
	if res.NeedsInput() {
		return "", tool.Errorf(errs.Unimplemented,
			"MCP tool %q of server %q asked for further input from the user, which this operator cannot provide", t.mcpName, c.server.Name)
	}
	out := FormatResult(res)
	if res.IsError {
		if out == "" {
			out = fmt.Sprintf("MCP tool %q of server %q reported an error without a message", t.mcpName, c.server.Name)
		}
		return "", tool.Errorf(errs.FailedPrecondition, "%s", out)
	}
	return out, nil
}

func (c *Client) callError(ctx context.Context, name string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("MCP tool %q of server %q was interrupted: %w", name, c.server.Name, context.Cause(ctx))
	}
	var werr *jsonrpc.Error
	if errors.As(err, &werr) {
		return tool.Errorf(errs.InvalidArgument, "MCP server %q refused the call of tool %q: %s", c.server.Name, name, c.scrub(werr.Message))
	}
	if errors.Is(err, sdk.ErrConnectionClosed) {
		c.broken.Store(true)
		return tool.Errorf(errs.Unavailable, "MCP server %q is no longer connected, so tool %q cannot run", c.server.Name, name)
	}
	// A transport failure (broken pipe, reset, a failed HTTP request):
	// a pool starts the server again rather than reuse this connection.
	c.broken.Store(true)
	return tool.Errorf(errs.Unavailable, "calling tool %q of MCP server %q failed: %s", name, c.server.Name, c.scrub(err.Error()))
}

// FormatResult renders a tool result as the text the model sees. Content
// items are joined with newlines: text as is; an image as
// "[image: <mime>, <N> bytes]" and audio as "[audio: <mime>, <N> bytes]"
// (N the decoded size; the data is not passed on); a resource link as
// "[resource link: <uri> (<name>, <mime>)]"; an embedded resource as
// "[resource: <uri>, <mime>]" followed on the next line by its text, or
// "[resource: <uri>, <mime>, <N> bytes]" for a binary one; anything else
// as "[unsupported content]". When no item is text, the structured content
// (if any) is appended as compact JSON. A missing MIME type reads
// "unknown type".
func FormatResult(res *sdk.CallToolResult) string {
	if res == nil {
		return ""
	}
	var parts []string
	hasText := false
	for _, item := range res.Content {
		switch c := item.(type) {
		case *sdk.TextContent:
			hasText = true
			parts = append(parts, c.Text)
		case *sdk.ImageContent:
			parts = append(parts, fmt.Sprintf("[image: %s, %d bytes]", mime(c.MIMEType), len(c.Data)))
		case *sdk.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio: %s, %d bytes]", mime(c.MIMEType), len(c.Data)))
		case *sdk.ResourceLink:
			var meta []string
			if c.Name != "" {
				meta = append(meta, c.Name)
			}
			if c.MIMEType != "" {
				meta = append(meta, c.MIMEType)
			}
			s := "[resource link: " + c.URI
			if len(meta) > 0 {
				s += " (" + strings.Join(meta, ", ") + ")"
			}
			parts = append(parts, s+"]")
		case *sdk.EmbeddedResource:
			r := c.Resource
			switch {
			case r == nil:
				parts = append(parts, "[resource]")
			case len(r.Blob) > 0:
				parts = append(parts, fmt.Sprintf("[resource: %s, %s, %d bytes]", r.URI, mime(r.MIMEType), len(r.Blob)))
			default:
				parts = append(parts, fmt.Sprintf("[resource: %s, %s]\n%s", r.URI, mime(r.MIMEType), r.Text))
			}
		default:
			parts = append(parts, "[unsupported content]")
		}
	}
	if !hasText && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			parts = append(parts, string(b))
		} else {
			parts = append(parts, "[structured content that cannot be encoded]")
		}
	}
	return strings.Join(parts, "\n")
}

func mime(m string) string {
	if m == "" {
		return "unknown type"
	}
	return m
}
