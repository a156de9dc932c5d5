//go:build linux

package main

import "syscall"

// setParentDeathSignal has the command sent SIGTERM if dlock dies (say, of
// SIGKILL) while it runs: the lock then expires unrefreshed, and the
// command must not carry on unprotected.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGTERM }
