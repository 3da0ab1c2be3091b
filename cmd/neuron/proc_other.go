//go:build !linux

package main

import (
	"os"
	"syscall"
)

// childProcAttr: no process group or parent-death signal outside Linux.
func childProcAttr() *syscall.SysProcAttr { return nil }

// terminate asks the process to stop gracefully.
func terminate(p *os.Process) { _ = p.Signal(syscall.SIGTERM) }

// kill kills the process.
func kill(p *os.Process) { _ = p.Kill() }

// endedBySIGTERM: not distinguishable outside Linux.
func endedBySIGTERM(error) bool { return false }
