package mcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/secbear/neuron/pkg/errs"
)

// MaxServerNameLen is the longest server name, in bytes. It leaves room in
// the 64-byte tool name for the "__" separator and the MCP tool's name.
const MaxServerNameLen = 32

// Server describes one MCP server: either a subprocess speaking MCP on its
// stdin/stdout (Command) or a streamable HTTP endpoint (URL), never both.
type Server struct {
	// Name identifies the server. It prefixes its tools' names
	// ("<Name>__<tool>"), so it follows the tool name rule and more:
	// letters, digits, '_' and '-', at most MaxServerNameLen bytes,
	// without "__" and not ending in '_' (so the first "__" of a tool name
	// always ends the server name).
	Name string

	// Command is the program and its arguments, for a stdio server. A
	// program without a '/' is looked up in the operator's PATH.
	Command []string
	// Env is the whole environment of the stdio server, as "KEY=VALUE"
	// entries. The subprocess does NOT inherit the operator's environment
	// (which holds provider keys and other secrets): it sees only Env, plus
	// the operator's PATH when Env sets no PATH. Pass what the server
	// needs (HOME, tokens) here explicitly.
	Env []string

	// URL is the endpoint of a streamable HTTP server (http or https).
	URL string
	// Headers are sent with every HTTP request to URL, e.g.
	// "Authorization". Values are literal: nothing like "${TOKEN}" is
	// expanded. They are never logged. Headers the transport owns
	// (Accept, Content-Type, Content-Length, Host, Mcp-Session-Id,
	// Mcp-Protocol-Version, Last-Event-ID) cannot be set.
	Headers map[string]string
	// HTTPClient carries the HTTP requests (e.g. through an egress proxy);
	// nil means a client of the operator's own with no timeout (the
	// per-call timeout and ctx bound each request). Not read from the
	// config file.
	HTTPClient *http.Client

	// Timeout bounds one call of each of the server's tools (it becomes
	// the tools' Spec.Timeout); zero means the registry's default. It does
	// not bound Connect or Tools: give their ctx a deadline.
	Timeout time.Duration
	// ReadOnly lists MCP tool names (as the server names them, without
	// the prefix) to mark tool.ReadOnly even when the server does not set
	// the readOnlyHint annotation. A tool is ReadOnly when it is listed
	// here or its annotations say readOnlyHint: true; otherwise it is
	// SideEffecting. A listed name the server does not offer is logged.
	ReadOnly []string
}

// stdio reports whether s is a subprocess server.
func (s *Server) stdio() bool { return len(s.Command) > 0 }

// Validate checks s. Errors wrap errs.InvalidArgument and name the server.
func (s *Server) Validate() error {
	if err := checkServerName(s.Name); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("MCP server %q: %s: %w", s.Name, fmt.Sprintf(format, args...), errs.InvalidArgument)
	}
	switch {
	case len(s.Command) > 0 && s.URL != "":
		return bad("set either command or url, not both")
	case len(s.Command) == 0 && s.URL == "":
		return bad("set command (stdio server) or url (streamable HTTP server)")
	}
	if s.Timeout < 0 {
		return bad("negative timeout %v", s.Timeout)
	}
	for _, n := range s.ReadOnly {
		if n == "" {
			return bad("read_only has an empty tool name")
		}
	}
	if s.stdio() {
		if s.Command[0] == "" {
			return bad("command has an empty program")
		}
		if len(s.Headers) > 0 || s.HTTPClient != nil {
			return bad("headers and an HTTP client apply only to a url server")
		}
		for i, kv := range s.Env {
			k, _, ok := strings.Cut(kv, "=")
			if !ok || k == "" || strings.ContainsRune(kv, 0) {
				return bad("env[%d] is not KEY=VALUE", i)
			}
		}
		return nil
	}
	if len(s.Env) > 0 {
		return bad("env applies only to a command server")
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return bad("url must be an absolute http or https URL")
	}
	canonical := map[string]string{}
	for k, v := range s.Headers {
		if prev, ok := canonical[http.CanonicalHeaderKey(k)]; ok {
			a, b := min(prev, k), max(prev, k)
			return bad("headers %q and %q are the same header", a, b)
		}
		canonical[http.CanonicalHeaderKey(k)] = k
		if !validHeaderName(k) {
			return bad("header name %q is not a valid HTTP header name", k)
		}
		if reservedHeaders[http.CanonicalHeaderKey(k)] {
			return bad("header %q is set by the MCP transport and cannot be configured", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			// The value is not printed: it may be a credential.
			return bad("the value of header %q contains CR, LF or NUL", k)
		}
	}
	return nil
}

var reservedHeaders = map[string]bool{
	"Accept":               true,
	"Content-Type":         true,
	"Content-Length":       true,
	"Host":                 true,
	"Mcp-Session-Id":       true,
	"Mcp-Protocol-Version": true,
	"Last-Event-Id":        true,
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// checkServerName enforces the rule documented on Server.Name.
func checkServerName(name string) error {
	bad := func(why string) error {
		return fmt.Errorf("MCP server name %q %s: %w", name, why, errs.InvalidArgument)
	}
	switch {
	case name == "":
		return fmt.Errorf("MCP server name is empty: %w", errs.InvalidArgument)
	case len(name) > MaxServerNameLen:
		return bad(fmt.Sprintf("is %d bytes; the limit is %d", len(name), MaxServerNameLen))
	case strings.Contains(name, "__"):
		return bad(`contains "__", which separates the server from the tool in tool names`)
	case strings.HasSuffix(name, "_"):
		return bad("ends with '_'")
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return bad(fmt.Sprintf("has %q at byte %d; server names use only letters, digits, '_' and '-'", name[i], i))
		}
	}
	return nil
}

// fileConfig is the JSON form read by ParseConfig.
type fileConfig struct {
	Servers *[]fileServer `json:"servers"`
}

type fileServer struct {
	Name     string            `json:"name"`
	Command  []string          `json:"command"`
	Env      []string          `json:"env"`
	URL      string            `json:"url"`
	Headers  map[string]string `json:"headers"`
	Timeout  string            `json:"timeout"`
	ReadOnly []string          `json:"read_only"`
}

// ParseConfig reads a list of servers from JSON:
//
//	{"servers": [
//	  {"name": "fs", "command": ["/usr/bin/mcp-fs", "--root", "/data"],
//	   "env": ["HOME=/home/op"], "timeout": "30s", "read_only": ["read_file"]},
//	  {"name": "web", "url": "http://127.0.0.1:9000/mcp",
//	   "headers": {"Authorization": "Bearer abc"}}
//	]}
//
// Decoding is strict: unknown fields, trailing data and a missing
// "servers" key are errors. "timeout" is a Go duration string ("30s").
// Header values are literal (no variable expansion), so a config holding
// credentials must be protected like one. Each server must pass
// Server.Validate and names must be unique. Errors wrap
// errs.InvalidArgument and never quote header values.
func ParseConfig(data []byte) ([]Server, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("MCP config: %s: %w", fmt.Sprintf(format, args...), errs.InvalidArgument)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
		return nil, bad("must be a JSON object with a \"servers\" list")
	}
	var cfg fileConfig
	if err := decodeStrict(data, &cfg); err != nil {
		return nil, bad("%v", err)
	}
	if cfg.Servers == nil {
		return nil, bad("missing the \"servers\" list")
	}
	out := make([]Server, 0, len(*cfg.Servers))
	seen := map[string]int{}
	for i, fs := range *cfg.Servers {
		s := Server{
			Name:     fs.Name,
			Command:  fs.Command,
			Env:      fs.Env,
			URL:      fs.URL,
			Headers:  fs.Headers,
			ReadOnly: fs.ReadOnly,
		}
		if fs.Timeout != "" {
			d, err := time.ParseDuration(fs.Timeout)
			if err != nil {
				return nil, bad("servers[%d] (%q): timeout %q is not a duration like \"30s\"", i, fs.Name, fs.Timeout)
			}
			s.Timeout = d
		}
		if err := s.Validate(); err != nil {
			return nil, fmt.Errorf("MCP config: servers[%d]: %w", i, err)
		}
		if j, ok := seen[s.Name]; ok {
			return nil, bad("servers[%d] and servers[%d] are both named %q", j, i, s.Name)
		}
		seen[s.Name] = i
		out = append(out, s)
	}
	return out, nil
}

// decodeStrict decodes one JSON value into v, refusing unknown fields and
// trailing data.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("unexpected data after the top-level object")
	}
	return nil
}
