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
func killGroup(pid int) {
	if pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}
