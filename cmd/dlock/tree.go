package main

import "os"

// procID names a process across PID reuse: its PID and its start time.
type procID struct {
	pid   int
	start uint64
}

// procInfo is what the system says of a running process.
type procInfo struct {
	ppid   int
	start  uint64
	zombie bool // exited, waiting for its parent to reap it
}

// tree is the processes run stops when the lock is lost while the command
// shares dlock's process group (at a terminal): the command's descendants,
// which a signal to the command alone would leave running. It remembers
// them, so that those its parent left behind by exiting are still found.
// Where the system does not list processes (not Linux), it stays empty.
type tree struct{ known []procID }

// grow adds the live descendants of roots, and of the processes the tree
// knows, and drops those that ended.
func (t *tree) grow(roots ...int) {
	procs := listProcs()
	if procs == nil {
		return
	}
	children := map[int][]procID{}
	for pid, p := range procs {
		if !p.zombie {
			children[p.ppid] = append(children[p.ppid], procID{pid, p.start})
		}
	}
	seen := map[int]bool{}
	var next []procID
	var visit func(pid int)
	visit = func(pid int) {
		for _, c := range children[pid] {
			if !seen[c.pid] {
				seen[c.pid] = true
				next = append(next, c)
				visit(c.pid)
			}
		}
	}
	for _, pid := range roots {
		visit(pid)
	}
	for _, k := range t.known {
		if p, ok := procs[k.pid]; ok && !p.zombie && p.start == k.start && !seen[k.pid] {
			seen[k.pid] = true
			next = append(next, k)
			visit(k.pid)
		}
	}
	t.known = next
}

// signal sends sig to every process of the tree that still runs.
func (t *tree) signal(sig os.Signal) {
	for _, k := range t.known {
		if !k.alive() {
			continue
		}
		if p, err := os.FindProcess(k.pid); err == nil {
			_ = p.Signal(sig)
			_ = p.Release()
		}
	}
}

// alive reports whether a process of the tree still runs.
func (t *tree) alive() bool {
	for _, k := range t.known {
		if k.alive() {
			return true
		}
	}
	return false
}

// alive reports whether the process still runs: the PID was not reused,
// and the process has not exited.
func (k procID) alive() bool {
	p, ok := procStat(k.pid)
	return ok && !p.zombie && p.start == k.start
}
