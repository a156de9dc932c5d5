package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/dlockio/dlock"
)

var scanTests = []test{
	{name: "Keys", run: testScanKeys},
	{name: "Stops", run: testScanStops},
	{name: "KilledConnections", run: testScanKilledConnections},
}

// scanner returns the driver's Scanner, or, for a driver without one,
// checks that List says so and skips the test.
func (e *env) scanner(t *testing.T) dlock.Scanner {
	t.Helper()
	drv := e.driver(t)
	sc, ok := drv.(dlock.Scanner)
	if !ok {
		if _, err := dlock.New(drv).List(timeout(t), ""); !errors.Is(err, dlock.ErrUnsupported) {
			t.Errorf("List with a driver that cannot SCAN: err = %v, want ErrUnsupported", err)
		}
		t.Skip("the driver has no Scanner")
	}
	return sc
}

// testScanKeys: Scan finds every key that matches, of the type asked for,
// on every primary, walking past many keys of another type.
func testScanKeys(t *testing.T, e *env) {
	sc := e.scanner(t)
	ctx := timeout(t)
	p := prefix(t)
	want := map[string]bool{}
	for _, srv := range e.primaries {
		tag := e.tagOn(t, srv)
		// More strings than one SCAN step looks at: the type filter must
		// drop them, and the walk go on past them.
		mset := []string{"MSET"}
		for i := range 2500 {
			mset = append(mset, fmt.Sprintf("%sk:{%s}:s%d", p, tag, i), "x")
		}
		srv.Do(t, mset...)
		for i := range 10 {
			key := fmt.Sprintf("%sk:{%s}:h%d", p, tag, i)
			srv.Do(t, "HSET", key, "f", "v")
			want[key] = true
		}
		srv.Do(t, "HSET", fmt.Sprintf("%sother:{%s}", p, tag), "f", "v")
	}
	got := map[string]bool{}
	var running atomic.Int32
	err := sc.Scan(ctx, p+"k:*", "hash", func(key string) error {
		if running.Add(1) > 1 {
			t.Error("fn was called from two goroutines at once")
		}
		defer running.Add(-1)
		got[key] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for key := range want {
		if !got[key] {
			t.Errorf("Scan missed %s", key)
		}
	}
	for key := range got {
		if !want[key] {
			t.Errorf("Scan found %s", key)
		}
	}
	err = sc.Scan(ctx, p+"none:*", "hash", func(key string) error {
		t.Errorf("fn called with %s, which does not match", key)
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// testScanStops: Scan stops at fn's first error and returns it, and fails
// with the context's error on an ended context.
func testScanStops(t *testing.T, e *env) {
	sc := e.scanner(t)
	p := prefix(t)
	for _, srv := range e.primaries {
		tag := e.tagOn(t, srv)
		for i := range 20 {
			srv.Do(t, "HSET", fmt.Sprintf("%s{%s}:%d", p, tag, i), "f", "v")
		}
	}
	stop := errors.New("stop here")
	calls := 0
	err := sc.Scan(timeout(t), p+"*", "hash", func(string) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) {
		t.Errorf("Scan returned %v, want fn's error", err)
	}
	if calls != 1 {
		t.Errorf("fn was called %d times, the first returned an error", calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = sc.Scan(ctx, p+"*", "hash", func(key string) error {
		t.Errorf("fn called with %s on an ended context", key)
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Scan on an ended context: %v, want context.Canceled", err)
	}
}

// testScanKilledConnections: a Scan after the servers closed every
// connection of the driver's (CLIENT KILL, or their idle timeout) finds the
// keys, round after round, as calls do (see testKilledConnections): List
// must not fail for a connection that had long gone.
func testScanKilledConnections(t *testing.T, e *env) {
	sc := e.scanner(t)
	ctx := timeout(t)
	p := prefix(t)
	want := map[string]bool{}
	for _, srv := range e.primaries {
		key := fmt.Sprintf("%sk:{%s}", p, e.tagOn(t, srv))
		srv.Do(t, "HSET", key, "f", "v")
		want[key] = true
	}
	for round := 1; round <= 3; round++ {
		got := 0
		err := sc.Scan(ctx, p+"k:*", "hash", func(key string) error {
			if want[key] {
				got++
			}
			return nil
		})
		if err != nil || got != len(want) {
			t.Errorf("round %d: Scan found %d of %d keys, err %v", round, got, len(want), err)
		}
		e.killClients(t)
	}
}
