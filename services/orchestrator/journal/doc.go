// Package journal is the orchestrator's engine on a bbolt file in one
// process: Engine implements orchestrator.Engine by journaling every
// step, effect and signal of a workflow, and runs every unfinished
// workflow again from the top after a restart, replaying what is
// journaled.
//
// Files, from the engine inwards:
//
//   - engine.go: Engine (Start, Wait, Cancel, Signal, reads), the runs
//     in this process, Resume at start.
//   - host.go: the orchestrator.Host of one run: answers from the
//     journal what is journaled (a replay), does and journals the rest,
//     holding writes back until the next thing that leaves the process.
//   - journal.go: the file's layout (every bucket and key, the schema
//     version), Open, and the journal's reads and writes (a write is
//     ops on one workflow in one transaction).
//   - codec.go: the records' binary form.
//   - commit.go: the group commit every write goes through.
//   - indexes.go: the status indexes (every workflow; the unfinished
//     ones; the finished ones by end time) and the migration that builds
//     them in a version 1 file.
//   - retention.go: Retention, Prune and Retain: deleting finished
//     workflows.
//   - check.go: Open's options (the logger of the file's check,
//     pkg/boltcheck).
//
// # Retention
//
// The journal deletes finished workflows (COMPLETED, FAILED, CANCELED)
// once they ended more than Retention.MaxAge ago, and those that ended
// first beyond Retention.MaxWorkflows, but never one that ended less
// than MinRetention ago (its Dispatch caller reads it then). RUNNING and
// SUSPENDED workflows are never deleted, whatever their age. Retain runs
// Prune at once and then every minute in the background; Prune deletes
// at most 64 workflows per transaction and yields the journal to the
// running workflows between transactions (at least 90% of the time).
//
// Deleting a workflow deletes everything it owns: its bucket (record,
// steps, effects, signals and their idempotency keys, registry lookups,
// event log) and its entries in the status indexes. A deleted workflow
// is NOT_FOUND to GetWorkflow and absent from ListWorkflows; page tokens
// issued before stay valid. A Dispatch or StartWorkflow that reuses its
// id starts a new workflow from scratch: nothing is replayed, its
// signal keys no longer deduplicate, its event log starts at 1. The
// State service's idempotency keys are "<workflow id>/<effect key>", so
// such a new workflow's effects are recognised as the old one's while
// the State service still remembers them (its --idempotency-retention,
// 24h by default): keep the journal's retention longer, or do not reuse
// workflow ids (the orchestrator's own ids never repeat).
//
// A start reads only the unfinished workflows (the live index), but
// bbolt itself walks every page in use when it opens the file (the
// journal keeps no free list on disk), and so does Open's check: a
// start's time and memory follow what the journal holds, which
// retention bounds. bbolt never shrinks its file: the pages of deleted
// workflows are free and reused by later writes, so the file stops
// growing once retention deletes as much as new workflows write. To
// give the space back to the file system, compact the file while the
// orchestrator is stopped (bbolt compact, see the README).
//
// # Commits
//
// A one-step dispatch that names its workflow commits twice: the
// workflow's creation with its step's intent (and the lookups and events
// before it), just before the operator call; the step's result, its
// effects' outcomes and the workflow's end, before the caller is
// answered. Start returns once the first commit is durable. The host
// holds every write back until the workflow next acts outside the
// process (an operator call, an effect other than a log, the answer to
// its caller), so a crash loses only what a crash just before that
// write would have: an operator call in flight, or the outcome of an
// effect applied last (applied again under its idempotency key).
// Concurrent workflows share commits (commit.go).
//
// A Dispatch that names no workflow commits once: nobody can name its
// workflow before it answers, so its creation and first intent are held
// back over the first operator call too (engine.go, deferral), and a
// crash during that call leaves nothing behind. Whoever names the
// workflow meanwhile (it is listed, or its id is passed on) journals
// it first, and finds it as it would have otherwise.
//
// # Schema versions
//
// Schema version 2 added the status indexes of indexes.go. Open
// migrates a version 1 file in place, in its first transaction (one
// read of every workflow's record, once); a version 1 orchestrator then
// refuses the file. Version 3 stores the records in binary (codec.go)
// instead of JSON; it reads a version 2 file's JSON records as they are
// and writes each in binary when it next changes, so Open only stamps
// the version; a version 2 orchestrator then refuses the file.
package journal
