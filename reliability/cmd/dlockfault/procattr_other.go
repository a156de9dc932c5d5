//go:build unix && !linux

package main

import "syscall"

func serverProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
func workerProcAttr() *syscall.SysProcAttr { return nil }
func killGroup(pid int) {
	if pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}
