// Package lifecycle is the conformance suite of
// layer0.lifecycle.v1.LifecycleService
// (proto/layer0/lifecycle/v1/lifecycle.proto): a Go test suite that
// checks any implementation over gRPC at an address.
//
// # Running it against a server
//
//	go test ./pkg/conformance/lifecycle -v -count=1 -args -addr HOST:PORT \
//	    [-token-file F] [-tls] [-ca F] [-server-name NAME]
//
// Without -addr the test runs the suite in process twice: against
// pkg/lifecycle's server over a bus of the default sizes, and against
// the orchestrator's LifecycleService (services/orchestrator/serve over
// an in-memory State service). Another Go test can call
// Run(t, Target{Conn: conn}).
//
// Every event the suite publishes names a workflow id under a random
// prefix, and every subscription filters on such a workflow, so it can
// run against a server that carries other traffic (an orchestrator's own
// events), and repeatedly.
//
// # What it checks
//
//   - Publish returns strictly increasing sequences, from 1.
//   - Order: a subscriber receives the events published after it
//     subscribed, in publish order, as published (the envelope and the
//     event), with the sequence Publish returned and a time set, and
//     dropped 0 while it keeps up.
//   - Filters: workflow_id, agent_id, kinds and sources each select what
//     they name, together the intersection; sources admits only
//     observable events.
//   - Replay: after_sequence replays the buffered events after it, then
//     live ones, with no gap and no duplicate.
//   - Dropped: a subscriber that reads nothing while SlowEvents events of
//     about 1 KiB are published gets them all; or a contiguous run and
//     then RESOURCE_EXHAUSTED whose message names after_sequence, after
//     which resubscribing after the last event received replays the rest
//     with no gap (the reference server does this); or every gap
//     announced by a dropped count equal to the number of events missed.
//     A silent gap fails.
//   - Invalid input is INVALID_ARGUMENT with a message: Publish without an
//     event, of an event with no kind, of an observable event without
//     event_type; Subscribe naming an unspecified kind or source, or with
//     after_workflow_sequence but no workflow_id.
//
// # What it cannot check
//
//   - The durable per-workflow log (after_workflow_sequence with a
//     workflow): only an orchestrator that ran the workflow has one; the
//     orchestrator's own tests cover it (TestWatch*).
//   - OUT_OF_RANGE for an after_sequence older than the ring: the ring's
//     size is the implementation's; nor the stream caps
//     (RESOURCE_EXHAUSTED naming the cap) and the send timeout, whose
//     values are deployment settings. pkg/lifecycle's tests cover them.
//   - PERMISSION_DENIED for a credential that may not publish: the suite
//     holds one credential.
//   - Which events a deployment publishes by itself (the orchestrator's
//     budget and observable events): that is each service's contract.
package lifecycle
