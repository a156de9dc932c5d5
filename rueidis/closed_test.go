package dlockrueidis_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// TestAClosedRueidisClientEndsAWaitAtOnce: once the rueidis client under
// the driver is closed (a shutdown that closes it first), an acquire fails
// with an error matching dlock.ErrClosed, and a wait under way ends then,
// rather than trying for its whole max wait, as over go-redis and redigo.
func TestAClosedRueidisClientEndsAWaitAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	newClient := func() rueidis.Client {
		client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		return client
	}
	holder := newClient()
	t.Cleanup(holder.Close)
	h := dlock.New(dlockrueidis.New(holder))
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := h.TryLock(ctx, "held", dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	client := newClient()
	c := dlock.New(dlockrueidis.New(client))
	defer c.Close()
	got := make(chan error, 1)
	refused := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := c.Lock(ctx, "held", dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
		got <- err
	}()
	<-refused
	client.Close()
	select {
	case err := <-got:
		if !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("a wait when its rueidis client closed: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait went on for 5s after its rueidis client closed")
	}
	if _, err := c.TryLock(ctx, "held"); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("a TryLock after its rueidis client closed: %v, want ErrClosed", err)
	}
	if _, err := c.Lock(ctx, "held"); !errors.Is(err, dlock.ErrClosed) || ctx.Err() != nil {
		t.Errorf("a wait after its rueidis client closed: %v (its context: %v), want ErrClosed at once", err, ctx.Err())
	}
}

// TestAWaiterWhoseClientClosedIsNotGrantedTheLock: a Lock that waits with
// its request for a grant when the application closes the rueidis client
// under the driver ends with ErrClosed, and the dlock client stops
// listening for notices: the release that follows passes over it. Its
// subscription's connection, which the rueidis client's Close leaves open,
// stayed open, so the release granted it the lock, which nobody could
// give back: the name stayed held, by nobody, for the waiter's TTL.
func TestAWaiterWhoseClientClosedIsNotGrantedTheLock(t *testing.T) {
	srv := redistest.Start(t)
	newClient := func() rueidis.Client {
		client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		return client
	}
	holder := newClient()
	t.Cleanup(holder.Close)
	h := dlock.New(dlockrueidis.New(holder))
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held, err := h.TryLock(ctx, "job", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	client := newClient()
	c := dlock.New(dlockrueidis.New(client))
	defer c.Close()
	got := make(chan error, 1)
	refused := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := c.Lock(ctx, "job", dlock.WithTTL(20*time.Second), dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
		got <- err
	}()
	<-refused // it waits, with its request for a grant
	client.Close()
	if err := <-got; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("the wait: %v, want ErrClosed", err)
	}
	// The server has seen its subscription go (or, before, never did; the
	// release comes within its registration's lease all the same).
	for end := time.Now().Add(200 * time.Millisecond); srv.PubSubConnections(t) > 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := h.TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("after the only holder released: %v (PTTL %s)", err, srv.Do(t, "PTTL", "dlock:{job}"))
	}
	_ = l.Release(ctx)
}
