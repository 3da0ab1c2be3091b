// Package environment implements layer0.environment.v1.EnvironmentService:
// it runs one operator invocation inside the isolation an EnvironmentSpec
// asks for. Only data crosses the boundary: a backend runs the operator
// binary in one-shot mode (OperatorInput on stdin, OperatorOutput on
// stdout) inside its isolation, and the server scrubs what comes back.
//
// Backends live in subpackages: local (forwards to an operator service,
// no isolation), process (a confined process per invocation), docker (a
// container through the Docker engine API) and kubernetes (a Job per
// invocation). A spec a backend cannot enforce is refused with
// FAILED_PRECONDITION naming what is missing, never weakened.
package environment
