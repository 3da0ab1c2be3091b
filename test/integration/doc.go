// Package integration holds the system's end-to-end tests: the real
// services, as processes or as containers, wired together the way they
// are deployed, and driven through their public gRPC APIs.
//
//   - containers_test.go builds the state, operator and orchestrator
//     images from their Dockerfiles on a private Docker engine
//     (testenv.Docker), runs them on a private network, and runs a
//     workflow whose scripted model writes memory through the
//     orchestrator's published port; the State service's published port
//     must then hold the value.
//   - swap_test.go runs the same workflow against the services as
//     processes, then replaces the State service under the running
//     operator and orchestrator with other implementations on the same
//     address (the memory backend, then a small Python StateService in
//     testdata/pystate) and runs it again, with the state conformance
//     suite against each replacement.
//
// Each test skips, with the reason, when what it needs (dockerd, root,
// Python's grpcio) is missing. Nothing here is used outside tests.
package integration
