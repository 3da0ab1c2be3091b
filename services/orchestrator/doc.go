// Package orchestrator implements layer0.orchestrator.v1.OrchestratorService:
// it dispatches agents, executes the effects they declare exactly once, and
// runs durable workflows that survive a crash. The agents it may dispatch,
// with the address of the operator or environment service each runs on and
// the defaults each invocation gets, come from a YAML agent registry (see
// ParseRegistry).
//
// # One workflow, two engines
//
// The workflow is written once (workflow.go, Run) against a small port,
// Host (port.go): call an operator step, apply an effect, record an
// outcome, ask the registry and the budget policy, wait for a signal,
// publish an event. It is deterministic given its host's answers, and an
// engine makes it durable by recording every answer and giving it back
// when the workflow runs again after a crash. One gRPC Server (server.go)
// checks requests and serves any Engine (engine.go). Two engines exist,
// each in its own package owning its storage format:
//
//   - journal: a bbolt file in one process. Every operator call is step n,
//     its intent (the exact OperatorInput) journaled before the call and
//     its output after; every effect's outcome is journaled under its
//     idempotency key; registry lookups are journaled with the next write.
//     Writes are held back until the workflow next acts outside the
//     process and made in one commit, so a one-step dispatch commits
//     twice: its creation with its step's intent, then the step's result
//     with its end. After a restart every RUNNING workflow runs again
//     from the top, fast-forwarding through what is journaled, and calls
//     (again) the first step without a result. Writes go through a group
//     commit, so concurrent workflows share one fsync. Records are
//     binary; the file carries a schema version, checked at open.
//     Finished workflows are deleted after a retention
//     (journal.Retention); unfinished ones never are.
//   - temporal: one Temporal workflow per orchestrator workflow, operator
//     calls and effects as activities, signals as Temporal signals, queries
//     as Temporal queries, CancelWorkflow as Temporal cancellation. Only
//     references cross the history (operator outputs are kept in the State
//     service); its payloads are its own versioned types, and recorded
//     histories replay in tests. Any number of orchestrators share the
//     work.
//
// What remains different is a property of the engine: the journal runs in
// one process; Temporal lists workflows in its visibility store's order,
// and two concurrent Signals with one idempotency key are delivered once
// but may both be answered duplicate=false (with the same sequence).
//
// # Effects
//
// WriteMemory and DeleteMemory go to the State service (transient failures
// are retried for as long as the workflow runs; a refusal is recorded as
// not applied, with the reason). State writes carry "<workflow id>/<effect
// key>" as their State idempotency key, so a write whose outcome was not
// yet recorded is recognised by the State service instead of applied
// twice. Delegate runs the child agent inside the same workflow (depth +
// 1, cycle and depth guards) and re-invokes the delegating agent with the
// results (trigger TASK, metadata "delegations"). Handoff ends the agent;
// the next one takes over with the handed state (the first handoff of an
// output wins). Signal queues a signal for a workflow of this
// orchestrator. Log becomes an ObservableEvent. Custom effects go to an
// EffectHandler registered for their type or are recorded as not applied
// ("no handler"), never dropped.
//
// # Signals, suspension, budgets, retries
//
// A signal is recorded when Signal returns and is folded into the
// workflow's next operator call (trigger SIGNAL, a text block per signal,
// metadata "signals"). A workflow whose last call ends while signals are
// pending makes another call for them; an operator exiting SUSPENDED
// suspends the workflow until a signal arrives, which resumes it (with
// the suspension's resume token and the signal's data as the decision).
// A workflow budget is enforced at the dispatch boundary by the
// BudgetInterceptor of pkg/middleware/dispatch, told what is left through
// the call's context (dispatch.WithBudget; max_cost lowered to what is
// left; nothing left: RESOURCE_EXHAUSTED), and by a BudgetPolicy after
// each call (continue, downgrade the agent's model, halt). Cost, warnings and decisions are
// published as BudgetEvents on the lifecycle bus (pkg/lifecycle), which
// the binary also serves as LifecycleService. Retryable operator failures
// are retried per the agent's policy; only operator failures count as
// attempts, never a worker or process that died during the call.
package orchestrator
