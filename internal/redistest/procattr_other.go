//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns the attributes for a started server. Pdeathsig is
// Linux-only, so elsewhere a server outlives a test binary that crashes.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}

// killGroup and signalGroup do nothing: outside Linux servers do not get
// their own process group.
func killGroup(pid int) {}

func signalGroup(pid int, sig syscall.Signal) {}
