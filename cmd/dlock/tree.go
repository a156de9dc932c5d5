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
	pgrp   int
	start  uint64
	zombie bool // exited, waiting for its parent to reap it
}

// tree is the processes the command started, which run stops with the
// command when the lock is lost, beyond what a signal to the command (or
// its process group) reaches: at a terminal, where the command shares
// dlock's group, all of them; without one, those that left its group (a
// setsid, a timeout). It remembers them, so that those whose parent exits
// are still found; on Linux dlock also adopts the orphans of the command's
// tree (see adoptOrphans), so that those left before the loss are found
// too. Where the system does not list processes (not Linux), it stays
// empty.
type tree struct {
	cmd   int  // the command's PID, signalled on its own
	group bool // the command leads a process group, signalled as a whole
	known []procID
	// others are the processes that descended from dlock before the
	// command started (a wrapper may have started dlock's process with
	// children of its own, then exec'd it), and those seen descending from
	// them since: never the command's.
	others map[procID]bool
	// self, selfGroup and since judge the children dlock adopted (see
	// adopted); self is 0 when it adopts none.
	self, selfGroup int
	since           uint64 // the command's start time
}

// exclude records the processes that descend from root (dlock) now, before
// the command starts, as not the command's.
func (t *tree) exclude(root int) {
	before := tree{}
	before.grow(root)
	t.others = make(map[procID]bool, len(before.known))
	for _, k := range before.known {
		t.others[k] = true
	}
}

// adopted reports whether a child of dlock other than the command, p,
// counts as the command's: an orphan of its tree that dlock adopted. Its
// parent is gone, so its ancestry is guessed: it must have started after
// the command, and, when the command leads a group of its own, not be in
// dlock's group, where the processes of a wrapper that exec'd dlock stay
// and the command's do not (they are in the command's group, or left it
// for one of their own). At a terminal, where the command shares dlock's
// group, an orphan a wrapper's process left after the command started is
// taken for the command's.
func (t *tree) adopted(p procInfo) bool {
	return p.start >= t.since && !(t.group && p.pgrp == t.selfGroup)
}

// grow adds the live descendants of root (the command, or dlock when it
// adopts orphans), and of the processes the tree knows, and drops those
// that ended.
func (t *tree) grow(root int) {
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
			if seen[c.pid] {
				continue
			}
			seen[c.pid] = true
			if t.others[c] {
				t.disown(c.pid, children)
				continue
			}
			if pid == t.self && t.self != 0 && c.pid != t.cmd && !t.adopted(procs[c.pid]) {
				continue
			}
			next = append(next, c)
			visit(c.pid)
		}
	}
	if root > 0 {
		visit(root)
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

// disown records the descendants of pid, one of others, as others too.
func (t *tree) disown(pid int, children map[int][]procID) {
	for _, c := range children[pid] {
		if !t.others[c] {
			t.others[c] = true
			t.disown(c.pid, children)
		}
	}
}

// signal sends sig to every process of the tree that still runs, but the
// command, and, when the command leads a group, the processes of that
// group: those get it from the command's own signal.
func (t *tree) signal(sig os.Signal) {
	for _, k := range t.known {
		if k.pid == t.cmd {
			continue
		}
		p, err := os.FindProcess(k.pid) // on Linux a handle that outlives a reuse of the PID
		if err != nil {
			continue
		}
		if info, ok := procStat(k.pid); ok && !info.zombie && info.start == k.start && !(t.group && info.pgrp == t.cmd) {
			_ = p.Signal(sig)
		}
		_ = p.Release()
	}
}

// alive reports whether a process of the tree, the command aside, still
// runs.
func (t *tree) alive() bool {
	for _, k := range t.known {
		if k.pid != t.cmd && k.alive() {
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
