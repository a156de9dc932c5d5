//go:build linux

package main

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

// listProcs returns every process the system lists in /proc, by PID; nil if
// /proc cannot be read.
func listProcs() map[int]procInfo {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	procs := make(map[int]procInfo, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := procStat(pid); ok {
			procs[pid] = p
		}
	}
	return procs
}

// procStat reads a process's parent, start time and state from
// /proc/PID/stat; ok is false if it is gone.
func procStat(pid int) (procInfo, bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	// The fields after the command's name, which is in parentheses and may
	// hold anything: state, ppid, pgrp, … and starttime, the 22nd field of all.
	end := strings.LastIndexByte(string(stat), ')')
	if end < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(string(stat[end+1:]))
	if len(f) < 20 {
		return procInfo{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err2 := strconv.Atoi(f[2])
	start, err3 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return procInfo{}, false
	}
	return procInfo{ppid: ppid, pgrp: pgrp, start: start, zombie: f[0] == "Z" || f[0] == "X"}, true
}

// prSetChildSubreaper is prctl's PR_SET_CHILD_SUBREAPER (Linux 3.4).
const prSetChildSubreaper = 36

// adoptOrphans makes dlock a child subreaper: the processes of the
// command's tree whose parent exits become dlock's children instead of
// init's, so that a tree grown from dlock finds them. It returns a channel
// that says when such a child may have exited, for reapOrphans, and a
// function that stops it; a nil channel when the system refuses.
func adoptOrphans() (<-chan os.Signal, func()) {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return nil, func() {}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	return ch, func() { signal.Stop(ch) }
}

// reapOrphans reaps the adopted children that exited, but not the command,
// pid, whose own Wait reaps it.
func reapOrphans(pid int) {
	self := os.Getpid()
	for child, p := range listProcs() {
		if p.ppid == self && p.zombie && child != pid {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(child, &ws, syscall.WNOHANG, nil)
		}
	}
}

// ownProcessGroup returns dlock's process group.
func ownProcessGroup() int { return syscall.Getpgrp() }
