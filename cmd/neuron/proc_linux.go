package main

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// childProcAttr puts a child in its own process group, so that a Ctrl-C
// on the terminal reaches neuron only and neuron stops the services in
// order, and asks the kernel to send it SIGTERM should neuron die first.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// terminate asks the process to stop gracefully.
func terminate(p *os.Process) { _ = p.Signal(syscall.SIGTERM) }

// kill kills the process and everything left in its process group.
func kill(p *os.Process) {
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	_ = p.Kill()
}

// endedBySIGTERM reports whether a child's Wait error says SIGTERM ended
// it before it could handle the signal (it was still starting).
func endedBySIGTERM(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}
