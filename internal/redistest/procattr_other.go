//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns the attributes for a started server. Pdeathsig is
// Linux-only, so elsewhere a server outlives a test binary that crashes.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}

// killGroup does nothing: outside Linux servers do not get their own
// process group.
func killGroup(pid int) {}
