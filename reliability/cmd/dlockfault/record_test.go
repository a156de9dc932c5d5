package main

import (
	"testing"

	"github.com/dlockio/dlock"
)

// The record tells dlock's scripts apart by their SHA1, or by their
// function's name (FCALL, under -functions), whatever arguments the client
// sends: an acquire of a given token, a Release and a clean-up are seen,
// and the free hash a clean-up makes for a name it found empty is not
// taken for a release.
func TestTheRecordSeesAcquiresReleasesAndCleanups(t *testing.T) {
	for _, fcall := range []bool{false, true} {
		t.Run(map[bool]string{false: "EVALSHA", true: "FCALL"}[fcall], func(t *testing.T) { testRecord(t, fcall) })
	}
}

func testRecord(t *testing.T, fcall bool) {
	keys := []string{"dlock:{a}", "dlock:{a}:waiters", "dlock:{a}:fence"}
	sha, fn := map[string]string{}, map[string]string{}
	for _, sc := range dlock.Scripts() {
		sha[sc.Name], fn[sc.Name] = sc.SHA1, sc.Function
	}
	eval := func(script string, args ...string) []string {
		if fcall {
			return append(append([]string{"FCALL", fn[script], "3"}, keys...), args...)
		}
		return append(append([]string{"EVALSHA", sha[script], "3"}, keys...), args...)
	}
	rec := newServerRecord()
	rec.handle(eval("acquire", "tok", "30000", "", "", "", "0", "1500", "", "", "1"), false)
	rec.handle([]string{"HSET", "dlock:{a}", "kind", "lock", "token", "tok", "fence", "5"}, true)
	rec.handle(eval("release", "tok", "", "", "", "", ""), false) // the clean-up
	rec.handle([]string{"HSET", "dlock:{a}", "token", "", "req", "", "rel", ""}, true)
	if !rec.deletedBy("tok") {
		t.Error("the record missed the clean-up's release")
	}
	rec.handle(eval("acquire", "tok2", "30000", "", ""), false)
	rec.handle([]string{"HSET", "dlock:{a}", "token", "tok2", "fence", "6"}, true)
	rec.handle(eval("release", "tok2", "17", "", "", "", "1", "tok2"), false) // a Release
	rec.handle([]string{"HSET", "dlock:{a}", "token", "", "req", "", "rel", "17 tok2"}, true)
	if !rec.deletedBy("tok2") {
		t.Error("the record missed the Release")
	}
	rec.handle(eval("release", "tok3", "", "", "", "", "1"), false) // a clean-up that found nothing
	rec.handle([]string{"HSET", "dlock:{a}", "kind", "lock", "token", "", "req", "", "rel", "tok3"}, true)
	if rec.deletedBy("tok3") {
		t.Error("the free hash of a clean-up that found nothing was taken for a release")
	}
}
