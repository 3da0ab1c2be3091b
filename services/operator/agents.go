package operator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strings"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/effect"
	"github.com/secbear/neuron/services/operator/tool/mcp"
)

// One operator deployment serves many agents: each invocation's
// OperatorConfig carries the agent's instructions, tool selection, MCP
// servers and model parameters. What an invocation asks for is checked
// against the deployment's own policy and can only narrow it:
//
//   - tools: allowed_tools intersects the deployment's tools. Naming a
//     built-in or effect tool the deployment disabled (--tools,
//     --effect-tools) is PERMISSION_DENIED naming it (the name is known,
//     the deployment forbids it); naming a tool that does not exist at
//     all is INVALID_ARGUMENT.
//   - MCP servers: a stdio server only when its command is on the stdio
//     allowlist (--mcp-stdio-allow; empty by default, since a stdio
//     server is a process started on the operator host), an HTTP server
//     only when its URL's host is on the host allowlist (--mcp-http-allow),
//     credentials only by reference to those the deployment holds
//     (--mcp-credentials). A forbidden one is PERMISSION_DENIED, a
//     missing credential FAILED_PRECONDITION, a malformed definition
//     INVALID_ARGUMENT; each names the field and fails that invocation
//     only.

// MCPPolicy is what a deployment allows the MCP servers invocations
// bring. The zero value allows none.
type MCPPolicy struct {
	// StdioCommands are the programs a stdio server may run, compared
	// verbatim with McpStdio.command (an absolute path, or a bare name
	// looked up in the operator's PATH). Any arguments are allowed: list
	// MCP server programs, never shells or interpreters.
	StdioCommands []string
	// HTTPHosts are the hosts an HTTP server's URL may name: "host"
	// (any port) or "host:port", compared case-insensitively with the
	// URL's host. Names are compared, not addresses: list names whose
	// DNS the deployment trusts.
	HTTPHosts []string
	// Credentials are the credentials invocations may name by
	// credential_ref; their values never travel in a definition.
	Credentials map[string]Credential
}

// Credential is a secret the deployment holds for MCP servers: headers
// sent to an HTTP server, environment variables given to a stdio one.
type Credential struct {
	Headers map[string]string `json:"headers"`
	Env     map[string]string `json:"env"`
}

// allowsAny reports whether the policy allows any MCP server at all.
func (p MCPPolicy) allowsAny() bool { return len(p.StdioCommands) > 0 || len(p.HTTPHosts) > 0 }

// ParseCredentials reads the --mcp-credentials file:
//
//	{"credentials": {
//	  "github": {"headers": {"Authorization": "Bearer ghp_..."}},
//	  "search": {"env": {"SEARCH_API_KEY": "..."}}
//	}}
//
// Decoding is strict (unknown fields are errors). Errors never quote
// values.
func ParseCredentials(data []byte) (map[string]Credential, error) {
	var f struct {
		Credentials map[string]Credential `json:"credentials"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("must be a JSON object {\"credentials\": {NAME: {\"headers\": {...}, \"env\": {...}}}}: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("unexpected data after the top-level object")
	}
	if f.Credentials == nil {
		return nil, fmt.Errorf("missing the \"credentials\" object")
	}
	for name, c := range f.Credentials {
		if name == "" {
			return nil, fmt.Errorf("a credential has an empty name")
		}
		if len(c.Headers) == 0 && len(c.Env) == 0 {
			return nil, fmt.Errorf("credential %q has neither headers nor env", name)
		}
		for k := range c.Env {
			if !envName(k) {
				return nil, fmt.Errorf("credential %q: env name %q is not a variable name", name, k)
			}
		}
	}
	return f.Credentials, nil
}

// envName reports whether k is a portable environment variable name.
func envName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// loaderEnv are environment variables that make the dynamic loader (or
// the runtime) run code the definition chooses inside an allowed
// program; a definition cannot set them.
func loaderEnv(k string) bool {
	u := strings.ToUpper(k)
	return strings.HasPrefix(u, "LD_") || strings.HasPrefix(u, "DYLD_") || u == "GCONV_PATH" || u == "PATH"
}

// server checks one invocation MCP server against the policy and turns
// it into an mcp.Server. field is its path ("config.mcp_servers[0]").
func (p MCPPolicy) server(field string, def *operatorv1.McpServer) (mcp.Server, error) {
	name := def.GetName()
	bad := func(kind *errs.Kind, sub, format string, args ...any) error {
		return fmt.Errorf("%s%s (MCP server %q): %s: %w", field, sub, name, fmt.Sprintf(format, args...), kind)
	}
	if !p.allowsAny() {
		return mcp.Server{}, bad(errs.PermissionDenied, "", "this operator deployment allows no per-invocation MCP servers; its operator enables them with --mcp-stdio-allow and --mcp-http-allow")
	}
	s := mcp.Server{Name: name, ReadOnly: slices.Clone(def.GetReadOnlyTools())}
	if d := def.GetTimeout(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() <= 0 {
			return mcp.Server{}, bad(errs.InvalidArgument, ".timeout", "must be a positive duration")
		}
		s.Timeout = d.AsDuration()
	}
	ref := ""
	switch t := def.GetTransport().(type) {
	case *operatorv1.McpServer_Stdio:
		st := t.Stdio
		cmd := st.GetCommand()
		if cmd == "" {
			return mcp.Server{}, bad(errs.InvalidArgument, ".stdio.command", "is required")
		}
		if !slices.Contains(p.StdioCommands, cmd) {
			return mcp.Server{}, bad(errs.PermissionDenied, ".stdio.command", "command %q is not allowed on this operator deployment (allowed: %s); its operator must list it in --mcp-stdio-allow",
				cmd, listOrNone(p.StdioCommands))
		}
		s.Command = append([]string{cmd}, st.GetArgs()...)
		for _, k := range slices.Sorted(maps.Keys(st.GetEnv())) {
			if !envName(k) {
				return mcp.Server{}, bad(errs.InvalidArgument, ".stdio.env", "%q is not a variable name", k)
			}
			if loaderEnv(k) {
				return mcp.Server{}, bad(errs.PermissionDenied, ".stdio.env", "%s cannot be set by a definition: it changes which code the allowed command runs", k)
			}
			s.Env = append(s.Env, k+"="+st.GetEnv()[k])
		}
		ref = st.GetCredentialRef()
		if ref != "" {
			c, ok := p.Credentials[ref]
			if !ok {
				return mcp.Server{}, bad(errs.FailedPrecondition, ".stdio.credential_ref", "names credential %q, which this operator deployment does not hold (--mcp-credentials)", ref)
			}
			if len(c.Env) == 0 {
				return mcp.Server{}, bad(errs.FailedPrecondition, ".stdio.credential_ref", "credential %q has no env variables for a stdio server", ref)
			}
			for _, k := range slices.Sorted(maps.Keys(c.Env)) {
				s.Env = append(s.Env, k+"="+c.Env[k])
			}
		}
	case *operatorv1.McpServer_Http:
		h := t.Http
		u, err := url.Parse(h.GetUrl())
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return mcp.Server{}, bad(errs.InvalidArgument, ".http.url", "must be an absolute http or https URL")
		}
		if u.User != nil {
			return mcp.Server{}, bad(errs.InvalidArgument, ".http.url", "must not carry credentials; name a credential the operator holds in credential_ref")
		}
		if !hostAllowed(p.HTTPHosts, u) {
			return mcp.Server{}, bad(errs.PermissionDenied, ".http.url", "host %q is not allowed on this operator deployment (allowed: %s); its operator must list it in --mcp-http-allow",
				u.Host, listOrNone(p.HTTPHosts))
		}
		s.URL = h.GetUrl()
		ref = h.GetCredentialRef()
		if ref != "" {
			c, ok := p.Credentials[ref]
			if !ok {
				return mcp.Server{}, bad(errs.FailedPrecondition, ".http.credential_ref", "names credential %q, which this operator deployment does not hold (--mcp-credentials)", ref)
			}
			if len(c.Headers) == 0 {
				return mcp.Server{}, bad(errs.FailedPrecondition, ".http.credential_ref", "credential %q has no headers for an HTTP server", ref)
			}
			s.Headers = maps.Clone(c.Headers)
		}
	default:
		return mcp.Server{}, bad(errs.InvalidArgument, "", "set stdio (a command) or http (a URL)")
	}
	if err := s.Validate(); err != nil {
		return mcp.Server{}, fmt.Errorf("%s: %w", field, err)
	}
	return s, nil
}

func hostAllowed(allowed []string, u *url.URL) bool {
	for _, a := range allowed {
		if strings.EqualFold(a, u.Host) || strings.EqualFold(a, u.Hostname()) {
			return true
		}
	}
	return false
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

// knownTools are the names of the built-in and effect tools, for telling
// a tool the deployment disabled from one that does not exist.
var knownTools = func() map[string]string {
	m := map[string]string{"read": "--tools", "write": "--tools", "edit": "--tools", "bash": "--tools"}
	for _, t := range effect.All() {
		m[t.Spec().Name] = "--effect-tools"
	}
	return m
}()

// toolset is the tools of one invocation: the deployment's registry and
// the registries of the invocation's own MCP servers (pooled), whose
// tools are named "<server>__<tool>".
type toolset struct {
	base  *tool.Registry
	extra map[string]*tool.Registry // by server name
}

// reg is the registry that holds name.
func (ts *toolset) reg(name string) *tool.Registry {
	if len(ts.extra) > 0 {
		if srv, _, ok := strings.Cut(name, "__"); ok {
			if r := ts.extra[srv]; r != nil {
				return r
			}
		}
	}
	return ts.base
}

// specs returns the tools to offer: all of them, or (restrict) the
// intersection with allowed. A disabled built-in or effect tool is
// PERMISSION_DENIED, an unknown name INVALID_ARGUMENT.
func (ts *toolset) specs(allowed []string, restrict bool) ([]provider.ToolSpec, error) {
	var out []provider.ToolSpec
	if !restrict {
		s, err := ts.base.Specs(nil, false)
		if err != nil {
			return nil, err
		}
		out = s
		for _, r := range ts.extra {
			s, err := r.Specs(nil, false)
			if err != nil {
				return nil, err
			}
			out = append(out, s...)
		}
	} else {
		byReg := map[*tool.Registry][]string{}
		var disabled []string
		for _, n := range allowed {
			r := ts.reg(n)
			if r == ts.base {
				if _, ok := r.Lookup(n); !ok {
					if flag, known := knownTools[n]; known {
						disabled = append(disabled, fmt.Sprintf("%q (%s)", n, flag))
						continue
					}
				}
			}
			byReg[r] = append(byReg[r], n)
		}
		if len(disabled) > 0 {
			slices.Sort(disabled)
			return nil, fmt.Errorf("tool %s is disabled on this operator deployment; an invocation can only narrow the deployment's tools, never enable one: %w",
				strings.Join(slices.Compact(disabled), ", "), errs.PermissionDenied)
		}
		regs := append([]*tool.Registry{ts.base}, slices.Collect(maps.Values(ts.extra))...)
		for _, r := range regs {
			s, err := r.Specs(byReg[r], true)
			if err != nil {
				return nil, err
			}
			out = append(out, s...)
		}
	}
	slices.SortFunc(out, func(a, b provider.ToolSpec) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
