package operator_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
)

// TestInvocationAgentConfig: what an invocation's config carries reaches
// the model request (instructions replacing the default prompt, the
// addendum appended, model parameters), and bad values are refused with
// INVALID_ARGUMENT naming the field, before any model call.
func TestInvocationAgentConfig(t *testing.T) {
	m := &fakeModel{steps: []step{say("ok", "0")}}
	c := serve(t, operator.Config{SystemPrompt: "process default", MaxTokens: 100, ExtraTools: tools(okTool("ok", 1))}, m)
	schema, _ := structpb.NewStruct(map[string]any{"type": "object"})
	_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{
		Message: content.Text("hi"),
		Config: &operatorv1.OperatorConfig{
			Instructions: new("agent prompt"), SystemAddendum: new("addendum"),
			ModelParameters: &operatorv1.ModelParameters{
				Temperature: new(0.7), MaxOutputTokens: new(uint32(42)),
				ReasoningEffort: operatorv1.ReasoningEffort_REASONING_EFFORT_HIGH, OutputSchema: schema,
			},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{Message: content.Text("hi")}})
	if err != nil {
		t.Fatal(err)
	}
	reqs := m.requests()
	a, b := reqs[0], reqs[1]
	if a.System != "agent prompt\n\naddendum" || a.MaxTokens != 42 || a.Temperature == nil || *a.Temperature != 0.7 ||
		a.ReasoningEffort != provider.EffortHigh || a.OutputSchema["type"] != "object" {
		t.Fatalf("request with the agent's config: system %q, max tokens %d, temperature %v, effort %q, schema %v",
			a.System, a.MaxTokens, a.Temperature, a.ReasoningEffort, a.OutputSchema)
	}
	if b.System != "process default" || b.MaxTokens != 100 || b.Temperature != nil || b.ReasoningEffort != "" || b.OutputSchema != nil {
		t.Fatalf("the next invocation kept the previous agent's config: %+v", b)
	}

	notObject, _ := structpb.NewStruct(map[string]any{"type": "string"})
	broken, _ := structpb.NewStruct(map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"minLength": "x"}}})
	for _, tc := range []struct {
		name string
		cfg  *operatorv1.OperatorConfig
		want string
	}{
		{"blank instructions", &operatorv1.OperatorConfig{Instructions: new("   ")}, "config.instructions"},
		{"oversized instructions", &operatorv1.OperatorConfig{Instructions: new(strings.Repeat("x", 70000))}, "instructions"},
		{"schema not an object", &operatorv1.OperatorConfig{ModelParameters: &operatorv1.ModelParameters{OutputSchema: notObject}}, "output_schema"},
		{"schema that does not compile", &operatorv1.OperatorConfig{ModelParameters: &operatorv1.ModelParameters{OutputSchema: broken}}, "output_schema"},
		{"MCP server without a transport", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{{Name: "x"}}}, "mcp_servers[0]"},
		{"duplicate MCP server names", &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{
			{Name: "x", Transport: &operatorv1.McpServer_Http{Http: &operatorv1.McpHttp{Url: "http://a"}}},
			{Name: "x", Transport: &operatorv1.McpServer_Http{Http: &operatorv1.McpHttp{Url: "http://b"}}}}}, "unique"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(m.requests())
			_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{Message: content.Text("hi"), Config: tc.cfg}})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("err %v, want INVALID_ARGUMENT naming %s", err, tc.want)
			}
			if len(m.requests()) != n {
				t.Fatal("the model was called")
			}
		})
	}
}

// TestInvocationMCPWithoutPolicy: an operator started without an MCP
// policy refuses every invocation MCP server with PERMISSION_DENIED
// naming the flags that would allow it, and keeps serving.
func TestInvocationMCPWithoutPolicy(t *testing.T) {
	m := &fakeModel{steps: []step{say("ok", "0")}}
	c := serve(t, operator.Config{ExtraTools: []tool.Tool{okTool("ok", 1)}}, m)
	_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{
		Message: content.Text("hi"),
		Config: &operatorv1.OperatorConfig{McpServers: []*operatorv1.McpServer{{Name: "fs",
			Transport: &operatorv1.McpServer_Stdio{Stdio: &operatorv1.McpStdio{Command: "/usr/bin/true"}}}}},
	}})
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(msg, "config.mcp_servers[0]") || !strings.Contains(msg, "--mcp-stdio-allow") {
		t.Fatalf("err %v, want PERMISSION_DENIED naming the field and the flag", err)
	}
	if _, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{Message: content.Text("hi")}}); err != nil {
		t.Fatal(err)
	}
}

// TestParseCredentials: the credentials file is strict and never quotes
// a secret in its errors.
func TestParseCredentials(t *testing.T) {
	got, err := operator.ParseCredentials([]byte(`{"credentials":{"gh":{"headers":{"Authorization":"Bearer s3cret"}},"k":{"env":{"API_KEY":"v"}}}}`))
	if err != nil || got["gh"].Headers["Authorization"] != "Bearer s3cret" || got["k"].Env["API_KEY"] != "v" {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{
		`{}`, `{"credentials":{"x":{}}}`, `{"credentials":{"x":{"env":{"1BAD":"s3cret"}}}}`,
		`{"credentials":{"x":{"headers":{"A":"s3cret"}}},"extra":1}`, `{"credentials":{}} trailing`,
	} {
		_, err := operator.ParseCredentials([]byte(bad))
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("%s: err %v, want an error without the secret", bad, err)
		}
	}
}
