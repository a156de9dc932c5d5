//go:build linux

package main

import "syscall"

// serverProcAttr puts a started server in its own process group, so that
// its fork children can be killed with it, and makes it die with this
// program.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// workerProcAttr makes a worker process die with this program.
func workerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// killGroup sends SIGKILL to the process group that the server with pid
// leads.
func killGroup(pid int) {
	if pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}
