package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/a2a"
	"github.com/a2aproject/a2a-go/a2apb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/secbear/neuron/services/gateway"
)

const (
	clientToken = "client-token-0123456789"
	chatToken   = "chat-only-token-0123456789"
)

// Outside dev mode every endpoint but the agent cards wants a bearer
// token of the auth policy, allowed the endpoint's method.
func TestAuth(t *testing.T) {
	t.Parallel()
	policy := filepath.Join(t.TempDir(), "policy.json")
	b, _ := json.Marshal(map[string]any{"principals": []any{
		map[string]any{"name": "client", "tokens": []string{clientToken}, "allow": []string{"/a2a.v1.A2AService/*", "/neuron.gateway.HTTP/*"}},
		map[string]any{"name": "chat", "tokens": []string{chatToken}, "allow": []string{gateway.MethodHTTPChat}},
	}})
	if err := os.WriteFile(policy, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStack(t, stackOptions{gateway: func(c *gateway.Config) {
		c.Server.Dev, c.Server.Plaintext, c.Server.AuthPolicy = false, true, policy
		c.Orchestrator.Dev, c.State.Dev = true, true
	}}, echoAgent("echo"))
	ctx := ctxFor(t, 60*time.Second)

	resp, err := http.Get(s.httpURL + "/a2a/echo/.well-known/agent-card.json")
	if err != nil {
		t.Fatal(err)
	}
	var card a2a.AgentCard
	_ = json.NewDecoder(resp.Body).Decode(&card)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(card.Security) == 0 {
		t.Fatalf("the card: HTTP %d, security %v (want public, declaring bearer auth)", resp.StatusCode, card.Security)
	}

	send := `{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"kind": "message", "messageId": "m1", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}}}`
	post := func(path, token, body string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.httpURL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(got)
	}
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/a2a/echo", "", http.StatusUnauthorized},
		{"/a2a/echo", "not-a-token-of-the-policy", http.StatusUnauthorized},
		{"/a2a/echo", chatToken, http.StatusForbidden},
		{"/mcp", "", http.StatusUnauthorized},
		{"/mcp", chatToken, http.StatusForbidden},
		{"/v1/chat", "", http.StatusUnauthorized},
		{"/v1/schedules", "", http.StatusUnauthorized},
		{"/v1/schedules", chatToken, http.StatusForbidden},
	} {
		if code, body := post(c.path, c.token, send); code != c.want {
			t.Fatalf("POST %s with token %q: HTTP %d %s, want %d", c.path, c.token, code, body, c.want)
		}
	}
	if code, body := post("/a2a/echo", clientToken, send); code != http.StatusOK || !strings.Contains(body, "You said: hi") {
		t.Fatalf("with the client's token: HTTP %d %s", code, body)
	}
	if code, body := post("/v1/chat", chatToken, `{"agent": "echo", "message": "hi"}`); code != http.StatusOK || !strings.Contains(body, "RUN_FINISHED") {
		t.Fatalf("chat with the chat token: HTTP %d %s", code, body)
	}
	if code, body := post("/v1/schedules", clientToken, `{"name": "nightly", "agent": "echo", "cron": "0 3 * * *", "message": "hi"}`); code != http.StatusCreated {
		t.Fatalf("a schedule with the client's token: HTTP %d %s", code, body)
	}

	g := a2apb.NewA2AServiceClient(dialInsecure(t, s.grpcAddr))
	req := &a2apb.SendMessageRequest{Request: &a2apb.Message{MessageId: "m2", Role: a2apb.Role_ROLE_USER,
		Parts: []*a2apb.Part{{Part: &a2apb.Part_Text{Text: "hi"}}}}}
	if _, err := g.SendMessage(metadata.AppendToOutgoingContext(ctx, gateway.AgentHeader, "echo"), req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("gRPC without a token: %v, want UNAUTHENTICATED", err)
	}
	if _, err := g.SendMessage(metadata.AppendToOutgoingContext(ctx, gateway.AgentHeader, "echo", "authorization", "Bearer "+chatToken), req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("gRPC with the chat token: %v, want PERMISSION_DENIED", err)
	}
	if _, err := g.SendMessage(metadata.AppendToOutgoingContext(ctx, gateway.AgentHeader, "echo", "authorization", "Bearer "+clientToken), req); err != nil {
		t.Fatalf("gRPC with the client's token: %v", err)
	}
}
