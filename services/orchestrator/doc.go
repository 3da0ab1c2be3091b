// Package orchestrator implements layer0.orchestrator.v1.OrchestratorService:
// it dispatches agents, executes the effects they declare exactly once, and
// runs durable workflows that survive a crash. The agents it may dispatch,
// with the address of the operator or environment service each runs on and
// the defaults each invocation gets, come from a YAML agent registry (see
// ParseRegistry).
//
// # Workflows
//
// Every Dispatch or StartWorkflow runs a workflow. A workflow is plain Go
// code (run.go) replayed against a bbolt journal (journal.go): each
// operator call is step n, counted in execution order, and its intent
// (the exact OperatorInput) is journaled before the call and its output
// after; each effect's outcome is journaled under its idempotency key.
// After a restart every RUNNING workflow runs again from the top: steps
// with a journaled output are not called again, effects with a journaled
// outcome are not executed again, and the first step without a result is
// called (again, if it was in flight at the crash). State writes carry
// "<workflow id>/<effect key>" as their State idempotency key, so a write
// whose outcome was not yet journaled is recognised by the State service
// instead of applied twice. Journal writes go through a group commit
// (commit.go): concurrent workflows share one fsync.
//
// # Effects
//
// WriteMemory and DeleteMemory go to the State service (transient failures
// are retried for as long as the workflow runs; a refusal is recorded as
// not applied, with the reason). Delegate runs the child agent inside the
// same workflow (depth + 1, cycle and depth guards) and re-invokes the
// delegating agent with the results (trigger TASK, metadata
// "delegations"). Handoff ends the agent; the next one takes over with
// the handed state (the first handoff of an output wins). Signal queues a
// signal for a workflow of this orchestrator. Log becomes an
// ObservableEvent. Custom effects go to an EffectHandler registered for
// their type or are recorded as not applied ("no handler"), never dropped.
//
// # Signals, suspension, budgets
//
// A signal is journaled when Signal returns and is folded into the
// workflow's next operator call (trigger SIGNAL, a text block per signal,
// metadata "signals"). A workflow whose last call ends while signals are
// pending makes another call for them; an operator exiting SUSPENDED
// suspends the workflow until a signal arrives, which resumes it (with
// the suspension's resume token and the signal's data as the decision).
// A workflow budget is enforced at the dispatch boundary by
// BudgetInterceptor (max_cost lowered to what is left; nothing left:
// RESOURCE_EXHAUSTED) and by a BudgetPolicy after each call (continue,
// downgrade the agent's model, halt). Cost, warnings and decisions are
// published as BudgetEvents on the lifecycle bus (pkg/lifecycle), which
// the binary also serves as LifecycleService.
package orchestrator
