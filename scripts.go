package dlock

import (
	"embed"
	"slices"
	"strings"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// The scripts dlock runs on the server, one per operation. Helpers shared by
// several scripts live in files of their own (held.lua, fence.lua, …) and
// are put in front of the scripts that use them, in the order of
// helperFiles; replies.lua, which every script uses (see foreign), goes
// first in each.
var (
	scriptAcquire = loadScript("acquire", "wake", "fence", "held")
	scriptRelease = loadScript("release", "wake", "fence", "held", "grant")
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

// helperFiles are the helper files, in the order in which a script that
// uses several has them, and in which the function library defines them
// all (see newLibrary): a helper may use those of the files before its
// own.
var helperFiles = []string{"replies", "wake", "holds", "describe", "fence", "fenced", "held", "grant"}

// loadScript builds a script from scripts/name.lua, preceded by
// scripts/replies.lua and the named helper files, which must come in the
// order of helperFiles.
func loadScript(name string, helpers ...string) *Script {
	var b strings.Builder
	helpers = append([]string{"replies"}, helpers...)
	at := 0
	for _, f := range helpers {
		i := slices.Index(helperFiles[at:], f)
		if i < 0 {
			panic("dlock: script " + name + " lists helper " + f + " out of helperFiles' order") // a broken build
		}
		at += i + 1
		b.WriteString(scriptFile(f))
	}
	body := scriptFile(name)
	b.WriteString(body)
	s := NewScript(name, b.String())
	s.body = body
	return s
}

// scriptFile returns the source of scripts/name.lua.
func scriptFile(name string) string {
	src, err := scriptFiles.ReadFile("scripts/" + name + ".lua")
	if err != nil {
		panic("dlock: missing embedded script " + name) // a broken build, not a runtime condition
	}
	return string(src)
}
