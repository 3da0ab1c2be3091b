// Package testenv starts real servers for tests of other packages: a
// private Docker engine (Docker), a kube-apiserver with its etcd
// (KubeAPIServer), PostgreSQL (Postgres), a Temporal dev server
// (Temporal), and static binaries of this module's commands for
// images (BuildStatic); it also generates the Python gRPC stubs of the
// protos (PythonStubs), returning what is missing instead of skipping, so
// a test can go on with its other languages.
//
// Each helper takes the calling test, registers cleanups that stop what it
// started and remove its data, and skips the test, saying what to
// install, when a program it needs is missing. Nothing here is used
// outside tests.
package testenv
