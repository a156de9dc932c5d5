package dlock

import (
	"embed"
	"strings"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// The scripts dlock runs on the server, one per operation. Helpers shared by
// several scripts live in files of their own (held.lua, fence.lua, …) and
// are put in front of the scripts that use them; replies.lua, which every
// script uses (see foreign), goes first in each.
var (
	scriptAcquire = loadScript("acquire", "wake", "fence", "held")
	scriptRelease = loadScript("release", "held", "wake", "fence", "grant")
	scriptRefresh = loadScript("refresh", "held")
	scriptTTL     = loadScript("ttl", "held")

	// Read/write locks and semaphores: each has its acquire, and they
	// share the scripts on a hold taken.
	scriptRWAcquire    = loadScript("rw_acquire", "wake", "holds", "fence")
	scriptSemAcquire   = loadScript("sem_acquire", "wake", "holds")
	scriptHoldsRelease = loadScript("holds_release", "wake", "holds")
	scriptHoldsRefresh = loadScript("holds_refresh", "wake", "holds")
	scriptHoldsTTL     = loadScript("holds_ttl", "wake", "holds")

	scriptFencedSet    = loadScript("fenced_set", "fenced")
	scriptFencedGet    = loadScript("fenced_get", "fenced")
	scriptInspect      = loadScript("inspect", "wake", "holds", "describe")
	scriptForceRelease = loadScript("force_release", "wake", "holds", "describe", "held")
	scriptUnwait       = loadScript("unwait", "wake")
)

// Scripts returns every script dlock runs, for drivers that preload them
// (SCRIPT LOAD) and for tests.
func Scripts() []*Script {
	return []*Script{scriptAcquire, scriptRelease, scriptRefresh, scriptTTL,
		scriptRWAcquire, scriptSemAcquire, scriptHoldsRelease, scriptHoldsRefresh, scriptHoldsTTL,
		scriptFencedSet, scriptFencedGet, scriptInspect, scriptForceRelease, scriptUnwait}
}

// loadScript builds a script from scripts/name.lua, preceded by
// scripts/replies.lua and the named helper files.
func loadScript(name string, helpers ...string) *Script {
	var b strings.Builder
	for _, f := range append(append([]string{"replies"}, helpers...), name) {
		src, err := scriptFiles.ReadFile("scripts/" + f + ".lua")
		if err != nil {
			panic("dlock: missing embedded script " + f) // a broken build, not a runtime condition
		}
		b.Write(src)
	}
	return NewScript(name, b.String())
}
