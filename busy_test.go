package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// Tests of requests that a server refuses before they run, for a while:
// busy with another client's script (BUSY), or short of replicas
// (NOREPLICAS). A release is sent again until the refusal passes, within
// its bound, and a clean-up in the background, so that nothing is left
// held for its TTL.

// TestAReleaseRefusedByABusyServerIsSentAgain: a Release that meets BUSY
// goes again once the script is over, and frees the name.
func TestAReleaseRefusedByABusyServerIsSentAgain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "busy", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// The script ends once the Release and the copy sent at once after it
	// were refused.
	kill := e.srv.Busy(t)
	e.drv.runAfterNext(func() { e.drv.runAfterNext(kill) })
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release refused by a busy server, then sent again: %v", err)
	}
	if e.locked(t, "dlock:{busy}") {
		t.Error("the name is still held after Release")
	}
}

// TestAReleaseRefusedForWantOfReplicasIsSentAgain: as above, for a primary
// that refuses writes while it has fewer replicas than min-replicas-to-write.
func TestAReleaseRefusedForWantOfReplicasIsSentAgain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "replicas", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "CONFIG", "SET", "min-replicas-to-write", "1")
	e.drv.runAfterNext(func() {
		e.drv.runAfterNext(func() { e.srv.Do(t, "CONFIG", "SET", "min-replicas-to-write", "0") })
	})
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release refused for want of replicas, then sent again: %v", err)
	}
	if e.locked(t, "dlock:{replicas}") {
		t.Error("the name is still held after Release")
	}
}

// TestAWriterThatGivesUpOnABusyServerLeavesNoPendingRecord: a waiting
// writer whose wait ends while the server is busy cleans up once it is
// not: its pending-writer record does not keep readers out until its TTL.
func TestAWriterThatGivesUpOnABusyServerLeavesNoPendingRecord(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.RWMutex("pw").TryRLock(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	writer := e.newClient(t)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := whenRefused(t, "a writer's Lock", func(opts ...dlock.Option) (*dlock.Lock, error) {
		return writer.RWMutex("pw").Lock(wctx, append(opts, dlock.WithTTL(time.Minute))...)
	})
	kill := e.srv.Busy(t)
	cancel()
	if r := <-got; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the writer's Lock = %v, want context.Canceled", r.err)
	}
	kill()
	reader := e.newClient(t)
	awaitCond(t, 3*time.Second, func() bool {
		r, err := reader.RWMutex("pw").TryRLock(ctx)
		if err == nil {
			_ = r.Release(ctx)
		}
		return err == nil
	})
}
