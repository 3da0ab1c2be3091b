package gateway_test

import (
	"strings"
	"testing"

	"github.com/secbear/neuron/services/gateway"
)

// The first route whose every field matches names the agent; the rest
// go to the default.
func TestRoutesMatch(t *testing.T) {
	t.Parallel()
	r, err := gateway.ParseRoutes("routes.yaml", []byte(`
default: helper
routes:
  - channel: slack
    conversation: COPS
    user: UBOSS
    agent: boss
  - channel: slack
    conversation: COPS
    agent: ops
  - channel: telegram
    user: 42
    agent: personal
  - workspace: T2
    agent: other-team
  - chat: -1001
    agent: group
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ev   gateway.ChatEvent
		want string
	}{
		{gateway.ChatEvent{Channel: "slack", Workspace: "T1", Conversation: "COPS", User: "UBOSS"}, "boss"},
		{gateway.ChatEvent{Channel: "slack", Workspace: "T1", Conversation: "COPS", User: "U1"}, "ops"},
		{gateway.ChatEvent{Channel: "slack", Workspace: "T1", Conversation: "CGEN", User: "UBOSS"}, "helper"},
		{gateway.ChatEvent{Channel: "telegram", Conversation: "42", User: "42"}, "personal"},
		{gateway.ChatEvent{Channel: "slack", Workspace: "T1", Conversation: "D1", User: "42"}, "helper"},
		{gateway.ChatEvent{Channel: "slack", Workspace: "T2", Conversation: "COPS", User: "U1"}, "ops"},
		{gateway.ChatEvent{Channel: "slack", Workspace: "T2", Conversation: "C9", User: "U1"}, "other-team"},
		{gateway.ChatEvent{Channel: "telegram", Conversation: "-1001", User: "7"}, "group"},
	} {
		if got := r.Agent(tc.ev); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.ev, got, tc.want)
		}
	}
}

// Mistakes in the table are refused with the line and field at fault.
func TestRoutesErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ yaml, want string }{
		{"defualt: helper\n", `routes.yaml:1: unknown key "defualt"`},
		{"default: helper\nroutes:\n  - channel: slak\n    agent: a\n", `routes.yaml:3: route 1: channel "slak": use one of slack, telegram`},
		{"default: helper\nroutes:\n  - channel: slack\n    agent: a\n  - channel: slack\n    usr: U1\n    agent: b\n", `routes.yaml:6: route 2: unknown field "usr"`},
		{"default: helper\nroutes:\n  - channel: slack\n    conversation: C1\n", `routes.yaml:3: route 1: no agent`},
		{"routes:\n  - agent: a\n", `routes.yaml:2: route 1: matches every message`},
		{"default: helper\nroutes:\n  - channel: slack\n    user: \"\"\n    agent: a\n", `routes.yaml:4: route 1: user is empty`},
		{"default: helper\nroutes:\n  - channel: [slack]\n    agent: a\n", `routes.yaml:3: route 1: channel must be a single value`},
		{"default: helper\nroutes: slack\n", `routes.yaml:2: routes: must be a list`},
		{"default:\n", `routes.yaml:1: default: must be an agent's name`},
		{"- a\n", `routes.yaml:1: the file must be a mapping`},
		{"", `routes.yaml: empty`},
		{"default: [a\n", `routes.yaml: yaml:`},
		{"routes:\n", `routes.yaml: no default: and no routes:`},
	} {
		_, err := gateway.ParseRoutes("routes.yaml", []byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
