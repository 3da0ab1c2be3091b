package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

// clientInfo is how the operator introduces itself to MCP servers.
var clientInfo = sdk.Implementation{Name: "neuron-operator", Version: "v1"}

// maxListPages bounds the pages Tools reads, against a server that never
// stops paginating.
const maxListPages = 1000

// waitDelay bounds how long closing a stdio server waits for its stderr
// to be drained once it has exited (a grandchild may hold it open).
const waitDelay = 2 * time.Second

// Client is a connection to one MCP server. It is safe for concurrent use.
// When the connection breaks (the subprocess exits, the HTTP session
// ends), calls of its tools fail with an error saying so; it does not
// reconnect.
type Client struct {
	server   Server
	log      *slog.Logger
	session  *sdk.ClientSession
	stderr   *stderrLog   // stdio only
	ownHTTP  *http.Client // an HTTP client this Client created, to release
	closeErr error
	once     sync.Once
	// done is closed when the session ends (the subprocess exited, the
	// connection closed); broken is set when a call found the
	// connection gone. Either makes Alive false.
	done   chan struct{}
	broken atomic.Bool
}

// Connect starts (Command) or reaches (URL) the server s and performs the
// MCP handshake. ctx bounds the start and handshake only: the connection
// lives until Close. A server that cannot be started or reached gives an
// error wrapping errs.Unavailable that names it (and, for a subprocess,
// quotes the end of its stderr); an invalid s gives errs.InvalidArgument.
// A nil log discards logs. The subprocess's stderr is logged line by line
// at Info level; header values are never logged.
func Connect(ctx context.Context, s Server, log *slog.Logger) (*Client, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("mcp_server", s.Name)
	// Copy what the caller may mutate later.
	s.Command = append([]string(nil), s.Command...)
	s.Env = append([]string(nil), s.Env...)
	s.ReadOnly = append([]string(nil), s.ReadOnly...)
	if s.Headers != nil {
		h := make(map[string]string, len(s.Headers))
		for k, v := range s.Headers {
			h[k] = v
		}
		s.Headers = h
	}

	c := &Client{server: s, log: log}
	var transport sdk.Transport
	var where string
	if s.stdio() {
		c.stderr = newStderrLog(log)
		cmd := exec.Command(s.Command[0], s.Command[1:]...)
		cmd.Env = childEnv(s.Env)
		cmd.Stderr = c.stderr
		cmd.WaitDelay = waitDelay
		transport = &sdk.CommandTransport{Command: cmd}
		where = fmt.Sprintf("command %q", s.Command[0])
	} else {
		hc := s.HTTPClient
		if hc == nil {
			hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
			c.ownHTTP = hc
		}
		if len(s.Headers) > 0 {
			base := hc.Transport
			if base == nil {
				base = http.DefaultTransport
			}
			withHeaders := *hc
			withHeaders.Transport = &headerTransport{base: base, headers: s.Headers}
			hc = &withHeaders
		}
		transport = &sdk.StreamableClientTransport{
			Endpoint:   s.URL,
			HTTPClient: hc,
			// The operator reads the tool list once; it needs no
			// server-initiated messages, so no standing GET stream.
			DisableStandaloneSSE: true,
		}
		where = "url " + redactURL(s.URL)
	}

	client := sdk.NewClient(&clientInfo, &sdk.ClientOptions{
		Logger: log,
		// Advertise nothing: the operator serves no roots, sampling or
		// elicitation.
		Capabilities: &sdk.ClientCapabilities{},
	})
	session, err := client.Connect(ctx, transport, nil)
	if err != nil {
		c.releaseHTTP()
		if c.stderr != nil {
			c.stderr.flush()
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("MCP server %q (%s): connecting was interrupted: %w", s.Name, where, context.Cause(ctx))
		}
		msg := fmt.Sprintf("MCP server %q (%s) could not be started or reached: %s", s.Name, where, c.scrub(err.Error()))
		if c.stderr != nil {
			if tail := c.stderr.tail(); tail != "" {
				msg += fmt.Sprintf("; its stderr ended with: %q", tail)
			}
		}
		return nil, fmt.Errorf("%s: %w", msg, errs.Unavailable)
	}
	c.session = session
	c.done = make(chan struct{})
	go func() {
		_ = session.Wait()
		close(c.done)
	}()
	attrs := []any{"transport", transportName(s)}
	if ir := session.InitializeResult(); ir != nil {
		attrs = append(attrs, "protocol_version", ir.ProtocolVersion)
		if ir.ServerInfo != nil {
			attrs = append(attrs, "server_name", ir.ServerInfo.Name, "server_version", ir.ServerInfo.Version)
		}
	}
	log.Info("MCP server connected", attrs...)
	return c, nil
}

func transportName(s Server) string {
	if s.stdio() {
		return "stdio"
	}
	return "streamable-http"
}

// childEnv is the whole environment of a stdio server: env, plus the
// operator's PATH unless env sets one. It is never nil (a nil Env would
// make exec inherit the operator's environment).
func childEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	hasPath := false
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			hasPath = true
		}
		out = append(out, kv)
	}
	if p, ok := os.LookupEnv("PATH"); ok && !hasPath {
		out = append(out, "PATH="+p)
	}
	return out
}

// redactURL drops the userinfo, query and fragment of raw, which may hold
// credentials.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// scrub removes from msg (an error text that may quote the request URL)
// the parts of the server's URL that may hold credentials: its query and
// userinfo.
func (c *Client) scrub(msg string) string {
	if c.server.URL == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, c.server.URL, redactURL(c.server.URL))
	u, err := url.Parse(c.server.URL)
	if err != nil {
		return msg
	}
	if u.RawQuery != "" {
		msg = strings.ReplaceAll(msg, u.RawQuery, "[redacted]")
	}
	if u.User != nil {
		msg = strings.ReplaceAll(msg, u.User.String(), "[redacted]")
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "[redacted]")
		}
	}
	return msg
}

// headerTransport adds configured headers to every request.
type headerTransport struct {
	base    http.RoundTripper
	headers map[string]string
}

func (t *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range t.headers {
		req.Header.Set(k, v)
	}
	return t.base.RoundTrip(req)
}

// Alive reports whether the connection still works as far as the client
// knows: the session has not ended and no call found it gone. A server
// that died is noticed when its session ends or a call fails; a pool
// replaces a client that is not alive.
func (c *Client) Alive() bool {
	if c.broken.Load() {
		return false
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// Name returns the server's name.
func (c *Client) Name() string { return c.server.Name }

// Tools lists the server's tools (every page) as tool.Tools to register
// beside the native ones. Each is named ToolName(server, name); its
// description is the MCP description (else its title); its Spec.Schema is
// the MCP inputSchema as JSON ({"type":"object"} when the server gives
// none), which the registry compiles and validates input against on
// Register, exactly as for a native tool, so a schema the registry
// refuses fails Register; its Tier is ReadOnly when annotated
// readOnlyHint or listed in Server.ReadOnly, else SideEffecting; its
// Spec.Timeout is Server.Timeout.
//
// A tool with an empty name, a schema that cannot be encoded, or a name
// mapping to one already taken by an earlier tool in the list is skipped
// and logged. A failed list request gives an error naming the server.
func (c *Client) Tools(ctx context.Context) ([]tool.Tool, error) {
	readOnly := map[string]bool{}
	for _, n := range c.server.ReadOnly {
		readOnly[n] = true
	}
	var out []tool.Tool
	seen := map[string]string{} // registry name -> MCP name
	offered := map[string]bool{}
	params := &sdk.ListToolsParams{}
	cursors := map[string]bool{}
	for page := 0; ; page++ {
		if page == maxListPages {
			return nil, fmt.Errorf("MCP server %q: listing tools: more than %d pages: %w", c.server.Name, maxListPages, errs.Unavailable)
		}
		res, err := c.session.ListTools(ctx, params)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("MCP server %q: listing tools was interrupted: %w", c.server.Name, context.Cause(ctx))
			}
			return nil, fmt.Errorf("MCP server %q: listing tools: %s: %w", c.server.Name, c.scrub(err.Error()), errs.Unavailable)
		}
		for _, t := range res.Tools {
			if t == nil {
				continue
			}
			offered[t.Name] = true
			mt, err := c.newTool(t, readOnly[t.Name])
			if err != nil {
				c.log.Warn("skipping MCP tool", "tool", t.Name, "reason", err.Error())
				continue
			}
			if prev, ok := seen[mt.spec.Name]; ok {
				c.log.Warn("skipping MCP tool", "tool", t.Name, "reason",
					fmt.Sprintf("its name %q is taken by tool %q", mt.spec.Name, prev))
				continue
			}
			seen[mt.spec.Name] = t.Name
			out = append(out, mt)
		}
		if res.NextCursor == "" {
			break
		}
		if cursors[res.NextCursor] {
			return nil, fmt.Errorf("MCP server %q: listing tools: the server repeated a page cursor: %w", c.server.Name, errs.Unavailable)
		}
		cursors[res.NextCursor] = true
		params = &sdk.ListToolsParams{Cursor: res.NextCursor}
	}
	for _, n := range c.server.ReadOnly {
		if !offered[n] {
			c.log.Warn("read_only names a tool the MCP server does not offer", "tool", n)
		}
	}
	return out, nil
}

func (c *Client) newTool(t *sdk.Tool, listedReadOnly bool) (*mcpTool, error) {
	if t.Name == "" {
		return nil, errors.New("the tool has no name")
	}
	schema := json.RawMessage(`{"type":"object"}`)
	if t.InputSchema != nil {
		b, err := json.Marshal(t.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("its input schema cannot be encoded: %v", err)
		}
		schema = b
	}
	desc := t.Description
	if desc == "" {
		desc = t.Title
	}
	if desc == "" && t.Annotations != nil {
		desc = t.Annotations.Title
	}
	tier := tool.SideEffecting
	if listedReadOnly || (t.Annotations != nil && t.Annotations.ReadOnlyHint) {
		tier = tool.ReadOnly
	}
	return &mcpTool{
		client:  c,
		mcpName: t.Name,
		spec: tool.Spec{
			Name:        ToolName(c.server.Name, t.Name),
			Description: desc,
			Schema:      schema,
			Tier:        tier,
			Timeout:     c.server.Timeout,
		},
	}, nil
}

// Close ends the session: for a subprocess, it closes its stdin and waits
// for it to exit (SIGTERM after 5s, then SIGKILL); for HTTP, it ends the
// session with a DELETE. Calls of the client's tools fail afterwards.
// Close is idempotent.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.broken.Store(true)
		err := c.session.Close()
		c.releaseHTTP()
		if c.stderr != nil {
			c.stderr.flush()
		}
		if err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				// A server that exits non-zero (or on SIGTERM) at
				// shutdown is not worth failing Close over.
				c.log.Info("MCP server exited", "status", exit.String())
				err = nil
			} else {
				err = fmt.Errorf("MCP server %q: closing: %s", c.server.Name, c.scrub(err.Error()))
			}
		}
		c.closeErr = err
	})
	return c.closeErr
}

func (c *Client) releaseHTTP() {
	if c.ownHTTP != nil {
		c.ownHTTP.CloseIdleConnections()
	}
}
