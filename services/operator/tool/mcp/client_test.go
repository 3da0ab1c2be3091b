package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/tool"
)

const testToken = "Bearer t0k-s3cret"

// startHTTPServer serves newTestServer over streamable HTTP and counts
// requests that lack the configured Authorization header.
func startHTTPServer(t *testing.T) (url string, addCalls *atomic.Int64, badAuth *atomic.Int64) {
	t.Helper()
	addCalls, badAuth = new(atomic.Int64), new(atomic.Int64)
	srv := newTestServer(addCalls)
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != testToken {
			badAuth.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp", addCalls, badAuth
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// connectAndRegister connects to s, lists its tools and registers them in
// a new registry.
func connectAndRegister(t *testing.T, s Server) (*Client, *tool.Registry, []tool.Tool) {
	t.Helper()
	log, _ := newLogger()
	c, err := Connect(ctxT(t), s, log)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	tools, err := c.Tools(ctxT(t))
	if err != nil {
		t.Fatalf("Tools: %v", err)
	}
	reg := tool.NewRegistry()
	for _, tl := range tools {
		if err := reg.Register(tl); err != nil {
			t.Fatalf("Register(%s): %v", tl.Spec().Name, err)
		}
	}
	return c, reg, tools
}

var wantNames = []string{
	"test__add",
	"test__echo",
	"test__env",
	"test__fail",
	ToolName("test", "files.read"),
	"test__media",
	"test__mute",
	"test__sleep",
	"test__stats",
	ToolName("test", longToolName),
}

func TestHTTPServer(t *testing.T) {
	url, addCalls, badAuth := startHTTPServer(t)
	log, logs := newLogger()
	s := Server{
		Name:     "test",
		URL:      url,
		Headers:  map[string]string{"Authorization": testToken},
		ReadOnly: []string{"stats", "nope"},
		Timeout:  300 * time.Millisecond,
	}
	c, err := Connect(ctxT(t), s, log)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer c.Close()
	if c.Name() != "test" {
		t.Errorf("Name() = %q", c.Name())
	}
	tools, err := c.Tools(ctxT(t))
	if err != nil {
		t.Fatalf("Tools: %v", err)
	}

	// Names (all pages of 2), tiers, descriptions, timeouts, schemas.
	specs := map[string]tool.Spec{}
	var names []string
	for _, tl := range tools {
		sp := tl.Spec()
		specs[sp.Name] = sp
		names = append(names, sp.Name)
	}
	slices.Sort(names)
	want := slices.Clone(wantNames)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("tool names = %q, want %q", names, want)
	}
	for name, sp := range specs {
		wantTier := tool.SideEffecting
		if name == "test__echo" || name == "test__stats" {
			wantTier = tool.ReadOnly
		}
		if sp.Tier != wantTier {
			t.Errorf("%s: tier %v, want %v", name, sp.Tier, wantTier)
		}
		if sp.Timeout != 300*time.Millisecond {
			t.Errorf("%s: timeout %v", name, sp.Timeout)
		}
	}
	if d := specs["test__add"].Description; d != "Add two integers." {
		t.Errorf("add description = %q", d)
	}
	if d := specs["test__env"].Description; d != "Environment probe" {
		t.Errorf("env description (from title) = %q", d)
	}
	var addSchema map[string]any
	if err := json.Unmarshal(specs["test__add"].Schema, &addSchema); err != nil {
		t.Fatal(err)
	}
	wantSchema := map[string]any{
		"type":                 "object",
		"properties":           map[string]any{"a": map[string]any{"type": "integer"}, "b": map[string]any{"type": "integer"}},
		"required":             []any{"a", "b"},
		"additionalProperties": false,
	}
	if got, _ := json.Marshal(addSchema); string(got) != mustJSON(t, wantSchema) {
		t.Errorf("add schema = %s, want %s", got, mustJSON(t, wantSchema))
	}
	if got := string(specs["test__stats"].Schema); got != `{"type":"object"}` {
		t.Errorf("stats schema = %s", got)
	}
	if !strings.Contains(logs.String(), "read_only names a tool the MCP server does not offer") || !strings.Contains(logs.String(), "tool=nope") {
		t.Errorf("no warning about the unknown read_only tool; logs:\n%s", logs)
	}

	reg := tool.NewRegistry()
	for _, tl := range tools {
		if err := reg.Register(tl); err != nil {
			t.Fatalf("Register(%s): %v", tl.Spec().Name, err)
		}
	}
	ctx := ctxT(t)

	// Invalid input is refused by the registry's schema validation; the
	// server never sees it.
	for _, in := range []string{`{"a":"two","b":3}`, `{"a":1}`, `{"a":1,"b":2,"c":3}`, `[1,2]`} {
		if _, err := reg.Validate("test__add", json.RawMessage(in)); err == nil || !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("Validate(%s) = %v, want an InvalidArgument error", in, err)
		}
		o := reg.Call(ctx, "test__add", json.RawMessage(in))
		if !o.IsError {
			t.Errorf("Call(add, %s) = %+v, want an error outcome", in, o)
		}
	}
	if n := addCalls.Load(); n != 0 {
		t.Fatalf("server saw %d add calls for invalid input", n)
	}

	cases := []struct {
		name, input, want string
		isErr             bool
	}{
		{"test__add", `{"a":2,"b":3}`, "5", false},
		{"test__echo", `{"message":"hello"}`, "hello", false},
		{"test__fail", `{}`, "disk is full", true},
		{"test__stats", ``, `{"count":3,"ok":true}`, false},
		{"test__media", `{}`, "here you go\n[image: image/png, 5 bytes]\n[resource: file:///a.txt, text/plain]\nalpha", false},
		{ToolName("test", "files.read"), `{}`, "read ok", false},
		{ToolName("test", longToolName), `{}`, "long ok", false},
		{"test__mute", `{}`, `MCP tool "mute" of server "test" reported an error without a message`, true},
		{"test__sleep", `{}`, `tool "test__sleep" exceeded its timeout of 300ms and was canceled`, true},
	}
	for _, tc := range cases {
		o := reg.Call(ctx, tc.name, json.RawMessage(tc.input))
		if o.Content != tc.want || o.IsError != tc.isErr {
			t.Errorf("Call(%s, %s) = %q (error %v), want %q (error %v)", tc.name, tc.input, o.Content, o.IsError, tc.want, tc.isErr)
		}
	}
	if n := addCalls.Load(); n != 1 {
		t.Errorf("server saw %d add calls, want 1", n)
	}

	// A tool the server does not know (e.g. removed since listed) is a
	// protocol error.
	ghost := &mcpTool{client: c, mcpName: "ghost"}
	if _, err := ghost.Call(ctx, nil); err == nil || !errors.Is(err, errs.InvalidArgument) ||
		!strings.HasPrefix(err.Error(), `MCP server "test" refused the call of tool "ghost": `) {
		t.Errorf("unknown tool: err = %v", err)
	}

	// Concurrent calls share the session.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := reg.Call(ctx, "test__add", json.RawMessage(`{"a":`+strconv.Itoa(i)+`,"b":100}`))
			if o.IsError || o.Content != strconv.Itoa(i+100) {
				t.Errorf("concurrent add %d = %+v", i, o)
			}
		}()
	}
	wg.Wait()

	if n := badAuth.Load(); n != 0 {
		t.Errorf("%d requests arrived without the configured Authorization header", n)
	}
	if strings.Contains(logs.String(), "t0k-s3cret") {
		t.Errorf("the header value was logged:\n%s", logs)
	}

	// After Close, calls fail with a clear error.
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	o := reg.Call(ctx, "test__echo", json.RawMessage(`{"message":"x"}`))
	if !o.IsError || o.Content != `MCP server "test" is no longer connected, so tool "echo" cannot run` {
		t.Errorf("Call after Close = %+v", o)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHTTPServerWithoutHeaderIsRefused(t *testing.T) {
	url, _, badAuth := startHTTPServer(t)
	_, err := Connect(ctxT(t), Server{Name: "web", URL: url + "?key=zzz"}, nil)
	if err == nil {
		t.Fatal("Connect succeeded without the Authorization header")
	}
	if !errors.Is(err, errs.Unavailable) || !strings.Contains(err.Error(), `MCP server "web"`) {
		t.Errorf("err = %v", err)
	}
	if strings.Contains(err.Error(), "zzz") {
		t.Errorf("the URL's query leaked into the error: %v", err)
	}
	if badAuth.Load() == 0 {
		t.Error("the server saw no request")
	}
}

func TestStdioServer(t *testing.T) {
	t.Setenv(secretEnv, "hunter2")
	s := Server{
		Name:    "test",
		Command: []string{os.Args[0]},
		Env:     []string{serverModeEnv + "=1", "VISIBLE=yes"},
	}
	c, reg, tools := connectAndRegister(t, s)
	if len(tools) != len(wantNames) {
		t.Errorf("got %d tools, want %d", len(tools), len(wantNames))
	}
	ctx := ctxT(t)
	cases := []struct {
		name, input, want string
		isErr             bool
	}{
		{"test__env", `{}`, `secret="" visible="yes" path=true`, false},
		{"test__add", `{"a":40,"b":2}`, "42", false},
		{"test__fail", `{}`, "disk is full", true},
	}
	for _, tc := range cases {
		o := reg.Call(ctx, tc.name, json.RawMessage(tc.input))
		if o.Content != tc.want || o.IsError != tc.isErr {
			t.Errorf("Call(%s) = %q (error %v), want %q (error %v)", tc.name, o.Content, o.IsError, tc.want, tc.isErr)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	o := reg.Call(ctx, "test__add", json.RawMessage(`{"a":1,"b":2}`))
	if !o.IsError || !strings.Contains(o.Content, `MCP server "test" is no longer connected`) {
		t.Errorf("Call after Close = %+v", o)
	}
}

func TestChildEnv(t *testing.T) {
	t.Setenv("PATH", "/usr/bin:/bin")
	if got, want := childEnv(nil), []string{"PATH=/usr/bin:/bin"}; !slices.Equal(got, want) {
		t.Errorf("childEnv(nil) = %q, want %q", got, want)
	}
	in := []string{"A=1", "PATH=/opt/bin"}
	if got := childEnv(in); !slices.Equal(got, in) {
		t.Errorf("childEnv(%q) = %q", in, got)
	}
	os.Unsetenv("PATH")
	if got := childEnv(nil); got == nil || len(got) != 0 {
		t.Errorf("childEnv(nil) without PATH = %#v, want an empty non-nil slice", got)
	}
}

func TestConnectFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://user:pw-zzz@" + ln.Addr().String() + "/mcp?key=zzz"
	ln.Close()

	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()

	cases := []struct {
		name   string
		server Server
		want   []string
	}{
		{"unreachable url", Server{Name: "web", URL: deadURL},
			[]string{`MCP server "web" (url http://` + ln.Addr().String() + `/mcp) could not be started or reached`, "connection refused"}},
		{"not an MCP endpoint", Server{Name: "web", URL: notFound.URL + "/mcp"},
			[]string{`MCP server "web" (url ` + notFound.URL + `/mcp) could not be started or reached`}},
		{"missing command", Server{Name: "fs", Command: []string{"/nonexistent/neuron-mcp-server", "--flag"}},
			[]string{`MCP server "fs" (command "/nonexistent/neuron-mcp-server") could not be started or reached`, "no such file or directory"}},
		{"command not on PATH", Server{Name: "fs", Command: []string{"neuron-no-such-mcp-server"}},
			[]string{`MCP server "fs" (command "neuron-no-such-mcp-server") could not be started or reached`, "executable file not found"}},
		{"server exits at once", Server{Name: "broken", Command: []string{os.Args[0]}, Env: []string{serverModeEnv + "=crash"}},
			[]string{`MCP server "broken" (command "` + os.Args[0] + `") could not be started or reached`,
				`its stderr ended with: "starting test server\nfatal: config file /etc/neuron-test.json is missing"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c, err := Connect(ctxT(t), tc.server, nil)
			if err == nil {
				c.Close()
				t.Fatal("Connect succeeded")
			}
			if !errors.Is(err, errs.Unavailable) {
				t.Errorf("err = %v, want errs.Unavailable", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v\nwant it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "zzz") {
				t.Errorf("credentials in the error: %v", err)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

func TestConnectCanceled(t *testing.T) {
	// A server that accepts the first request and never answers. Later
	// requests (the SDK's cancellation notice, which Connect may wait up to
	// 5s for) are accepted at once.
	block := make(chan struct{})
	var n atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(block)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := Connect(ctx, Server{Name: "slow", URL: ts.URL}, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `MCP server "slow"`) {
		t.Errorf("err = %v, want a deadline error naming the server", err)
	}
}

func TestConnectInvalidServer(t *testing.T) {
	_, err := Connect(context.Background(), Server{Name: "a b", URL: "http://x"}, nil)
	if !errors.Is(err, errs.InvalidArgument) {
		t.Errorf("err = %v", err)
	}
}
