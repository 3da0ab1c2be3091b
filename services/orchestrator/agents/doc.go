// Package agents keeps agent definitions (layer0.agent.v1) in the State
// service and serves AgentService over them; its Store is also the
// orchestrator's AgentSource, so Dispatch runs what was defined.
//
// # Storage
//
// Every definition lives in the State service's global scope, so every
// orchestrator replica (and any other component) sees one set:
//
//   - agents/NAME holds the current definition (the Agent message in its
//     JSON mapping, without its revision). Its State revision is the
//     agent's revision: CreateAgent writes it with expected_revision 0,
//     UpdateAgent and DeleteAgent with the revision the caller read, so
//     State serialises concurrent writers and exactly one of several
//     updates based on one revision wins.
//   - agent-revisions/NAME/REVISION holds the definition of an earlier
//     revision, never changed afterwards. Before an update or a delete
//     moves agents/NAME past revision R, the definition at R is copied
//     there, so a workflow that started with R (the engines record the
//     revision with the workflow) reads R to its end, even after the
//     agent changed or was deleted. Copies are not deleted (a later issue
//     may bound them).
//
// # Caching
//
// Dispatch must not pay a State round trip per call when nothing
// changed: Lookup serves a definition from memory for the Store's TTL
// (NewStore; DefaultCacheTTL, two seconds) after reading it. This replica's own
// writes (CreateAgent, UpdateAgent, DeleteAgent through this Store)
// replace or drop the cached entry at once; a change made through
// another replica is seen here at the latest a TTL later. While the
// State service is unreachable, Lookup answers with the definition it
// read last, however old, rather than failing the dispatch. A revision's
// definition never changes, so LookupRevision's answers are kept (up to
// maxPinned of them) without expiry.
//
// # The YAML registry
//
// The orchestrator's --agents file is an import format: at start, Seed
// creates every agent it lists that is not defined yet (CreateAgent's
// compare-and-set on revision 0, so replicas starting together create
// each once and ALREADY_EXISTS means another did it) and never changes a
// defined one. Edit a defined agent with UpdateAgent (neuron agents
// apply), not the file. The file's definitions are checked at start
// (Check: a bad file fails start-up); the seeding itself runs in the
// background (SeedInBackground), retried while the State service is
// down, and until it is done the file answers lookups of its agents that
// State cannot: the orchestrator starts, and dispatches the file's
// agents, whether or not State is up, as it did before definitions were
// stored.
package agents
