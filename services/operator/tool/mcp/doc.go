// Package mcp offers the tools of Model Context Protocol servers as
// tool.Tools, registered in the same tool.Registry as the native tools and
// subject to the same policy (schema validation, timeouts, output limits).
// It uses the official SDK, github.com/modelcontextprotocol/go-sdk.
//
// A Server is either a subprocess speaking MCP over stdin/stdout
// (Server.Command) or a streamable HTTP endpoint (Server.URL). Servers are
// usually read from a JSON config with ParseConfig. Connect starts or
// reaches one and performs the handshake; Client.Tools lists its tools;
// Client.Close ends it.
//
//	c, err := mcp.Connect(ctx, server, log)
//	...
//	defer c.Close()
//	tools, err := c.Tools(ctx)
//	...
//	for _, t := range tools {
//		if err := reg.Register(t); err != nil { ... }
//	}
//
// # Names
//
// A tool is registered as "<server>__<tool>" (ToolName). Server names are
// restricted (see Server.Name) so the prefix is unambiguous; an MCP tool
// name that would break the registry's name rule (letters, digits, '_',
// '-', at most 64 bytes; MCP also allows '.', '/' and longer names) is
// rewritten deterministically: invalid bytes become '_', the name is cut,
// and a short hash of the original name is appended. Calls always use the
// server's own name for the tool.
//
// # Schemas and tiers
//
// A tool's Spec.Schema is the server's inputSchema as JSON. Nothing is
// checked here: the registry compiles it on Register (and refuses it
// there like any native tool's) and validates every call's input against
// it before the server is called. A tool is tool.ReadOnly when the
// server annotates it readOnlyHint: true or Server.ReadOnly lists it;
// otherwise it is tool.SideEffecting. The tier only decides whether calls
// may run in parallel; annotations are hints from the server and grant
// nothing else.
//
// # Results
//
// A result's content becomes text (FormatResult): text items as is,
// images, audio and binary resources summarised by type and size (their
// bytes are not passed to the model), the structured content as JSON when
// there is no text. A result flagged isError is returned as an error,
// which the registry turns into an error result with the server's message.
//
// # Security
//
// A stdio server runs with a clean environment: only Server.Env, plus the
// operator's PATH when Env sets none. It never inherits the operator's
// environment, which holds provider keys and other secrets; pass what the
// server needs explicitly. Its stderr is logged, not shown to the model.
// HTTP header values (e.g. Authorization) are sent verbatim, never
// expanded, logged or quoted in errors; URLs in errors omit their
// userinfo and query. The server's own messages (tool descriptions,
// error texts) reach the model: connect only servers you trust.
package mcp
