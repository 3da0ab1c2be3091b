// Package orchestrator is the conformance suite of
// layer0.orchestrator.v1.OrchestratorService
// (proto/layer0/orchestrator/v1/orchestrator.proto): a Go test suite
// that checks any implementation, in any language, over gRPC at an
// address.
//
// # Running it against a server
//
//	go test ./pkg/conformance/orchestrator -v -args -addr HOST:PORT \
//	    [-state-addr HOST:PORT] [-token-file F] [-state-token-file F] \
//	    [-tls] [-ca F] [-server-name NAME] \
//	    [-answer-agent ID] [-slow-agent ID] [-suspend-agent ID] [-writer-agent ID] \
//	    [-approver-agent ID] [-streamer-agent ID] \
//	    [-wait-timeout D] [-list-wait D]
//
// Without -addr that test skips; services/orchestrator's
// conformance_test.go runs the suite against the reference orchestrator
// on both of its backends (bbolt, and Temporal when the Temporal CLI is
// installed). Add -count=1 to rerun, which go test otherwise caches.
//
// Another Go test can run the suite against its own server:
//
//	orchestrator.Run(t, orchestrator.Target{Conn: conn, State: stateConn})
//
// Target.Skip names checks (subtest paths below Run's test, such as
// "ListWorkflows/NewestFirst") to skip, each with its reason: known bugs
// of an implementation, reported as skips that say why.
//
// # What the deployment must provide
//
// The orchestrator's agent registry must hold six agents, by default
// with the ids below (Target.Agents or the -*-agent flags name others).
// The suite dispatches each with a USER-triggered input holding a text
// message, and never sets session_id, so operators keep no session
// history (and declare no history effects).
//
//   - conformance-answer (Answer): every call completes
//     (EXIT_KIND_COMPLETE) at once with a non-empty text message and no
//     effects. Any cost.
//   - conformance-slow (Slow): every call takes at least 30 seconds
//     (SlowAtLeast) unless it is cancelled or its deadline passes, and
//     then stops promptly. It must not answer early to fit its caller's
//     deadline (the operator service does: it returns EXIT_KIND_TIMEOUT
//     shortly before the deadline, so a scripted delay is no Slow agent).
//     Whatever it answers after that is never seen.
//   - conformance-suspend (Suspend): every call, the first and every
//     call resumed by a signal, exits EXIT_KIND_SUSPENDED at once (with
//     any suspension and resume token), and declares no effects. Its
//     operator must accept a resumed input (input.resume set, trigger
//     SIGNAL).
//   - conformance-writer (Writer): every call declares exactly one
//     effect, a WriteMemory of the JSON string WriterValue ("written by
//     the conformance writer") under the key WriterKey
//     ("conformance/written") in the workflow scope of the workflow the
//     call runs in (DispatchContext.workflow_id), and completes. Any
//     text and cost.
//   - conformance-approver (Approver): a call without input.resume exits
//     EXIT_KIND_SUSPENDED at once, with any resume token, no effects, and
//     Suspension.tool_calls listing two calls waiting for approval:
//     tool_use_id "call-1", name "write_file" (ApproverCall1,
//     ApproverTool1) and tool_use_id "call-2", name "shell"
//     (ApproverCall2, ApproverTool2); any input and reason. A resumed call
//     (input.resume with tool_decisions) completes at once with the text
//     Decided(tool_decisions): "ID=approved" or "ID=rejected" per
//     decision, sorted by tool_use_id, separated by single spaces, such
//     as "call-1=approved call-2=rejected". Any cost.
//   - conformance-streamer (Streamer): every call streams (the operator
//     serves ExecuteStream) a text delta "conformance streaming"
//     (StreamerText) at its start, then behaves like Slow: it takes at
//     least 30 seconds unless it is cancelled, and stops promptly then.
//
// Unknown agent ids are the run's namespace plus "-no-such-agent", which
// the registry must not hold.
//
// With -state-addr (Target.State) the suite reads the Writer's key from
// the StateService the orchestrator applies memory effects to, and checks
// that a repeated Dispatch does not write it again (its revision stays).
// Without it those checks skip.
//
// With the reference orchestrator, Answer and Writer can run on the real
// operator service with the built-in scripted model: a registry entry's
// metadata holds the script, for example
//
//	agents:
//	  - id: conformance-answer
//	    operator: 127.0.0.1:7071
//	    metadata: {scripted: {turns: [{text: "4"}]}}
//	  - id: conformance-writer
//	    operator: 127.0.0.1:7071
//	    metadata: {scripted: {turns: [
//	      {tool_calls: [{name: write_memory, arguments:
//	        {scope: workflow, key: conformance/written, value: written by the conformance writer}}]},
//	      {text: "Written."}]}}
//
// Slow, Suspend, Approver and Streamer need an operator of their own: the
// operator service answers before its caller's deadline, the scripted
// model cannot suspend, and the operator service refuses a resumed input
// it did not issue. The reference test
// (services/orchestrator/conformance_test.go) serves fake operators in
// process for them (one that streams, for Approver and Streamer).
//
// # What it checks
//
// Each behaviour is its own subtest, named after it (run one with
// -run 'TestConformance/.*/Signals/RepeatedKeyIsDuplicate'); codes are
// checked exactly. Every workflow id starts with "conf" and 12 random hex
// digits, so the suite can run against an orchestrator that holds other
// workflows, and repeatedly; every workflow it leaves running or
// suspended is cancelled when its subtest ends.
//
//   - Health: grpc.health.v1 reports "" and
//     "layer0.orchestrator.v1.OrchestratorService" SERVING.
//   - Dispatch: returns the workflow id, the Answer agent's output and a
//     well-formed total_cost; GetWorkflow then shows it COMPLETED with at
//     least one step, the agent as root and current agent, spent equal to
//     total_cost and the output as last_output. Without workflow_id an id
//     is assigned. Repeating the Dispatch (same workflow_id and request)
//     returns the same response and runs nothing (steps unchanged);
//     another message or agent with that id is ALREADY_EXISTS.
//   - StartWorkflow: returns within 10s while the Slow agent's call runs
//     (already_started false, the workflow RUNNING); a repeat is
//     already_started true; the Answer agent's workflow reaches COMPLETED
//     (polled); another request reusing the id is ALREADY_EXISTS for
//     StartWorkflow and Dispatch.
//   - InvalidArgument: Dispatch without input, input.message or agent_id,
//     or with a budget amount that is malformed or negative; StartWorkflow
//     without input.message or with a malformed budget; DispatchMany
//     without tasks; an unknown query_type; Signal without a payload;
//     page_size -1 or 1001; a page_token that is not base64, and one that
//     is but was never issued.
//   - NotFound: Dispatch and StartWorkflow of an unknown agent, naming it;
//     GetWorkflow, Query, Signal (with and without idempotency key) and
//     CancelWorkflow of an unknown workflow, naming it.
//   - Effects: the Writer's Dispatch reports one effect outcome, applied,
//     with a non-empty idempotency_key (the effect's own key, when its
//     output declared one); with a State connection the value is readable
//     and a repeated Dispatch leaves its revision alone.
//   - Signals: a Suspend workflow is SUSPENDED (also in the status query)
//     after at least one step; a Signal returns a sequence > 0, not
//     duplicate, and resumes it (steps grows, then SUSPENDED again); the
//     steps query lists the sequence under "signals" of a step, and the
//     signals query lists it with delivered true and its signal_type. The
//     same idempotency_key again, with the same or other data, returns
//     duplicate true and the first sequence, and only one signal is
//     listed. Two signals without key are both new, the second's sequence
//     greater. Signalling a COMPLETED or CANCELED workflow is
//     FAILED_PRECONDITION.
//   - Query: "status" of a completed workflow has status "COMPLETED",
//     root_agent, steps and spent (a decimal string or number) agreeing
//     with GetWorkflow; "steps" lists one object per step, each with the
//     agent.
//   - CancelWorkflow: of a running Slow workflow (during its call, as far
//     as the steps query shows one) returns it CANCELED, and GetWorkflow
//     and the status query say CANCELED; cancelling it again returns it
//     unchanged (the same failure). A SUSPENDED workflow cancels too. The
//     reason given is in failure.message, of CancelWorkflow's answer and
//     of GetWorkflow, for a running and a suspended workflow. A COMPLETED
//     workflow is returned unchanged and stays COMPLETED.
//   - CallerGivesUp: a Dispatch of Slow with a 1s deadline fails
//     DEADLINE_EXCEEDED, one whose caller cancels after 1s fails CANCELED
//     (both as the client sees it), and each workflow then ends FAILED or
//     CANCELED within the wait bound, instead of running on.
//   - DispatchMany: five tasks, one of an unknown agent: five results in
//     task order (each response of its task's workflow_id), the unknown
//     agent's a NOT_FOUND error naming it, the others responses.
//   - ListWorkflows: with a running workflow and two completed ones
//     created after it: all three are listed newest first (completed,
//     completed, running) and the whole listing is in non-increasing
//     create_time; a status filter lists only that status and includes
//     the suite's workflows of that status; paging with page_size 1 (and
//     2 with a filter) lists every workflow once, pages never over
//     page_size. Listings are polled for up to the list wait (10s, or
//     Target.ListWait), for implementations whose listing is eventually
//     consistent.
//   - WatchWorkflow: a watch of the Answer agent's workflow from its start
//     (after_sequence 0) gets events of that workflow numbered 1, 2, ...
//     (workflow_sequence, no gap, no repeat), then the end, last, agreeing
//     with GetWorkflow (COMPLETED, steps, last_output); a workflow that has
//     already ended gets the same log and end, and the same again on a
//     second watch. A watch after a middle event's sequence gets exactly
//     the events after it (equal to the first watch's), one after the
//     last event only the end. While the Streamer's call runs, a watch
//     gets its progress from the call's start (agent_id, step >= 1,
//     dispatch_id, depth 0, index 1, the StreamerText delta), then, once
//     the workflow is cancelled, its events and the end (CANCELED); with
//     omit_progress a watch open during that call gets events and the end
//     but no progress. A watch of the Approver's workflow waiting for
//     approval stays open through DecideApprovals and ends with the
//     workflow COMPLETED. An unknown workflow is NOT_FOUND (naming it),
//     no workflow_id INVALID_ARGUMENT.
//   - GetTranscript: after an Answer Dispatch, one step: step 1, the
//     agent, a dispatch_id, depth 0, start and end times, no error, the
//     input's text and dispatch context of the workflow, and the output
//     Dispatch returned. A Suspend workflow resumed once by a signal has
//     steps 1 and 2, listed alike in one page and in pages of one
//     (next_page_token until the last), the second's input.resume set.
//     Unknown workflow NOT_FOUND (naming it); page_size -1 or 101 and a
//     page_token that is not one are INVALID_ARGUMENT. The transcript is
//     polled for up to the list wait.
//   - Approvals: the Approver's workflow is SUSPENDED with its two calls
//     in pending_approvals (tool_use_id and name, workflow_id, agent_id,
//     a step it made, request_time set); ListApprovals lists them with a
//     workflow_id filter (in one page and in pages of one) and among
//     every workflow's (polled for up to the list wait). ListApprovals page_size -1 or 1001 or a bad
//     page_token is INVALID_ARGUMENT. DecideApprovals with no decision,
//     one leaving call-2 undecided, one naming an unknown tool_use_id or
//     deciding call-1 twice is INVALID_ARGUMENT (naming the call) and
//     changes nothing; approving call-1 and rejecting call-2 returns a
//     sequence > 0, not duplicate; the same request again (at once and
//     after the workflow completed) returns duplicate true and that
//     sequence; the workflow then completes with "call-1=approved
//     call-2=rejected", after more steps, with no pending approval left
//     (in GetWorkflow and ListApprovals); deciding the calls differently
//     afterwards is FAILED_PRECONDITION. DecideApprovals of a COMPLETED
//     workflow, of the Suspend agent's workflow (SUSPENDED without tool
//     calls, whose pending_approvals is empty) and of a running Slow
//     workflow is FAILED_PRECONDITION; of an unknown workflow NOT_FOUND
//     (naming it).
//
// Budget changes of a running workflow (issue 21) have no checks yet.
//
// Waits for a workflow to reach a status poll GetWorkflow for up to 20s
// (Target.WaitTimeout); everything else is a single call bounded by 30s.
// Against an orchestrator on loopback the suite takes a few seconds,
// most of it in the waits of CallerGivesUp.
package orchestrator
