// Package agent is the conformance suite of layer0.agent.v1.AgentService
// (proto/layer0/agent/v1/agent.proto): a Go test suite that checks any
// implementation over gRPC at an address.
//
// # Running it against a server
//
//	go test ./pkg/conformance/agent -v -count=1 -args -addr HOST:PORT \
//	    [-token-file F] [-tls] [-ca F] [-server-name NAME]
//
// With -addr the suite runs only against that server. Without it, the
// test starts a State service (memory backend) and the reference
// orchestrator (services/orchestrator/serve) in process on loopback and
// runs the suite against its AgentService. Flags:
//
//	-addr         the server; plaintext unless -tls or -ca is given
//	-token-file   file holding a bearer token allowed every AgentService
//	              method (omit for a server with authentication off)
//	-tls, -ca, -server-name  TLS to the server, with an optional CA bundle
//
// The suite creates agents named "conf" plus 12 random hex digits plus a
// suffix, so it can run against a server that already holds agents, and
// repeatedly; it deletes the agents it created. Their route names an
// operator address that need not exist: the suite never dispatches.
//
// # What it checks
//
//   - CreateAgent returns revision > 0 and the times; a second create of
//     the name is ALREADY_EXISTS; GetAgent returns what was stored.
//   - UpdateAgent with the current revision moves the revision up and
//     keeps create_time; with an old one it is FAILED_PRECONDITION (reason
//     STALE_REVISION) and changes nothing; of concurrent updates made with
//     one revision exactly one succeeds; GetAgent of the earlier revision
//     still returns the earlier definition.
//   - ListAgents pages (every agent once, in name order) and filters by
//     labels.
//   - DeleteAgent with a stale expected revision is FAILED_PRECONDITION;
//     then the agent is NOT_FOUND for GetAgent, UpdateAgent and
//     DeleteAgent.
//   - Bad input is INVALID_ARGUMENT naming the field: a bad name, no
//     route, an unknown built-in tool or model, an output schema that is
//     not a JSON Schema, an MCP server without a command or a URL, an
//     allowlist naming a missing agent, instructions over 64 KiB.
package agent
