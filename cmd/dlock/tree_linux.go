//go:build linux

package main

import (
	"os"
	"strconv"
	"strings"
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
	// hold anything: state, ppid, … and starttime, the 22nd field of all.
	end := strings.LastIndexByte(string(stat), ')')
	if end < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(string(stat[end+1:]))
	if len(f) < 20 {
		return procInfo{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return procInfo{}, false
	}
	return procInfo{ppid: ppid, start: start, zombie: f[0] == "Z" || f[0] == "X"}, true
}
