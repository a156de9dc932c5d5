package dlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// TestAClientNotMadeByNewPanics: every method of the zero Client, and of an
// RWMutex or Semaphore that its constructor did not make, panics at once
// with a message that says so, instead of waiting for ever for a request
// to be sent or failing deep inside; so does Close of a nil *Client.
func TestAClientNotMadeByNewPanics(t *testing.T) {
	// Bounded, should a call wait instead of panicking (a call without a
	// deadline then waits for ever).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var c dlock.Client
	var nilClient *dlock.Client
	var m dlock.RWMutex
	var s dlock.Semaphore
	for _, tc := range []struct {
		name string
		call func()
		want string
	}{
		{"TryLock", func() { _, _ = c.TryLock(ctx, "x") }, "Client used without New"},
		{"TryLock, no deadline", func() { _, _ = c.TryLock(context.Background(), "x") }, "Client used without New"},
		{"Lock", func() { _, _ = c.Lock(ctx, "x") }, "Client used without New"},
		{"TryLockMulti", func() { _, _ = c.TryLockMulti(ctx, []string{"x", "y"}) }, "Client used without New"},
		{"LockMulti", func() { _, _ = c.LockMulti(ctx, []string{"x", "y"}) }, "Client used without New"},
		{"Lock, auto-refreshed", func() { _, _ = c.Lock(ctx, "x", dlock.WithAutoRefresh()) }, "Client used without New"},
		{"Do", func() { _ = c.Do(ctx, "x", func(context.Context) error { return nil }) }, "Client used without New"},
		{"Attach", func() { _, _ = c.Attach(ctx, "x", "token") }, "Client used without New"},
		{"Inspect", func() { _, _ = c.Inspect(ctx, "x") }, "Client used without New"},
		{"ForceRelease", func() { _, _ = c.ForceRelease(ctx, "x") }, "Client used without New"},
		{"List", func() { _, _ = c.List(ctx, "*") }, "Client used without New"},
		{"SetFenced", func() { _ = c.SetFenced(ctx, "x", 1, "v") }, "Client used without New"},
		{"Prepare", func() { _ = c.Prepare(ctx) }, "Client used without New"},
		{"RWMutex", func() { c.RWMutex("x") }, "Client used without New"},
		{"Semaphore", func() { c.Semaphore("x", 1) }, "Client used without New"},
		{"Prefix", func() { c.Prefix() }, "Client used without New"},
		{"RedisKey", func() { c.RedisKey("x") }, "Client used without New"},
		{"Close", func() { _ = c.Close() }, "Client used without New"},
		{"Close of a nil *Client", func() { _ = nilClient.Close() }, "nil *Client"},
		{"TryLock of a nil *Client", func() { _, _ = nilClient.TryLock(ctx, "x") }, "nil *Client"},
		{"zero RWMutex: RLock", func() { _, _ = m.RLock(ctx) }, "RWMutex used without Client.RWMutex"},
		{"zero RWMutex: TryRLock", func() { _, _ = m.TryRLock(ctx) }, "RWMutex used without Client.RWMutex"},
		{"zero RWMutex: Lock", func() { _, _ = m.Lock(ctx) }, "RWMutex used without Client.RWMutex"},
		{"zero RWMutex: TryLock", func() { _, _ = m.TryLock(ctx) }, "RWMutex used without Client.RWMutex"},
		{"zero Semaphore: Acquire", func() { _, _ = s.Acquire(ctx) }, "Semaphore used without Client.Semaphore"},
		{"zero Semaphore: TryAcquire", func() { _, _ = s.TryAcquire(ctx) }, "Semaphore used without Client.Semaphore"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := func() (p any) {
				defer func() { p = recover() }()
				tc.call()
				return nil
			}()
			msg, _ := p.(string)
			if !strings.HasPrefix(msg, "dlock: ") || !strings.Contains(msg, tc.want) {
				t.Errorf("panic = %v, want a \"dlock: \" message saying %q", p, tc.want)
			}
		})
	}
}
