package dlock_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

func TestInspect(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	info, err := e.c.Inspect(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != dlock.KindNone || len(info.Holders) != 0 {
		t.Errorf("free name: %+v", info)
	}
	before := time.Now().Add(-time.Second)
	l, err := e.c.TryLock(ctx, "report", dlock.WithTTL(time.Minute), dlock.WithMetadata("host=a pid=7"), dlock.WithOwner("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.TryLock(ctx, "report", dlock.WithOwner("job-1"), dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	info, err = e.c.Inspect(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != dlock.KindLock || info.Name != "report" || len(info.Holders) != 1 || info.Fence != l.Fence() {
		t.Fatalf("info = %+v", info)
	}
	h := info.Holders[0]
	if h.Owner != "job-1" || h.Metadata != "host=a pid=7" || h.Count != 2 || h.Fence != l.Fence() ||
		h.TTL <= 50*time.Second || h.Since.Before(before) || h.Since.After(time.Now().Add(time.Second)) {
		t.Errorf("holder = %+v", h)
	}
	e.srv.Do(t, "SET", "dlock:{data}", "x")
	if _, err := e.c.Inspect(ctx, "data"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("Inspect of other data: err = %v, want ErrWrongType", err)
	}
	if _, err := e.c.Inspect(ctx, ""); !errors.Is(err, dlock.ErrEmptyKey) {
		t.Errorf("empty name: err = %v", err)
	}
}

func TestForceRelease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "stuck", dlock.WithTTL(time.Minute), dlock.WithMetadata("who"),
		dlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	admin := e.newClient(t)
	was, err := admin.ForceRelease(ctx, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	if was.Kind != dlock.KindLock || len(was.Holders) != 1 || was.Holders[0].Metadata != "who" {
		t.Errorf("removed = %+v", was)
	}
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("holder's Err = %v, want ErrLost", l.Err())
	}
	next, err := admin.TryLock(ctx, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence() <= l.Fence() {
		t.Errorf("fence after a force release: %d, before %d", next.Fence(), l.Fence())
	}
	if was, err := admin.ForceRelease(ctx, "free-name"); err != nil || was.Kind != dlock.KindNone {
		t.Errorf("force release of a free name = %+v, %v", was, err)
	}
	e.srv.Do(t, "RPUSH", "dlock:{list}", "x")
	if _, err := admin.ForceRelease(ctx, "list"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("force release of other data: err = %v, want ErrWrongType", err)
	}
	if e.srv.Do(t, "LLEN", "dlock:{list}") != "1" {
		t.Error("other data touched")
	}
}

func TestList(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, name := range []string{"jobs:nightly", "jobs:hourly", "orders:1", "{acct:9}:pay"} {
		if _, err := e.c.TryLock(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	e.srv.Do(t, "HSET", "dlock:{foreign}", "a", "b") // a hash dlock did not write
	l, _ := e.c.TryLock(ctx, "released")
	_ = l.Release(ctx) // leaves only its fence counter
	for pattern, want := range map[string][]string{
		"":       {"jobs:hourly", "jobs:nightly", "orders:1", "{acct:9}:pay"},
		"jobs:*": {"jobs:hourly", "jobs:nightly"},
		"*:?":    {"orders:1"},
		"{acct*": {"{acct:9}:pay"},
		"none*":  nil,
	} {
		infos, err := e.c.List(ctx, pattern)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, info := range infos {
			if info.Kind != dlock.KindLock || len(info.Holders) != 1 {
				t.Errorf("%s: %+v", info.Name, info)
			}
			got = append(got, info.Name)
		}
		if len(got) != len(want) || (len(got) > 0 && !slices.Equal(got, want)) {
			t.Errorf("List(%q) = %v, want %v", pattern, got, want)
		}
	}
}
