package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// lossCrossDriver holds the watchdog's next refresh, once armed, until the
// release has been sent; the release, once armed, gets a timeout without
// running (a stalled server). The test takes the lock away meanwhile, so
// the refresh finds it gone: a real loss.
type lossCrossDriver struct {
	*tapDriver
	armed, releasing atomic.Bool
	refreshing       chan struct{}
	released         chan struct{}
}

func (d *lossCrossDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	switch {
	case calls[0].Script.Name == "refresh" && d.armed.CompareAndSwap(true, false):
		close(d.refreshing)
		select {
		case <-d.released:
		case <-time.After(5 * time.Second):
		}
		d.tapDriver.Eval(ctx, calls...)
	case calls[0].Script.Name == "release" && d.releasing.CompareAndSwap(true, false):
		for _, c := range calls {
			c.Val, c.Err = nil, context.DeadlineExceeded
		}
		close(d.released)
	default:
		d.tapDriver.Eval(ctx, calls...)
	}
}

// A ReleaseDone hook that panics as Do's release fails cuts Do short
// between setGivingBack(true) and giveBackLater: backLater stays set for
// good, and the refresh that crossed the release and found the lock gone
// (taken away: a real loss) is never told. The lock ends only at its
// deadline, a TTL later; before 14ad852 the refresh's answer ended it.
func TestReviewAPanicInDosReleaseLeavesNoGiveBackPending(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &lossCrossDriver{tapDriver: e.newDriver(t), refreshing: make(chan struct{}), released: make(chan struct{})}
	ended := make(chan error, 4)
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{
		End: func(_ dlock.HookInfo, _ time.Duration, err error) { ended <- err },
		ReleaseDone: func(_ context.Context, _ dlock.HookInfo, _ time.Duration, err error) {
			if err != nil {
				panic("release hook")
			}
		},
	}))
	defer c.Close()
	func() {
		defer func() {
			if p := recover(); p == nil {
				t.Error("Do did not panic")
			}
		}()
		_ = c.Do(ctx, "crossed-loss", func(context.Context) error {
			d.armed.Store(true)
			<-d.refreshing // the watchdog's refresh is on its way
			e.srv.Do(t, "DEL", "dlock:{crossed-loss}")
			d.releasing.Store(true)
			return nil
		}, dlock.WithTTL(30*time.Second), dlock.WithRefreshInterval(50*time.Millisecond))
	}()
	select {
	case err := <-ended:
		if !errors.Is(err, dlock.ErrLost) {
			t.Errorf("End hook reports %v, want the loss", err)
		}
	case <-time.After(3 * time.Second):
		t.Error("the loss the refresh found is not told (the lock ends at its 30s deadline)")
	}
}

// Pre-existing: a ReleaseStart hook that panics as Do releases leaves the
// lock held and refreshed for good (the deferred release is only for fn's
// panic), as the panic path's comment says must not happen.
func TestReviewAPanicInDosReleaseStartLeavesTheLockRefreshed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := dlock.New(e.newDriver(t), dlock.WithHooks(dlock.Hooks{
		ReleaseStart: func(ctx context.Context, _ dlock.HookInfo) context.Context { panic("release start") },
	}))
	defer c.Close()
	func() {
		defer func() { _ = recover() }()
		_ = c.Do(ctx, "release-start-panic", func(context.Context) error { return nil }, dlock.WithTTL(300*time.Millisecond))
	}()
	time.Sleep(time.Second)
	if e.locked(t, "dlock:{release-start-panic}") {
		t.Error("the lock is still held, refreshed, a second after Do returned with a 300ms TTL")
	}
}
