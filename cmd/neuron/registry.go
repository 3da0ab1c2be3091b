package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/secbear/neuron/services/operator/provider/providers"
)

// route is where the orchestrator runs the agents of `neuron up`.
type route int

const (
	// routeEnvironment: through the environment service, each operator
	// call a fresh sandboxed process (Landlock, namespaces, cgroup).
	routeEnvironment route = iota
	// routeOperator: straight to the operator service.
	routeOperator
)

// registryConfig is what the generated agent registry depends on.
type registryConfig struct {
	route           route
	operatorAddr    string
	environmentAddr string
	// scripted: no model credentials; each agent carries its script.
	scripted bool
	// model is the model name for real providers; empty: the operator's
	// default.
	model string
	// sidecar, on the environment route with a model key, is the
	// provider whose key the egress proxy adds (credential sidecarSecret).
	sidecar *providers.Descriptor
}

// The demo's memory: where the assistant remembers its last run.
const (
	memoryKey   = "assistant/last_run"
	memoryScope = "global"
)

// assistantScript is the scripted assistant: it delegates the task to the
// researcher; when the results come back it writes notes.md with the
// write tool, remembers the run with write_memory and answers.
func assistantScript() map[string]any {
	return map[string]any{
		"turns": []any{
			map[string]any{
				"text": "I'll ask the researcher first.",
				"tool_calls": []any{map[string]any{"name": "delegate", "arguments": map[string]any{
					"agent_id": "researcher",
					"message":  "Find out what the layer0 protocols are and report the facts.",
				}}},
			},
			map[string]any{"text": "Waiting for the researcher's findings."},
		},
		"cases": []any{map[string]any{
			"contains": "Results of delegated tasks",
			"turns": []any{
				map[string]any{
					"text": "The researcher reported back. Saving notes and remembering this run.",
					"tool_calls": []any{
						map[string]any{"name": "write", "arguments": map[string]any{
							"path":    "notes.md",
							"content": "# Notes\n\nlayer0 splits an agent system along six protocol boundaries: operator, orchestrator, state, environment, middleware, lifecycle.\n",
						}},
						map[string]any{"name": "write_memory", "arguments": map[string]any{
							"scope": memoryScope,
							"key":   memoryKey,
							"value": map[string]any{
								"summary":  "delegated research on the layer0 protocols and wrote notes.md",
								"agent":    "assistant",
								"scripted": true,
							},
						}},
					},
				},
				map[string]any{"text": "[scripted answer] layer0 splits an agent system along six protocol boundaries " +
					"(operator, orchestrator, state, environment, middleware, lifecycle). The researcher found this; " +
					"I wrote notes.md and saved a memory (global scope, key " + memoryKey + ")."},
			},
		}},
	}
}

// researcherScript is the scripted researcher: one answer.
func researcherScript() map[string]any {
	return map[string]any{"turns": []any{map[string]any{
		"text": "[scripted research] layer0 has six protocols: operator (one agent cycle), orchestrator (dispatch, " +
			"durable workflows), state (scoped memory), environment (isolation), middleware (interception) and " +
			"lifecycle (budget, compaction, observability events).",
	}}}
}

// sidecarHeader is the header that carries provider's API key; empty
// means "Authorization: Bearer".
func sidecarHeader(provider string) string {
	switch provider {
	case "anthropic":
		return "x-api-key"
	case "gemini", "google":
		return "x-goog-api-key"
	}
	return ""
}

// agentRegistry renders the agent registry YAML for the orchestrator.
func agentRegistry(cfg registryConfig) ([]byte, error) {
	var b strings.Builder
	b.WriteString("# The demo agents of `neuron up`, written at every start (edits here are\n" +
		"# overwritten). The orchestrator defines those that are not defined yet, and\n" +
		"# neuron up keeps the definitions labelled " + managedByLabel + "=" + managedByUp + " in step\n" +
		"# with each start. Change an agent with `neuron agents get NAME > a.yaml`, edit,\n" +
		"# remove the label, `neuron agents apply -f a.yaml`; define yours the same way.\n" +
		"# See services/orchestrator/registry.go for the fields.\n")
	b.WriteString("defaults:\n")
	switch cfg.route {
	case routeEnvironment:
		b.WriteString("  # Every operator call runs in the environment service's process sandbox:\n")
		b.WriteString("  # a fresh operator process under Landlock, namespaces and a cgroup, no network.\n")
		fmt.Fprintf(&b, "  environment: %s\n", cfg.environmentAddr)
		b.WriteString("  spec:\n")
		b.WriteString("    timeout: 120s\n")
		b.WriteString("    isolation: [{process: {}}]\n")
		b.WriteString("    resources: {memory: \"512Mi\", max_processes: 64}\n")
		b.WriteString("    network: {default_action: NETWORK_ACTION_DENY}\n")
		b.WriteString("    # One workspace per workflow, kept by the environment service across\n")
		b.WriteString("    # its steps: neuron files ls|get --workflow ID.\n")
		b.WriteString("    workspace: {scope: WORKSPACE_SCOPE_WORKFLOW}\n")
		if d := cfg.sidecar; d != nil {
			b.WriteString("    # The model key stays with the environment service: its egress proxy\n")
			b.WriteString("    # adds it to the calls to the provider; the sandbox holds a placeholder.\n")
			fmt.Fprintf(&b, "    credentials: [{name: %s, injection: {sidecar: {host: %s, header: %s}}}]\n", sidecarSecret, d.Host, yamlString(sidecarHeader(d.Name)))
		}
	default:
		b.WriteString("  # Every operator call goes to the operator service directly.\n")
		fmt.Fprintf(&b, "  operator: %s\n", cfg.operatorAddr)
	}
	if cfg.model != "" {
		fmt.Fprintf(&b, "  model: %s\n", yamlString(cfg.model))
	}
	b.WriteString("  retry: {max_attempts: 2}\n")
	b.WriteString("agents:\n")
	type agent struct {
		id, description, addendum string
		budget                    string
		maxTurns                  int
		script                    map[string]any
	}
	agents := []agent{
		{
			id: "assistant", budget: "1.00", maxTurns: 8, script: assistantScript(),
			description: "The demo assistant: delegates research, writes notes.md and remembers the run.",
			addendum: "You are the assistant of the local neuron demo. For each task: first delegate the research to the agent " +
				"\"researcher\" with the delegate tool. When its results come back, write a short notes.md with the write tool, " +
				"save a one-line summary with write_memory (scope \"" + memoryScope + "\", key \"" + memoryKey + "\"), and answer the user briefly.",
		},
		{
			id: "researcher", maxTurns: 4, script: researcherScript(),
			description: "The demo researcher: answers one question with facts.",
			addendum:    "You research one question and answer with facts only, briefly.",
		},
	}
	for _, a := range agents {
		fmt.Fprintf(&b, "  - id: %s\n", a.id)
		fmt.Fprintf(&b, "    description: %s\n", yamlString(a.description))
		fmt.Fprintf(&b, "    labels: {%s: %s}\n", yamlString(managedByLabel), yamlString(managedByUp))
		if a.budget != "" {
			fmt.Fprintf(&b, "    budget: %q   # USD per workflow it starts\n", a.budget)
		}
		fmt.Fprintf(&b, "    max_turns: %d\n", a.maxTurns)
		fmt.Fprintf(&b, "    system_addendum: %s\n", yamlString(a.addendum))
		if cfg.scripted {
			js, err := json.Marshal(map[string]any{"scripted": a.script})
			if err != nil {
				return nil, err
			}
			b.WriteString("    # The scripted model's replies for this agent (no model credentials are set).\n")
			fmt.Fprintf(&b, "    metadata: %s\n", js)
		}
	}
	return []byte(b.String()), nil
}

// yamlString quotes s for YAML: a JSON string is a valid YAML
// double-quoted scalar.
func yamlString(s string) string {
	js, _ := json.Marshal(s)
	return string(js)
}

// demoAgentsFile is where neuron up writes the demo agents, in the
// orchestrator's --agents format, under --data-dir.
const demoAgentsFile = "demo-agents.yaml"

// The label neuron up puts on the demo agents it defines. neuron up keeps
// the definitions carrying it in step with each start's route and model;
// a definition without it is the user's and is never changed.
const (
	managedByLabel = "neuron.dev/managed-by"
	managedByUp    = "neuron-up"
)
