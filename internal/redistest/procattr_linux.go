//go:build linux

package redistest

import "syscall"

// sysProcAttr puts a started server in its own process group, so that its
// fork children (BGSAVE, replication) can be killed with it, and makes it die
// with the test binary.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup sends SIGKILL to the process group that the server with pid
// leads, which holds only that server and its fork children.
func killGroup(pid int) { signalGroup(pid, syscall.SIGKILL) }

// signalGroup sends sig to the process group of the server whose PID is
// pid; it must be called while the server is unreaped, so that the group
// ID is still ours.
func signalGroup(pid int, sig syscall.Signal) {
	if pid > 0 {
		_ = syscall.Kill(-pid, sig)
	}
}
