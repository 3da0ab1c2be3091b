package gateway

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Routes is the route table: which agent answers which chat channel,
// conversation or user. The first route whose every given field matches
// a message names its agent; a message no route matches goes to Default.
//
// The file (--routes) is YAML:
//
//	default: helper          # messages no route matches
//	routes:
//	  - channel: slack       # slack or telegram
//	    conversation: C0OPS  # a Slack channel id, a Telegram chat id
//	    agent: ops
//	  - channel: telegram
//	    user: 42             # a Slack user id, a Telegram user id
//	    agent: personal
type Routes struct {
	// Default answers messages no route matches.
	Default string
	// Rules are tried in order.
	Rules []Route

	file        string
	defaultLine int
}

// Route sends the messages it matches to Agent. An empty field matches
// anything; a route has at least one field besides Agent.
type Route struct {
	Channel      string
	Workspace    string
	Conversation string
	User         string
	Agent        string
	// Line is the route's line in its file.
	Line int
}

// channelNames are the channels a route may name.
var channelNames = []string{"slack", "telegram"}

// routeFields are the keys of a route.
var routeFields = []string{"channel", "workspace", "conversation", "user", "agent"}

// LoadRoutes reads the route table at path.
func LoadRoutes(path string) (*Routes, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--routes: %w", err)
	}
	return ParseRoutes(path, b)
}

// ParseRoutes parses a route table; its errors name file and the line
// and field at fault.
func ParseRoutes(file string, b []byte) (*Routes, error) {
	r := &Routes{file: file}
	errf := func(line int, format string, a ...any) error {
		return fmt.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, a...))
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("%s: empty: give default: <agent> and/or routes:", file)
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, errf(top.Line, "the file must be a mapping with default: and routes:")
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		switch k.Value {
		case "default":
			if v.Kind != yaml.ScalarNode || strings.TrimSpace(v.Value) == "" {
				return nil, errf(v.Line, "default: must be an agent's name")
			}
			r.Default, r.defaultLine = strings.TrimSpace(v.Value), v.Line
		case "routes":
			if v.Kind != yaml.SequenceNode {
				if v.Tag == "!!null" {
					continue
				}
				return nil, errf(v.Line, "routes: must be a list of routes (- channel: ..., agent: ...)")
			}
			for n, item := range v.Content {
				rt, err := parseRoute(item, n+1, errf)
				if err != nil {
					return nil, err
				}
				r.Rules = append(r.Rules, rt)
			}
		default:
			return nil, errf(k.Line, "unknown key %q: the keys are default and routes", k.Value)
		}
	}
	if r.Default == "" && len(r.Rules) == 0 {
		return nil, fmt.Errorf("%s: no default: and no routes: give at least one", file)
	}
	return r, nil
}

func parseRoute(item *yaml.Node, n int, errf func(int, string, ...any) error) (Route, error) {
	rt := Route{Line: item.Line}
	if item.Kind != yaml.MappingNode {
		return rt, errf(item.Line, "route %d: must be a mapping of %s", n, strings.Join(routeFields, ", "))
	}
	for i := 0; i+1 < len(item.Content); i += 2 {
		k, v := item.Content[i], item.Content[i+1]
		if v.Kind != yaml.ScalarNode {
			return rt, errf(v.Line, "route %d: %s must be a single value", n, k.Value)
		}
		val := strings.TrimSpace(v.Value)
		switch k.Value {
		case "channel":
			if !slices.Contains(channelNames, val) {
				return rt, errf(v.Line, "route %d: channel %q: use one of %s", n, val, strings.Join(channelNames, ", "))
			}
			rt.Channel = val
		case "workspace":
			rt.Workspace = val
		case "conversation", "chat":
			rt.Conversation = val
		case "user":
			rt.User = val
		case "agent":
			rt.Agent = val
		default:
			return rt, errf(k.Line, "route %d: unknown field %q: the fields are %s", n, k.Value, strings.Join(routeFields, ", "))
		}
		if val == "" {
			return rt, errf(v.Line, "route %d: %s is empty: leave it out to match anything", n, k.Value)
		}
	}
	if rt.Agent == "" {
		return rt, errf(item.Line, "route %d: no agent: name the agent that answers these messages", n)
	}
	if rt.Channel == "" && rt.Workspace == "" && rt.Conversation == "" && rt.User == "" {
		return rt, errf(item.Line, "route %d: matches every message: give channel, workspace, conversation or user (or use default:)", n)
	}
	return rt, nil
}

// Agent is the agent that answers ev.
func (r *Routes) Agent(ev ChatEvent) string {
	for _, rt := range r.Rules {
		if (rt.Channel == "" || rt.Channel == ev.Channel) &&
			(rt.Workspace == "" || rt.Workspace == ev.Workspace) &&
			(rt.Conversation == "" || rt.Conversation == ev.Conversation) &&
			(rt.User == "" || rt.User == ev.User) {
			return rt.Agent
		}
	}
	return r.Default
}

// routeAgent is an agent the table names, and where.
type routeAgent struct{ agent, where string }

// agents lists the agents the table names, each once.
func (r *Routes) agents() []routeAgent {
	var out []routeAgent
	seen := map[string]bool{}
	add := func(a, where string) {
		if a != "" && !seen[a] {
			seen[a] = true
			out = append(out, routeAgent{a, where})
		}
	}
	if r.defaultLine > 0 {
		add(r.Default, fmt.Sprintf("%s:%d: default", r.file, r.defaultLine))
	} else {
		add(r.Default, "--default-agent")
	}
	for i, rt := range r.Rules {
		add(rt.Agent, fmt.Sprintf("%s:%d: route %d", r.file, rt.Line, i+1))
	}
	return out
}
