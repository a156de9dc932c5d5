package main

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// TestAnOutageIsCountedFromTheLastAnswer: run gives up its wait once
// Redis has not answered for unreachableWait since an attempt last found
// the lock held (or the wait began), not since the first failure it heard
// of, which comes a read timeout or more into the outage.
func TestAnOutageIsCountedFromTheLastAnswer(t *testing.T) {
	timeout := context.DeadlineExceeded
	for _, tc := range []struct {
		name     string
		answered time.Duration // ago
		gaveUp   bool
	}{
		{"recent answer", time.Second, false},
		{"answer long ago", unreachableWait + time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cause error
			w := &waiter{begun: make(chan struct{}), answered: time.Now().Add(-tc.answered),
				cancel: func(err error) { cause = err }}
			w.onRetry(1, errors.New("i/o timeout"))
			var down redisDown
			if got := errors.As(cause, &down); got != tc.gaveUp {
				t.Fatalf("first failure %v after the last answer: gave up %v (cause %v), want %v", tc.answered, got, cause, tc.gaveUp)
			}
			if tc.gaveUp {
				return
			}
			w.onRetry(2, timeout) // cut short by the wait's end: counts for nothing
			if cause != nil {
				t.Fatalf("gave up on an attempt cut short: %v", cause)
			}
		})
	}
}

// A release can grant the lock to the wait before the wait hears of it
// (without pub/sub notices, at its next attempt): the waiting line does not
// name the wait's own hold as the holder it waits for.
func TestTheWaitingLineDoesNotNameItsOwnHold(t *testing.T) {
	w := &waiter{name: "job", self: `{"pid":7}`}
	own := &dlock.Info{Holders: []dlock.Holder{{Metadata: `{"pid":7}`, Fence: 9}}}
	if line, key := w.heldLine(own); key != "free" || !strings.Contains(line, "just released") {
		t.Errorf("with its own hold: %q (key %q), want the lock just released", line, key)
	}
	other := &dlock.Info{Holders: []dlock.Holder{{Metadata: `{"pid":8}`, Fence: 9}}}
	if _, key := w.heldLine(other); key == "free" {
		t.Error("another's hold reads as just released")
	}
}

// The waiting line that the first failed attempt starts says what that
// attempt met: onRetry let the report start before it recorded the
// attempt's error, and the report, which reads that record first, could
// find none, look the holder up, and say "just released" of a Redis that
// refused every attempt (at its maxmemory, a replica). The test holds the
// waiter's lock, as the report's read does, while onRetry runs.
func TestTheFirstWaitingLineHasTheFirstAttemptsError(t *testing.T) {
	w := &waiter{begun: make(chan struct{}), answered: time.Now(), cancel: func(error) {}}
	failed := errors.New("OOM command not allowed when used memory > 'maxmemory'")
	w.mu.Lock()
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		w.onRetry(1, failed)
	}()
	// onRetry comes to wait for the lock, having done all it does before.
	for deadline := time.Now().Add(10 * time.Second); !waitsForAMutexIn("(*waiter).onRetry"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			w.mu.Unlock()
			t.Fatal("onRetry did not come to wait for the waiter's lock")
		}
	}
	select {
	case <-w.begun:
		t.Error("the wait was reported begun before its first attempt's error was recorded")
	default:
	}
	w.mu.Unlock()
	<-returned
	select {
	case <-w.begun:
	default:
		t.Error("the wait was not reported begun after its first failed attempt")
	}
	if last, held := w.outcome(); last != failed || held {
		t.Errorf("recorded %v (held %v), want the attempt's error", last, held)
	}
}

// waitsForAMutexIn reports whether a goroutine waits to lock a sync.Mutex
// inside the function fn.
func waitsForAMutexIn(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[sync.Mutex.Lock") && strings.Contains(g, fn) {
			return true
		}
	}
	return false
}
