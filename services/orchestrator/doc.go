// Package orchestrator implements layer0.orchestrator.v1.OrchestratorService:
// it dispatches agents, executes the effects they declare exactly once, and
// runs durable workflows that survive a crash. The agents it may dispatch,
// with the address of the operator or environment service each runs on and
// the defaults each invocation gets, come from a YAML agent registry (see
// ParseRegistry).
package orchestrator
