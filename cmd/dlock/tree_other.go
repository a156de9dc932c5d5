//go:build !linux

package main

import "os"

// listProcs cannot list processes here: a tree stays empty.
func listProcs() map[int]procInfo { return nil }

func procStat(int) (procInfo, bool) { return procInfo{}, false }

// adoptOrphans cannot adopt orphans here.
func adoptOrphans() (<-chan os.Signal, func()) { return nil, func() {} }

func reapOrphans(int) {}

// ownProcessGroup is not needed here: dlock adopts no orphans.
func ownProcessGroup() int { return 0 }
