// Package testenv starts real servers for tests of other packages: a
// private Docker engine (Docker), a kube-apiserver with its etcd
// (KubeAPIServer), and static binaries of this module's commands for
// images (BuildStatic).
//
// Each helper takes the calling test, registers cleanups that stop what it
// started and remove its data, and skips the test, saying what to
// install, when a program it needs is missing. Nothing here is used
// outside tests.
package testenv
