package dlock

import (
	"context"
	"testing"
	"time"
)

// roundTrip has a pipeline of w's on server's pool come back after d: it
// claims its place, backdated by d, and gives it back.
func roundTrip(w *watchdog, server string, d time.Duration) {
	at := w.claim(server, time.Now().Add(time.Minute))
	w.poolMu.Lock()
	for i, sent := range at.pool.sent {
		if sent.Equal(at.sent) {
			at.pool.sent[i] = at.sent.Add(-d)
			break
		}
	}
	at.sent = at.sent.Add(-d)
	w.poolMu.Unlock()
	w.give(at)
}

// A watchdog that has one pipeline out at a time on each server's pool
// (a cluster's node, say), one server's replies steadily a second late,
// the other's at once. While the slow server's pipeline is out, taking as
// long as its round trips have always taken, the fast server's pipelines
// come back one after another: the round trips seen were the watchdog's,
// not each server's, and each of them faded the slow server's second by
// an eighth, until the one out looked late (two of the faded round trips)
// and the pipeline held back behind it went, taking more than the share
// of the slow server's pool while its replies were steadily slow. Round
// trips are now told by server.
func TestASteadilySlowServerKeepsItsShareBesideFastOnes(t *testing.T) {
	const slow = time.Second
	w := &watchdog{share: 1}
	roundTrip(w, "slow", slow)
	out := w.claim("slow", time.Now().Add(time.Minute))
	held := w.claim("slow", time.Now().Add(time.Minute))
	for range 16 {
		roundTrip(w, "fast", time.Millisecond)
	}
	went := make(chan struct{})
	go func() {
		defer close(went)
		w.take(context.Background(), held)
	}()
	select {
	case <-went:
		t.Errorf("a pipeline held back went while the one out had been out %v, less than the server's round trips (%v)", time.Since(out.sent).Round(time.Millisecond), slow)
	case <-time.After(slow):
	}
	w.give(out)
	<-went
	w.give(held)
}

// A server's share that has had nothing out or held back is kept, with
// its round trips, until it has been idle for forgetShare, and then
// forgotten (a server gone from a cluster); the share of a client that is
// not Partitioned ("") is kept for good.
func TestAnIdleServersShareIsForgottenWithItsRoundTrips(t *testing.T) {
	w := &watchdog{share: 1}
	roundTrip(w, "gone", 100*time.Millisecond)
	roundTrip(w, "", 100*time.Millisecond)
	w.poolMu.Lock()
	defer w.poolMu.Unlock()
	if p := w.pools["gone"]; p == nil || p.trip < 100*time.Millisecond {
		t.Fatalf("a share just idle: %+v, want kept with its round trip of 100ms", p)
	}
	w.forget(time.Now().Add(forgetShare + time.Second))
	if _, ok := w.pools["gone"]; ok {
		t.Errorf("a share idle for more than %v kept", forgetShare)
	}
	if _, ok := w.pools[""]; !ok {
		t.Error(`the share of server "" forgotten`)
	}
}
