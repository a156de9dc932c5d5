package main

import (
	"context"
	"errors"
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
