//go:build unix

package main

import (
	"errors"
	"os"
	"syscall"
)

// forwarded are the signals run passes on to its command.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// brokenPipe is the signal of a write to a pipe whose reader is gone.
var brokenPipe = []os.Signal{syscall.SIGPIPE}

// stopsWait reports whether sig, received while run waits for the lock,
// makes it give up.
func stopsWait(sig os.Signal) bool {
	return sig == syscall.SIGINT || sig == syscall.SIGTERM || sig == syscall.SIGHUP || sig == syscall.SIGQUIT
}

// fromTerminal reports whether sig is one a terminal sends to its whole
// foreground process group (Ctrl-C, Ctrl-\).
func fromTerminal(sig os.Signal) bool {
	return sig == syscall.SIGINT || sig == syscall.SIGQUIT
}

// hasControllingTerminal reports whether dlock runs with a controlling
// terminal, as from an interactive shell; not under cron, systemd or ssh
// without a tty.
func hasControllingTerminal() bool {
	f, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	_ = f.Close()
	return true
}

// childAttr starts the command in a process group of its own when ownGroup
// is set, so that signals (and SIGKILL after --grace) reach every process
// it started; and, where the system allows, has it sent SIGTERM if dlock
// dies first.
func childAttr(ownGroup bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: ownGroup}
	setParentDeathSignal(a)
	return a
}

// signalChild sends sig to the command, or to its whole process group.
func signalChild(p *os.Process, ownGroup bool, sig os.Signal) error {
	if ownGroup {
		if s, ok := sig.(syscall.Signal); ok {
			return syscall.Kill(-p.Pid, s)
		}
	}
	return p.Signal(sig)
}

// groupAlive reports whether the process group pgid still has a process.
func groupAlive(pgid int) bool {
	return !errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

// processGone reports whether process pid is gone: exited and reaped.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// killSignal and termSignal are what run sends when the lock is lost.
var (
	termSignal os.Signal = syscall.SIGTERM
	killSignal os.Signal = syscall.SIGKILL
)
