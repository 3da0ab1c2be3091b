// Command neuron is the user's command line for the layer0 agent
// services.
//
//	neuron up [flags]                    start state, operator, environment and orchestrator
//	neuron run AGENT TASK... [flags]     dispatch an agent and stream its progress
//	neuron agents apply|diff|list|get|delete  define, change and remove agents
//	neuron chat AGENT [--session S]      an interactive conversation
//	neuron workflows list|show|watch|signal|cancel
//	neuron approvals list                tool calls waiting for approval
//	neuron approve WORKFLOW [flags]      approve or reject them
//	neuron state get|put|delete|list|search
//	neuron events [flags]                tail lifecycle events
//
// `neuron up` starts the four service binaries (found beside neuron, as
// `make build` puts them in bin/) as child processes in dev mode, each a
// real gRPC server on its own port with its data under --data-dir, defines
// the demo agents when they are not defined (from <data-dir>/demo-agents.yaml), and stops
// them all on Ctrl-C or SIGTERM. With --demo it then runs the sample
// workflow and keeps serving; with --demo-exit it stops afterwards.
//
// Every other command is a gRPC client of one service: run, workflows and
// events talk to the orchestrator (--addr, default 127.0.0.1:7070), state
// to the State service (--addr, default 127.0.0.1:7072). They print plain
// lines, a live progress display when stdout is a terminal (run), or one
// protojson object per line with --json.
//
// Errors are one line, `neuron: <gRPC code>: <message>` followed by what
// to do. Exit codes:
//
//	0     success
//	1     error (a service failed to start or died, a file could not be written, ...)
//	2     usage error (bad flags or arguments)
//	3     the workflow ended without completing (its exit kind is not COMPLETE)
//	4     the workflow waits for approval of tool calls (neuron approve)
//	10+N  the service answered with gRPC status code N, e.g. 15 NOT_FOUND, 24 UNAVAILABLE
//
// (the same scheme as the operator's --one-shot mode).
package main
